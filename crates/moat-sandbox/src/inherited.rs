//! Descriptors a sandboxed program was handed at start (`SandboxSpec::
//! pass_fds`: 3, 4, ...), taken once each as owned files. A program
//! cannot reopen them through /proc: they belong to the launcher's user.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Which of descriptors 0..64 have been taken: each may be owned once.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// Errors: `EBADF` if `fd` is not open, below 3 or above 63; `EBUSY` if it
/// was already taken.
pub fn take(fd: RawFd) -> io::Result<OwnedFd> {
    if !(3..64).contains(&fd) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    let bit = 1u64 << fd;
    if TAKEN.fetch_or(bit, Ordering::SeqCst) & bit != 0 {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    // SAFETY: F_GETFD only reads the descriptor's flags.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open, was inherited at exec (nothing in
    // this process opened it, so nothing else owns it) and `TAKEN` lets it
    // be claimed once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::take;

    #[test]
    fn only_an_open_inherited_descriptor_is_taken_and_only_once() {
        assert!(take(1).is_err());
        assert!(take(64).is_err());
        // 63 is not open in a test process.
        assert!(take(63).is_err());
        assert_eq!(
            take(63).err().and_then(|e| e.raw_os_error()),
            Some(libc::EBUSY)
        );
    }
}
