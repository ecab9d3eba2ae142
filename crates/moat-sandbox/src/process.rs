//! Signals to processes the caller started (by pid), for binaries that may
//! not hold `unsafe` themselves.

/// Sends SIGTERM to `pid`, a child the caller started and has not reaped
/// (so the pid cannot have been reused).
pub fn terminate(pid: u32) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
