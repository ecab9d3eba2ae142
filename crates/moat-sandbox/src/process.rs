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
