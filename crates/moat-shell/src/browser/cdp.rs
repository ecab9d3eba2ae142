//! The DevTools protocol over Chromium's pipe (`--remote-debugging-pipe`):
//! JSON messages, each ended by a NUL byte, commands with ids one way,
//! their answers and events the other. Blocking, with a deadline on every
//! wait (the shell is single-threaded).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::AsFd as _;
use std::time::Instant;

use serde_json::{Value, json};

/// The longest message read from the browser (a full-page screenshot).
const MAX_MESSAGE: usize = 64 << 20;

/// Events kept while a command's answer is awaited.
const MAX_BACKLOG: usize = 10_000;

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
    events: VecDeque<Value>,
}

impl Cdp {
    /// `to` is the browser's fd 3 (what it reads), `from` its fd 4.
    pub fn new(to: File, from: File) -> Cdp {
        Cdp {
            to,
            from,
            read: Vec::new(),
            next_id: 1,
            events: VecDeque::new(),
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
        self.to.write_all(&bytes)?;
        loop {
            let message = self.next_message(deadline)?;
            if message["id"].as_u64() == Some(id) {
                if let Some(error) = message.get("error") {
                    return Err(CdpError::Refused {
                        method: method.to_owned(),
                        message: error["message"].as_str().unwrap_or("refused").to_owned(),
                    });
                }
                return Ok(message["result"].clone());
            }
            if message.get("method").is_some() {
                if self.events.len() >= MAX_BACKLOG {
                    self.events.pop_front();
                }
                self.events.push_back(message);
            }
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
        while let Some(event) = self.events.pop_front() {
            if wanted(&event) {
                return Ok(event);
            }
            seen(&event);
        }
        loop {
            let message = self.next_message(deadline)?;
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
        self.events.drain(..).collect()
    }

    fn next_message(&mut self, deadline: Instant) -> Result<Value, CdpError> {
        loop {
            if let Some(end) = self.read.iter().position(|b| *b == 0) {
                let rest = self.read.split_off(end + 1);
                let mut message = std::mem::replace(&mut self.read, rest);
                message.pop();
                return serde_json::from_slice(&message)
                    .map_err(|e| CdpError::Malformed(e.to_string()));
            }
            if self.read.len() > MAX_MESSAGE {
                return Err(CdpError::Malformed("a message past 64 MiB".into()));
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
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => {}
            Ok(_) => return Ok(true),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
