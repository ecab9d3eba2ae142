//! The launcher's side of a running sandbox: one `poll` loop that copies
//! output under its cap, answers seccomp notifications, enforces the
//! wall-clock limit and handles the launcher's own interruption.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::confine::TcpRules;
use crate::evidence::{AuditLog, Tracker};
use crate::seccomp::{self, SocketCall};
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
///
/// When forwarding, what was read waits in `pending` until the launcher's
/// own output can take it (polled for `POLLOUT`, written a chunk at a time),
/// and the source is not read meanwhile: a slow reader of `moat`'s output
/// slows the program down (as a pipe would) but never stalls the loop that
/// enforces the timeout and answers seccomp.
pub(crate) struct Stream {
    source: Option<OwnedFd>,
    forward_to: Option<RawFd>,
    /// Largest write that cannot block once the target polls writable.
    chunk: usize,
    pending: Vec<u8>,
    sent: usize,
    cap: u64,
    pub(crate) kept: u64,
    pub(crate) truncated: bool,
    pub(crate) captured: Vec<u8>,
}

impl Stream {
    pub(crate) fn new(source: OwnedFd, mode: OutputMode, target: RawFd, cap: u64) -> Self {
        let chunk = match sys::fstat(target).map(|st| st.st_mode & libc::S_IFMT) {
            Ok(libc::S_IFREG) => 64 << 10,
            Ok(libc::S_IFCHR) => 512, // a terminal wakes writers at a few hundred bytes free
            _ => libc::PIPE_BUF,
        };
        Stream {
            source: Some(source),
            forward_to: (mode == OutputMode::Forward).then_some(target),
            chunk,
            pending: Vec::new(),
            sent: 0,
            cap,
            kept: 0,
            truncated: false,
            captured: Vec::new(),
        }
    }

    fn is_done(&self) -> bool {
        self.source.is_none() && self.sent >= self.pending.len()
    }

    fn readable_fd(&self) -> Option<RawFd> {
        let waiting = self.sent < self.pending.len();
        self.source
            .as_ref()
            .filter(|_| !waiting)
            .map(AsRawFd::as_raw_fd)
    }

    fn writable_fd(&self) -> Option<RawFd> {
        self.forward_to.filter(|_| self.sent < self.pending.len())
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
        if self.forward_to.is_some() {
            self.pending.clear();
            self.pending.extend_from_slice(chunk);
            self.sent = 0;
        } else {
            self.captured.extend_from_slice(chunk);
        }
        self.kept += keep as u64;
        if keep < n {
            self.truncated = true;
            self.source = None;
        }
    }

    /// Writes one chunk of what is pending (the target polled writable).
    fn flush(&mut self) {
        let Some(target) = self.forward_to else {
            return;
        };
        let end = self.pending.len().min(self.sent + self.chunk);
        let chunk = self.pending.get(self.sent..end).unwrap_or_default();
        // SAFETY: chunk is a valid slice for its length.
        let n = unsafe { libc::write(target, chunk.as_ptr().cast(), chunk.len()) };
        if n >= 0 {
            self.sent += n as usize;
        } else if sys::errno() != libc::EINTR && sys::errno() != libc::EAGAIN {
            // Our reader went away: stop reading, as a pipeline would.
            self.pending.clear();
            self.sent = 0;
            self.source = None;
        }
    }
}

/// What happened while the program ran.
pub(crate) struct Supervision {
    pub(crate) timed_out: bool,
    pub(crate) interrupted: bool,
    pub(crate) denied: BTreeMap<&'static str, u64>,
}

pub(crate) struct Watched<'a> {
    pub(crate) pidfd: &'a OwnedFd,
    /// The launcher's end of the sync socket. init writes `D` there once the
    /// program has ended and it has killed and reaped everything else in the
    /// sandbox, and then exits: the launcher can finish its own bookkeeping
    /// while init's exit (its memory and its mount namespace torn down)
    /// completes. (Not the status pipe: the payload's setup messages there
    /// would wake the launcher for nothing.)
    pub(crate) init_done: &'a OwnedFd,
    pub(crate) stdout: &'a mut Stream,
    pub(crate) stderr: &'a mut Stream,
    pub(crate) notify_receive: Option<OwnedFd>,
    pub(crate) signals: Option<OwnedFd>,
    pub(crate) deadline: Instant,
    /// The TCP ports a program may connect to (on loopback) and bind, in
    /// the network modes whose `connect(2)` and `bind(2)` are watched.
    pub(crate) tcp: Option<&'a TcpRules>,
    /// The kernel's audit log, when the evidence layer listens to it.
    pub(crate) audit: Option<(&'a mut AuditLog, &'a mut Tracker)>,
}

/// How long to wait for the pipes to drain once init is gone (everything in
/// its pid namespace is being killed, so this is short in practice).
const DRAIN: Duration = Duration::from_secs(2);
/// Grace between forwarding an interrupt and killing the tree.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// A refusal the launcher observed.
pub(crate) enum Denial<'a> {
    /// A syscall on the deny list (reported once per name).
    Syscall { name: &'a str, arch: u32, nr: i32 },
    /// A TCP connection that bypasses the egress proxy, or any in
    /// `ingress-only` (reported each time, up to a cap).
    Connect { address: String },
    /// A bind to a port `ingress-only` does not expose.
    Bind { address: String },
    /// A Landlock refusal the audit log reported (once per access and object).
    Landlock(&'a moat_core::Violation),
}

pub(crate) fn supervise(w: Watched<'_>, on_denial: &mut dyn FnMut(Denial<'_>)) -> Supervision {
    let Watched {
        pidfd,
        init_done,
        stdout,
        stderr,
        mut notify_receive,
        signals,
        deadline,
        tcp,
        mut audit,
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
    // Allocated when the first output arrives: a silent program costs no
    // zeroed pages.
    let mut buf: Vec<u8> = Vec::new();

    loop {
        let now = Instant::now();
        if let Some(at) = exited_at {
            if (stdout.is_done() && stderr.is_done()) || now >= at + DRAIN {
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

        let mut slots: Vec<(Slot, libc::pollfd)> = Vec::with_capacity(8);
        let mut add = |slot: Slot, fd: RawFd, events: libc::c_short| {
            slots.push((
                slot,
                libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                },
            ))
        };
        if exited_at.is_none() {
            add(Slot::Exit, pidfd.as_raw_fd(), libc::POLLIN);
            add(Slot::Done, init_done.as_raw_fd(), libc::POLLIN);
        }
        if let Some(fd) = stdout.readable_fd() {
            add(Slot::Stdout, fd, libc::POLLIN);
        }
        if let Some(fd) = stderr.readable_fd() {
            add(Slot::Stderr, fd, libc::POLLIN);
        }
        if let Some(fd) = stdout.writable_fd() {
            add(Slot::StdoutFlush, fd, libc::POLLOUT);
        }
        if let Some(fd) = stderr.writable_fd() {
            add(Slot::StderrFlush, fd, libc::POLLOUT);
        }
        if let Some(fd) = &notify_receive {
            add(Slot::NotifyReceive, fd.as_raw_fd(), libc::POLLIN);
        }
        if let Some(fd) = &listener {
            add(Slot::Listener, fd.as_raw_fd(), libc::POLLIN);
        }
        if let Some(fd) = &signals {
            add(Slot::Signals, fd.as_raw_fd(), libc::POLLIN);
        }
        if let Some((log, _)) = &audit {
            add(Slot::Audit, log.raw_fd(), libc::POLLIN);
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
                Slot::Exit | Slot::Done => exited_at = Some(Instant::now()),
                Slot::Stdout | Slot::Stderr => {
                    if buf.is_empty() {
                        buf = vec![0u8; 64 * 1024];
                    }
                    match slot {
                        Slot::Stdout => stdout.pump(&mut buf),
                        _ => stderr.pump(&mut buf),
                    }
                }
                Slot::StdoutFlush => stdout.flush(),
                Slot::StderrFlush => stderr.flush(),
                Slot::NotifyReceive => {
                    // The payload sends it after restricting itself: its pid
                    // names its Landlock domain in the audit log.
                    if let Some(fd) = &notify_receive
                        && let Ok(Some((received, pid))) = sys::recv_fd_and_pid(fd.as_raw_fd())
                    {
                        listener = Some(received);
                        if let (Some((_, tracker)), Some(pid)) = (&mut audit, pid) {
                            tracker.set_payload(pid.unsigned_abs(), &mut |v| {
                                on_denial(Denial::Landlock(v))
                            });
                        }
                    }
                    notify_receive = None;
                }
                Slot::Audit => {
                    if let Some((log, tracker)) = &mut audit {
                        log.read(tracker, &mut |v| on_denial(Denial::Landlock(v)));
                    }
                }
                Slot::Listener => {
                    if polled.revents & libc::POLLIN != 0 {
                        if let Some(fd) = &listener {
                            answer_notification(fd.as_raw_fd(), tcp, &mut result.denied, on_denial);
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
    Done,
    Stdout,
    Stderr,
    StdoutFlush,
    StderrFlush,
    NotifyReceive,
    Listener,
    Signals,
    Audit,
}

/// Answers one notification: a refused syscall is recorded (once per name)
/// and refused; a watched `connect(2)` or `bind(2)` (the proxy and
/// ingress-only network modes) is refused and recorded when its address is
/// not one `tcp` allows, and otherwise continues to the kernel, where
/// Landlock's port rules are what enforces. Any other notified syscall is
/// never allowed to continue.
pub(crate) fn answer_notification(
    listener: RawFd,
    tcp: Option<&TcpRules>,
    denied: &mut BTreeMap<&'static str, u64>,
    on_denial: &mut dyn FnMut(Denial<'_>),
) {
    // SAFETY: seccomp_notif is plain old data and must be zeroed before RECV.
    let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: notif is a valid, zeroed seccomp_notif for the kernel to fill.
    if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut notif) } != 0 {
        return; // the caller died before we took it
    }
    let mut response = libc::seccomp_notif_resp {
        id: notif.id,
        val: 0,
        error: -libc::EPERM,
        flags: 0,
    };
    let watched = seccomp::watched_socket_call(notif.data.arch, notif.data.nr);
    if let Some(call) = watched {
        let allowed = |address: &SocketAddr| {
            tcp.is_some_and(|tcp| match call {
                SocketCall::Connect => {
                    address.ip().is_loopback() && tcp.connect.contains(&address.port())
                }
                SocketCall::Bind => tcp.bind.contains(&address.port()),
            })
        };
        let refused = match socket_address(listener, &notif, call) {
            // Continuing is safe whatever the memory says by now: Landlock's
            // port rules still apply to the real call.
            Target::Other => None,
            Target::Inet(address) if allowed(&address) => None,
            Target::Inet(address) => Some(address.to_string()),
            Target::Unreadable(what) => Some(what.into()),
        };
        match refused {
            None => {
                response.error = 0;
                response.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
            }
            Some(address) => {
                response.error = -libc::EACCES;
                // Each of the first few is recorded with its address; past
                // that they are only counted (a loop must not flood the record).
                let count = denied.entry(call.name()).or_insert(0);
                *count += 1;
                if *count <= MAX_SOCKET_EVENTS {
                    on_denial(match call {
                        SocketCall::Connect => Denial::Connect { address },
                        SocketCall::Bind => Denial::Bind { address },
                    });
                }
            }
        }
    } else {
        let name = seccomp::describe(notif.data.arch, notif.data.nr);
        let count = denied.entry(name).or_insert(0);
        *count += 1;
        if *count == 1 {
            on_denial(Denial::Syscall {
                name,
                arch: notif.data.arch,
                nr: notif.data.nr,
            });
        }
    }
    // SAFETY: response is a valid seccomp_notif_resp; ENOENT (caller gone) is harmless.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &response) };
}

const SECCOMP_USER_NOTIF_FLAG_CONTINUE: u32 = 1;
/// Refused connections and binds recorded one by one; the rest are counted
/// in the report's `deniedSyscalls` as `connect` or `bind`.
const MAX_SOCKET_EVENTS: u64 = 64;

enum Target {
    /// Not an internet address (unix sockets, `AF_UNSPEC` disconnects):
    /// left to the kernel and Landlock.
    Other,
    /// Unreadable or truncated: refused rather than left to the other
    /// layers unseen.
    Unreadable(&'static str),
    Inet(SocketAddr),
}

/// The address a notified `connect(fd, addr, len)` or `bind(fd, addr, len)`
/// names, read from the caller's memory. (`bind` with `AF_UNSPEC` on an
/// IPv4 socket binds like `AF_INET`: it is read as one.)
fn socket_address(listener: RawFd, notif: &libc::seccomp_notif, call: SocketCall) -> Target {
    let mut raw = [0u8; 28]; // sockaddr_in6, the largest internet address
    let len = (notif.data.args[2] as usize).min(raw.len());
    let local = libc::iovec {
        iov_base: raw.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: notif.data.args[1] as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: reads at most `len` bytes of the notifying process into `raw`;
    // a bad remote pointer makes the call fail, not fault.
    let n = unsafe { libc::process_vm_readv(notif.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    // SAFETY: a plain ioctl on the listener with the notification id.
    let valid =
        unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &notif.id) } == 0;
    if !valid {
        return Target::Other; // the caller is gone; the answer goes nowhere
    }
    if n < 2 {
        return Target::Unreadable("(unreadable address)");
    }
    let family = i32::from(u16::from_ne_bytes([raw[0], raw[1]]));
    let port = u16::from_be_bytes([raw[2], raw[3]]);
    let inet = family == libc::AF_INET || (family == libc::AF_UNSPEC && call == SocketCall::Bind);
    let ip: std::net::IpAddr = match family {
        _ if inet && n >= 8 => std::net::Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]).into(),
        libc::AF_INET6 if n >= 24 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&raw[8..24]);
            let v6 = std::net::Ipv6Addr::from(octets);
            v6.to_ipv4_mapped().map_or(v6.into(), Into::into)
        }
        _ if inet || family == libc::AF_INET6 => {
            return Target::Unreadable("(truncated address)");
        }
        _ => return Target::Other,
    };
    Target::Inet(SocketAddr::new(ip, port))
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
