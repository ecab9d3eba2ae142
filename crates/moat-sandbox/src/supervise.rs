//! The launcher's side of a running sandbox: one `poll` loop that copies
//! output under its cap, answers seccomp notifications, enforces the
//! wall-clock limit and handles the launcher's own interruption.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::seccomp;
use crate::sys;

/// Where the program's output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Copied to the launcher's own stdout/stderr as it arrives.
    Forward,
    /// Kept in memory and returned in the outcome.
    Capture,
}

/// One output stream, read under a byte cap.
pub(crate) struct Stream {
    source: Option<OwnedFd>,
    forward_to: Option<RawFd>,
    cap: u64,
    pub(crate) kept: u64,
    pub(crate) truncated: bool,
    pub(crate) captured: Vec<u8>,
}

impl Stream {
    pub(crate) fn new(source: OwnedFd, mode: OutputMode, target: RawFd, cap: u64) -> Self {
        Stream {
            source: Some(source),
            forward_to: (mode == OutputMode::Forward).then_some(target),
            cap,
            kept: 0,
            truncated: false,
            captured: Vec::new(),
        }
    }

    fn is_open(&self) -> bool {
        self.source.is_some()
    }

    /// Reads what is available. Past the cap the stream is closed, so the
    /// writer gets `EPIPE`/`SIGPIPE` instead of filling the launcher's memory.
    fn pump(&mut self, buf: &mut [u8]) {
        let Some(fd) = &self.source else { return };
        let n = match sys::read(fd.as_raw_fd(), buf) {
            Ok(0) | Err(_) => {
                self.source = None;
                return;
            }
            Ok(n) => n,
        };
        let room = self.cap.saturating_sub(self.kept);
        let keep = (n as u64).min(room) as usize;
        let chunk = buf.get(..keep).unwrap_or_default();
        match self.forward_to {
            Some(target) => {
                if sys::write_all(target, chunk).is_err() {
                    // Our reader went away: stop reading, as a pipeline would.
                    self.source = None;
                }
            }
            None => self.captured.extend_from_slice(chunk),
        }
        self.kept += keep as u64;
        if keep < n {
            self.truncated = true;
            self.source = None;
        }
    }
}

/// What happened while the program ran.
pub(crate) struct Supervision {
    pub(crate) timed_out: bool,
    pub(crate) interrupted: bool,
    pub(crate) denied: BTreeMap<String, u64>,
}

pub(crate) struct Watched<'a> {
    pub(crate) pidfd: &'a OwnedFd,
    pub(crate) stdout: &'a mut Stream,
    pub(crate) stderr: &'a mut Stream,
    pub(crate) notify_receive: Option<OwnedFd>,
    pub(crate) signals: Option<OwnedFd>,
    pub(crate) deadline: Instant,
}

/// How long to wait for the pipes to drain once init is gone (everything in
/// its pid namespace is being killed, so this is short in practice).
const DRAIN: Duration = Duration::from_secs(2);
/// Grace between forwarding an interrupt and killing the tree.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

pub(crate) fn supervise(w: Watched<'_>, on_denial: &mut dyn FnMut(&str)) -> Supervision {
    let Watched {
        pidfd,
        stdout,
        stderr,
        mut notify_receive,
        signals,
        deadline,
    } = w;
    let mut result = Supervision {
        timed_out: false,
        interrupted: false,
        denied: BTreeMap::new(),
    };
    let mut listener: Option<OwnedFd> = None;
    let mut exited_at: Option<Instant> = None;
    let mut kill_at = deadline;
    let mut killed = false;
    let mut buf = vec![0u8; 64 * 1024];

    loop {
        let now = Instant::now();
        if let Some(at) = exited_at {
            if (!stdout.is_open() && !stderr.is_open()) || now >= at + DRAIN {
                break;
            }
        } else if now >= kill_at && !killed {
            if !result.interrupted {
                result.timed_out = true;
            }
            let _ = sys::pidfd_send_signal(pidfd, libc::SIGKILL);
            killed = true;
        }
        let wake_at = match exited_at {
            Some(at) => at + DRAIN,
            None if killed => now + Duration::from_millis(100),
            None => kill_at,
        };
        let timeout = wake_at.saturating_duration_since(now);
        let timeout_ms = i32::try_from(timeout.as_millis().saturating_add(1)).unwrap_or(i32::MAX);

        let mut slots: Vec<(Slot, libc::pollfd)> = Vec::with_capacity(6);
        let mut add = |slot: Slot, fd: RawFd| {
            slots.push((
                slot,
                libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ))
        };
        if exited_at.is_none() {
            add(Slot::Exit, pidfd.as_raw_fd());
        }
        if let Some(fd) = &stdout.source {
            add(Slot::Stdout, fd.as_raw_fd());
        }
        if let Some(fd) = &stderr.source {
            add(Slot::Stderr, fd.as_raw_fd());
        }
        if let Some(fd) = &notify_receive {
            add(Slot::NotifyReceive, fd.as_raw_fd());
        }
        if let Some(fd) = &listener {
            add(Slot::Listener, fd.as_raw_fd());
        }
        if let Some(fd) = &signals {
            add(Slot::Signals, fd.as_raw_fd());
        }
        let mut pollfds: Vec<libc::pollfd> = slots.iter().map(|(_, p)| *p).collect();
        // SAFETY: pollfds is a valid array of the length passed.
        let ready = unsafe {
            libc::poll(
                pollfds.as_mut_ptr(),
                pollfds.len() as libc::nfds_t,
                timeout_ms,
            )
        };
        if ready <= 0 {
            continue; // timeout or EINTR: the checks at the top decide
        }
        for ((slot, _), polled) in slots.iter().zip(&pollfds) {
            if polled.revents == 0 {
                continue;
            }
            match slot {
                Slot::Exit => exited_at = Some(Instant::now()),
                Slot::Stdout => stdout.pump(&mut buf),
                Slot::Stderr => stderr.pump(&mut buf),
                Slot::NotifyReceive => {
                    if let Some(fd) = &notify_receive {
                        if let Ok(Some(received)) = sys::recv_fd(fd.as_raw_fd()) {
                            listener = Some(received);
                        }
                    }
                    notify_receive = None;
                }
                Slot::Listener => {
                    if polled.revents & libc::POLLIN != 0 {
                        if let Some(fd) = &listener {
                            answer_notification(fd.as_raw_fd(), &mut result.denied, on_denial);
                        }
                    } else {
                        listener = None; // every filtered task is gone
                    }
                }
                Slot::Signals => {
                    if let Some(fd) = &signals {
                        let signal = read_signal(fd.as_raw_fd());
                        if !result.interrupted && !killed {
                            result.interrupted = true;
                            let _ = sys::pidfd_send_signal(pidfd, signal);
                            kill_at = kill_at.min(Instant::now() + INTERRUPT_GRACE);
                        }
                    }
                }
            }
        }
    }
    result
}

#[derive(Clone, Copy)]
enum Slot {
    Exit,
    Stdout,
    Stderr,
    NotifyReceive,
    Listener,
    Signals,
}

/// Takes one pending notification and refuses the syscall. A notified
/// syscall is never allowed to continue.
fn answer_notification(
    listener: RawFd,
    denied: &mut BTreeMap<String, u64>,
    on_denial: &mut dyn FnMut(&str),
) {
    // SAFETY: seccomp_notif is plain old data and must be zeroed before RECV.
    let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: notif is a valid, zeroed seccomp_notif for the kernel to fill.
    if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut notif) } != 0 {
        return; // the caller died before we took it
    }
    let name = seccomp::describe(notif.data.arch, notif.data.nr);
    let count = denied.entry(name.clone()).or_insert(0);
    *count += 1;
    if *count == 1 {
        on_denial(&name);
    }
    let response = libc::seccomp_notif_resp {
        id: notif.id,
        val: 0,
        error: -libc::EPERM,
        flags: 0,
    };
    // SAFETY: response is a valid seccomp_notif_resp; ENOENT (caller gone) is harmless.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &response) };
}

fn read_signal(fd: RawFd) -> i32 {
    // SAFETY: signalfd_siginfo is plain old data.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: info is a writable buffer of `size` bytes.
    let n = unsafe { libc::read(fd, std::ptr::addr_of_mut!(info).cast(), size) };
    if n as usize == size {
        info.ssi_signo as i32
    } else {
        libc::SIGTERM
    }
}
