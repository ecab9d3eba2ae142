//! The sandbox's network namespace, made beside the sandbox rather than by
//! its clone.
//!
//! Making a network namespace is the most expensive single step of a launch
//! (about half a millisecond here: loopback, sysctl tables, per-namespace
//! state of every protocol). Made by `CLONE_NEWNET` in the sandbox's clone it
//! would sit in front of everything init does. Instead, once the ids are
//! mapped, the launcher starts a short-lived helper that enters the sandbox's
//! user namespace, unshares a network namespace there (so that namespace is
//! owned by the sandbox's user namespace, exactly as the clone would have made
//! it) and hands the namespace to init over a socket, while init plans and
//! builds the root on another CPU. init joins it with `setns` and brings `lo`
//! up before anything in the sandbox listens or runs.
//!
//! The helper is started like the payload ([`sys::vfork_run`]): the launcher
//! sleeps until it has exited, so the helper, which holds capabilities in the
//! sandbox's user namespace, is gone before the launcher lets init go on
//! (`C`), and so before the program starts.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::error::{Layer, SetupError};
use crate::sys;

/// Makes the namespace and sends it to init. `userns` is the sandbox's user
/// namespace (opened before init changed its ids), `to_init` the launcher's
/// end of the socket init receives it on. The launcher closes that end only
/// once init is gone or has the namespace: closed while init waits on it,
/// init would report that no namespace came, in place of the helper's
/// failure. With `keep`, the launcher gets the namespace too (the
/// `ingress-only` forwarder joins it).
pub(crate) fn make_for_init(
    userns: &OwnedFd,
    to_init: &OwnedFd,
    keep: bool,
) -> Result<Option<OwnedFd>, SetupError> {
    let (errors, error_write) =
        sys::pipe().map_err(|e| SetupError::io(Layer::Network, "helper pipe", e))?;
    let (kept, to_launcher) = if keep {
        let (ours, theirs) = sys::socketpair()
            .map_err(|e| SetupError::io(Layer::Network, "network namespace socket", e))?;
        (Some(ours), Some(theirs))
    } else {
        (None, None)
    };
    let (userns, to) = (userns.as_raw_fd(), to_init.as_raw_fd());
    let also = to_launcher.as_ref().map(|fd| fd.as_raw_fd());
    let pid = sys::vfork_run(&mut || match make_and_send(userns, to, also) {
        Ok(()) => 0,
        Err(message) => {
            let _ = sys::write_all(error_write.as_raw_fd(), message.as_bytes());
            1
        }
    })
    .map_err(|e| SetupError::io(Layer::Network, "starting the namespace helper", e))?;
    drop((error_write, to_launcher));
    let mut status = 0;
    // SAFETY: reaping our own child (it has exited: vfork_run returned);
    // status is a valid int.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 && sys::errno() == libc::EINTR {}
    let mut buf = [0u8; 512];
    // Every write end is closed: this reads what the helper wrote, or end of file.
    let n = sys::read(errors.as_raw_fd(), &mut buf).unwrap_or(0);
    if n > 0 {
        return Err(SetupError::new(
            Layer::Network,
            String::from_utf8_lossy(&buf[..n]).into_owned(),
        ));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(SetupError::new(
            Layer::Network,
            format!("the network namespace helper failed (wait status {status})"),
        ));
    }
    match kept {
        None => Ok(None),
        Some(socket) => sys::recv_fd(socket.as_raw_fd())
            .map_err(|e| SetupError::io(Layer::Network, "receiving the network namespace", e))?
            .ok_or_else(|| SetupError::new(Layer::Network, "no network namespace came"))
            .map(Some),
    }
}

/// The helper's whole job; a failure is one line for the launcher.
fn make_and_send(userns: RawFd, to_init: RawFd, also: Option<RawFd>) -> Result<(), String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: prctl, setns and unshare with a descriptor we hold and constants;
    // this process has no other thread (a vfork of the single-threaded launcher).
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(os("PR_SET_PDEATHSIG"));
        }
        if libc::setns(userns, libc::CLONE_NEWUSER) != 0 {
            return Err(os("entering the sandbox's user namespace"));
        }
        if libc::unshare(libc::CLONE_NEWNET) != 0 {
            return Err(os("new network namespace"));
        }
    }
    let netns = File::open("/proc/thread-self/ns/net")
        .map_err(|e| format!("opening the new network namespace: {e}"))?;
    if let Some(launcher) = also {
        sys::send_fd(launcher, netns.as_raw_fd())
            .map_err(|e| format!("handing the network namespace to the launcher: {e}"))?;
    }
    sys::send_fd(to_init, netns.as_raw_fd())
        .map_err(|e| format!("handing the network namespace to init: {e}"))
}

/// In init: joins the namespace the helper sent.
pub(crate) fn join(from_helper: RawFd) -> Result<(), SetupError> {
    let netns = sys::recv_fd(from_helper)
        .map_err(|e| SetupError::io(Layer::Network, "receiving the network namespace", e))?
        .ok_or_else(|| SetupError::new(Layer::Network, "no network namespace came"))?;
    // SAFETY: setns with a namespace descriptor we own and a flag constant.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(SetupError::io(
            Layer::Network,
            "joining the network namespace",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// In init, in the joined namespace: `lo` up.
pub(crate) fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket creation.
    let sock =
        sys::cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: ifreq is plain old data; zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: ifr is a valid ifreq naming "lo"; the ioctls read and write it.
    let result = unsafe {
        sys::cvt(libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut ifr)).and_then(|_| {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            sys::cvt(libc::ioctl(sock, libc::SIOCSIFFLAGS, &ifr))
        })
    };
    // SAFETY: sock is ours.
    unsafe { libc::close(sock) };
    result.map(|_| ())
}
