//! The DevTools protocol over Chromium's pipe (`--remote-debugging-pipe`):
//! JSON messages, each ended by a NUL byte, commands with ids one way,
//! their answers and events the other. Blocking, with a deadline on every
//! wait, writes included (the shell is single-threaded: a browser that
//! stops reading must not stall it past a step's deadline).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::AsFd as _;
use std::time::Instant;

use serde_json::{Value, json};

/// The longest message read from the browser (a full-page screenshot).
const MAX_MESSAGE: usize = 64 << 20;

/// Events kept while a command's answer is awaited, and their bytes: what
/// a page makes the browser say must not fill the shell's memory.
const MAX_BACKLOG: usize = 1_000;
const MAX_BACKLOG_BYTES: usize = 8 << 20;

/// The events the shell acts on; the rest are dropped as they come.
fn wanted(method: &str) -> bool {
    method.starts_with("Page.") || method == "Network.responseReceived"
}

/// Why the browser did not answer.
#[derive(Debug, thiserror::Error)]
pub enum CdpError {
    #[error("the browser's pipe: {0}")]
    Io(#[from] std::io::Error),
    #[error("the browser ended")]
    Ended,
    #[error("the browser did not answer in time")]
    Timeout,
    #[error("the browser sent something that is not a DevTools message: {0}")]
    Malformed(String),
    #[error("{method}: {message}")]
    Refused { method: String, message: String },
}

/// One browser's DevTools channel.
pub struct Cdp {
    to: File,
    from: File,
    read: Vec<u8>,
    next_id: u64,
    /// Kept events, with their sizes.
    events: VecDeque<(Value, usize)>,
    backlog_bytes: usize,
    /// Skipping the rest of a message past [`MAX_MESSAGE`].
    skipping: bool,
    /// The session's trace, when it keeps one: every event read feeds it,
    /// whether the shell keeps the event or not.
    pub trace: Option<super::trace::Trace>,
    /// A command was cut off part-way (its write timed out): the browser
    /// would read what follows as its rest, so nothing more is sent.
    broken: bool,
}

impl Cdp {
    /// `to` is the browser's fd 3 (what it reads), `from` its fd 4.
    pub fn new(to: File, from: File) -> Cdp {
        // Writes wait on `poll` with the call's deadline instead. Should
        // the flag not take, a write blocks as before: no worse.
        if let Ok(flags) = rustix::fs::fcntl_getfl(&to) {
            let _ = rustix::fs::fcntl_setfl(&to, flags | rustix::fs::OFlags::NONBLOCK);
        }
        Cdp {
            to,
            from,
            read: Vec::new(),
            next_id: 1,
            events: VecDeque::new(),
            backlog_bytes: 0,
            skipping: false,
            trace: None,
            broken: false,
        }
    }

    /// Sends `method` (to the page `session`, if given) and waits for its
    /// answer's `result`; events that arrive meanwhile are kept.
    pub fn call(
        &mut self,
        method: &str,
        params: Value,
        session: Option<&str>,
        deadline: Instant,
    ) -> Result<Value, CdpError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = session.into();
        }
        let mut bytes =
            serde_json::to_vec(&message).map_err(|e| CdpError::Malformed(e.to_string()))?;
        bytes.push(0);
        self.send(&bytes, deadline)?;
        loop {
            let (message, size) = self.next_message(deadline)?;
            if message["id"].as_u64() == Some(id) {
                if let Some(error) = message.get("error") {
                    return Err(CdpError::Refused {
                        method: method.to_owned(),
                        message: error["message"].as_str().unwrap_or("refused").to_owned(),
                    });
                }
                return Ok(message["result"].clone());
            }
            self.keep(message, size);
        }
    }

    /// Writes `bytes` whole by `deadline`; a write cut off by it leaves
    /// the channel [`Cdp::broken`].
    fn send(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), CdpError> {
        if self.broken {
            return Err(CdpError::Ended);
        }
        let mut rest = bytes;
        while !rest.is_empty() {
            match self.to.write(rest) {
                Ok(0) => return Err(CdpError::Ended),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if !ready(&self.to, rustix::event::PollFlags::OUT, deadline)? {
                        self.broken = rest.len() < bytes.len();
                        return Err(CdpError::Timeout);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Keeps an event the shell may act on, within the backlog's bounds.
    fn keep(&mut self, event: Value, size: usize) {
        if !event["method"].as_str().is_some_and(wanted) {
            return;
        }
        while self.events.len() >= MAX_BACKLOG
            || (self.backlog_bytes + size > MAX_BACKLOG_BYTES && !self.events.is_empty())
        {
            if let Some((_, dropped)) = self.events.pop_front() {
                self.backlog_bytes -= dropped;
            }
        }
        if size <= MAX_BACKLOG_BYTES {
            self.backlog_bytes += size;
            self.events.push_back((event, size));
        }
    }

    /// The first event (kept or to come) that `wanted` accepts, by
    /// `deadline`; the events before it are given to `seen`.
    pub fn wait_event(
        &mut self,
        deadline: Instant,
        mut seen: impl FnMut(&Value),
        wanted: impl Fn(&Value) -> bool,
    ) -> Result<Value, CdpError> {
        while let Some((event, size)) = self.events.pop_front() {
            self.backlog_bytes -= size;
            if wanted(&event) {
                return Ok(event);
            }
            seen(&event);
        }
        loop {
            let (message, _) = self.next_message(deadline)?;
            if message.get("method").is_none() {
                continue;
            }
            if wanted(&message) {
                return Ok(message);
            }
            seen(&message);
        }
    }

    /// Events kept so far, taken.
    pub fn take_events(&mut self) -> Vec<Value> {
        self.backlog_bytes = 0;
        self.events.drain(..).map(|(event, _)| event).collect()
    }

    /// The next whole message and its size. A message past
    /// [`MAX_MESSAGE`] is skipped to its end (the next NUL): the channel
    /// stays usable, and the command it answered times out.
    fn next_message(&mut self, deadline: Instant) -> Result<(Value, usize), CdpError> {
        loop {
            if let Some(end) = self.read.iter().position(|b| *b == 0) {
                let rest = self.read.split_off(end + 1);
                let mut message = std::mem::replace(&mut self.read, rest);
                if std::mem::take(&mut self.skipping) {
                    continue;
                }
                message.pop();
                let size = message.len();
                let value: Value = serde_json::from_slice(&message)
                    .map_err(|e| CdpError::Malformed(e.to_string()))?;
                if let Some(trace) = &mut self.trace
                    && value.get("method").is_some()
                {
                    trace.record(&value);
                }
                return Ok((value, size));
            }
            if self.read.len() > MAX_MESSAGE {
                self.read.clear();
                self.skipping = true;
            }
            if !readable(&self.from, deadline)? {
                return Err(CdpError::Timeout);
            }
            let mut chunk = [0u8; 64 << 10];
            let n = self.from.read(&mut chunk)?;
            if n == 0 {
                return Err(CdpError::Ended);
            }
            self.read.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Waits until `file` can be read (or has ended); `false` if `deadline`
/// passed first.
pub fn readable(file: &File, deadline: Instant) -> std::io::Result<bool> {
    ready(file, rustix::event::PollFlags::IN, deadline)
}

/// Waits until `file` is ready for `what` (or has ended); `false` if
/// `deadline` passed first.
fn ready(file: &File, what: rustix::event::PollFlags, deadline: Instant) -> std::io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let timeout = rustix::event::Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let fd = file.as_fd();
        let mut fds = [rustix::event::PollFd::new(&fd, what)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => {}
            Ok(_) => return Ok(true),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_browser_that_stops_reading_times_a_command_out_and_ends_the_channel() {
        let (_browser_reads, to) = std::io::pipe().expect("pipe");
        let (from, _browser_writes) = std::io::pipe().expect("pipe");
        let mut cdp = Cdp::new(
            File::from(std::os::fd::OwnedFd::from(to)),
            File::from(std::os::fd::OwnedFd::from(from)),
        );
        // Far more than a pipe holds, and nobody reads it.
        let big = "x".repeat(4 << 20);
        let deadline = Instant::now() + Duration::from_millis(300);
        let cut = cdp.call(
            "Runtime.evaluate",
            json!({"expression": big}),
            None,
            deadline,
        );
        assert!(matches!(cut, Err(CdpError::Timeout)), "{cut:?}");
        // Half a command went out: nothing more is sent after it.
        let next = cdp.call(
            "Page.enable",
            json!({}),
            None,
            Instant::now() + Duration::from_secs(1),
        );
        assert!(matches!(next, Err(CdpError::Ended)), "{next:?}");
    }
}
