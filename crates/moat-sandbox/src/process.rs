//! Signals to processes the caller started (by pid), for binaries that may
//! not hold `unsafe` themselves.

/// Sends SIGTERM to `pid`, a child the caller started and has not reaped
/// (so the pid cannot have been reused).
pub fn terminate(pid: u32) -> std::io::Result<()> {
    signal(pid, libc::SIGTERM)
}

/// Sends SIGKILL to `pid`, a process of the caller's own making (a runner's
/// shell of a run it tears down, found by that run's directory on its
/// command line).
pub fn kill(pid: u32) -> std::io::Result<()> {
    signal(pid, libc::SIGKILL)
}

fn signal(pid: u32, signal: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|pid| *pid > 0)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Takes an exclusive `flock` on `file` without waiting: `false` when
/// another open file description holds it. Released when every descriptor
/// of this one is closed (or the process ends).
pub fn try_lock(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor the caller's File keeps open.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(error)
    }
}
