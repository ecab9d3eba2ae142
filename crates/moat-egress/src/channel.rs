//! Descriptors over the proxy's control socket (`SCM_RIGHTS`), through
//! rustix's safe `sendmsg`/`recvmsg`: each sandbox's listening socket
//! travels with the line that introduces it.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

/// The most descriptors one message may carry (the proxy takes one).
const MAX_FDS: usize = 4;

/// Sends `data` with `fd` attached to its first byte; returns the bytes sent
/// (send the rest with plain writes).
pub fn send_with_fd(socket: BorrowedFd<'_>, data: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    if data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a descriptor needs at least one byte to travel with",
        ));
    }
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor"));
    }
    Ok(sendmsg(
        socket,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?)
}

/// Reads like `read(2)`, collecting any descriptors that came with the bytes
/// (close-on-exec).
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match recvmsg(
            socket,
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(Errno::INTR) => continue,
            other => break other?,
        }
    };
    let mut passed_any = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = message {
            passed_any.extend(passed);
        }
    }
    // Descriptors the kernel could not hand over (none free here, or more
    // than fit) were dropped: refuse the message rather than serve a later
    // line with the wrong listener.
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::other(
            "a passed descriptor was dropped (control data truncated)",
        ));
    }
    fds.extend(passed_any);
    Ok(received.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::os::fd::AsFd as _;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_travels_with_its_line() -> io::Result<()> {
        let (a, b) = UnixStream::pair()?;
        let (passed, mut kept) = UnixStream::pair()?;
        let sent = send_with_fd(a.as_fd(), b"serve\n", passed.as_fd())?;
        assert!(sent > 0);
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv_with_fds(b.as_fd(), &mut buf, &mut fds)?;
        assert_eq!(&buf[..n], b"serve\n");
        assert_eq!(fds.len(), 1);
        // The received descriptor is the same socket: what goes in one end
        // comes out of the kept one.
        let mut received = UnixStream::from(fds.remove(0));
        received.write_all(b"x")?;
        let mut one = [0u8; 1];
        std::io::Read::read_exact(&mut kept, &mut one)?;
        assert_eq!(&one, b"x");
        assert!(send_with_fd(a.as_fd(), b"", passed.as_fd()).is_err());
        Ok(())
    }
}
