//! Host-side helper processes and descriptor passing.
//!
//! A helper (the egress proxy) is forked, not exec'd: it starts in a fraction
//! of the time and needs no path to a binary. The caller must still be
//! single-threaded when it forks, for the same reason as the launcher; the
//! helper itself may then start threads, since nothing is ever cloned from it.
//!
//! Descriptors travel over unix stream sockets attached to message bytes:
//! [`send_with_fd`] attaches one to the first byte it sends, and a reader that
//! always uses [`recv_with_fds`] collects it with those bytes.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use crate::error::{Layer, SetupError};
use crate::sys::{self, Forked};

/// A forked helper. Dropping it kills the helper and reaps it.
#[derive(Debug)]
pub struct Helper {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    reaped: bool,
}

impl Helper {
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for the helper to exit on its own; returns its exit code
    /// (128 + signal if it was killed).
    pub fn wait(mut self) -> i32 {
        self.reap()
    }

    fn reap(&mut self) -> i32 {
        if self.reaped {
            return 0;
        }
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child; status is a valid int to fill.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r >= 0 || sys::errno() != libc::EINTR {
                break;
            }
        }
        self.reaped = true;
        if libc::WIFSIGNALED(status) {
            128 + libc::WTERMSIG(status)
        } else {
            libc::WEXITSTATUS(status)
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = sys::pidfd_send_signal(&self.pidfd, libc::SIGKILL);
            self.reap();
        }
    }
}

/// Forks a helper that runs `body` and exits with its return value. The
/// helper dies with its parent (`PR_SET_PDEATHSIG`), is not dumpable, has
/// `no_new_privs`, and keeps none of the caller's descriptors but stderr and
/// `keep` (its end of their shared socket): stdin and stdout become
/// `/dev/null`, and the caller's files — a ledger, a workspace handle — are
/// closed.
pub fn spawn_helper(keep: &[RawFd], body: impl FnOnce() -> i32) -> Result<Helper, SetupError> {
    let threads =
        sys::thread_count().map_err(|e| SetupError::io(Layer::Launcher, "counting threads", e))?;
    if threads > 1 {
        return Err(SetupError::new(
            Layer::Launcher,
            "a helper must be forked from a single-threaded process",
        ));
    }
    // SAFETY: plain id query.
    let parent = unsafe { libc::getpid() };
    match sys::clone3(0, None)
        .map_err(|e| SetupError::io(Layer::Launcher, "forking a helper", e))?
    {
        Forked::Parent { pid, pidfd } => Ok(Helper {
            pid,
            pidfd,
            reaped: false,
        }),
        Forked::Child => {
            // SAFETY: prctl and getppid with integer arguments; open/dup2 on
            // descriptors of this (new, single-threaded) process only.
            let ok = close_all_but(keep)
                && unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0
                        && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                        && libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
                        && libc::getppid() == parent
                        && {
                            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                            null >= 0 && libc::dup2(null, 0) >= 0 && libc::dup2(null, 1) >= 0
                        }
                };
            // A panic must not unwind into the frames copied from the
            // caller (their destructors are the caller's to run).
            let code = if ok {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101)
            } else {
                125
            };
            // SAFETY: _exit skips the destructors and atexit handlers, which
            // belong to the process we were copied from.
            unsafe { libc::_exit(code) }
        }
    }
}

/// Closes every descriptor from 3 up, except `keep`.
fn close_all_but(keep: &[RawFd]) -> bool {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|fd| u32::try_from(*fd).ok())
        .collect();
    keep.sort_unstable();
    let mut first = 3u32;
    for fd in keep.into_iter().filter(|fd| *fd >= 3) {
        if fd > first {
            // SAFETY: close_range on this process's own descriptor table.
            if unsafe { libc::syscall(libc::SYS_close_range, first, fd - 1, 0) } != 0 {
                return false;
            }
        }
        first = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) == 0 }
}

/// Confines a helper with Landlock: it may read (and map executable) what is
/// under `readable` and nothing else, write no file, and not signal or reach
/// abstract sockets outside itself. With `allow_degraded` a kernel without
/// (full) Landlock leaves it partly or not confined; the description says which.
pub fn confine_read_only(
    readable: &[&std::path::Path],
    allow_degraded: bool,
) -> Result<String, SetupError> {
    use landlock::RulesetStatus;
    Ok(match restrict(readable, None, allow_degraded)? {
        RulesetStatus::FullyEnforced => "Landlock: read-only system files, no writes".into(),
        RulesetStatus::PartiallyEnforced => {
            "Landlock partially enforced (kernel ABI too old)".into()
        }
        RulesetStatus::NotEnforced => "Landlock not enforced (unavailable)".into(),
    })
}

/// The Landlock ruleset of a helper: reading under `readable` only, no
/// file written, signals and abstract sockets scoped; with `tcp_connect`,
/// TCP connect to those ports only and no bind. Best effort only with
/// `allow_degraded`; returns what the kernel enforced.
pub(crate) fn restrict(
    readable: &[&std::path::Path],
    tcp_connect: Option<&[u16]>,
    allow_degraded: bool,
) -> Result<landlock::RulesetStatus, SetupError> {
    use landlock::{
        ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
        Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
    };
    let fail = |e: &dyn std::fmt::Display| SetupError::new(Layer::Landlock, e.to_string());
    let level = if allow_degraded {
        CompatLevel::BestEffort
    } else {
        CompatLevel::HardRequirement
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(ABI::V5))
        .and_then(|r| match tcp_connect {
            Some(_) => r.handle_access(AccessNet::from_all(ABI::V4)),
            None => Ok(r),
        })
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .map_err(|e| fail(&e))?;
    for path in readable.iter().filter(|p| p.exists()) {
        let fd = PathFd::new(path).map_err(|e| fail(&e))?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, AccessFs::from_read(ABI::V5)))
            .map_err(|e| fail(&e))?;
    }
    for port in tcp_connect.unwrap_or_default() {
        ruleset = ruleset
            .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
            .map_err(|e| fail(&e))?;
    }
    Ok(ruleset.restrict_self().map_err(|e| fail(&e))?.ruleset)
}

/// Sends `data` with `fd` attached to its first byte; returns the bytes sent
/// (send the rest with plain writes).
pub fn send_with_fd(socket: BorrowedFd<'_>, data: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    if data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a descriptor needs at least one byte to travel with",
        ));
    }
    sys::send_with_fds(socket.as_raw_fd(), data, &[fd.as_raw_fd()])
}

/// Reads like `read(2)`, collecting any descriptors that came with the bytes.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    sys::recv_with_fds(socket.as_raw_fd(), buf, fds)
}
