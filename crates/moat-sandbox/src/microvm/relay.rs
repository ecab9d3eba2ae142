//! `moat vm-relay PORT`: one guest connection to the egress proxy.
//!
//! QEMU's user network starts it, inside the jail, for each connection the
//! guest opens to the proxy's guest address, with that connection as its
//! standard input and output; it connects to the egress proxy on the
//! jail's loopback and copies both ways until either side closes.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, OwnedFd};

/// Relays standard input/output to `127.0.0.1:port`.
pub fn relay(port: u16) -> io::Result<()> {
    let proxy = TcpStream::connect(("127.0.0.1", port))?;
    let guest_in = io::stdin().as_fd().try_clone_to_owned()?;
    let guest_out = io::stdout().as_fd().try_clone_to_owned()?;
    let mut to_proxy = proxy.try_clone()?;
    let mut from_proxy = proxy;
    let upstream = std::thread::spawn(move || {
        let mut guest = std::fs::File::from(guest_in);
        let result = copy(&mut guest, &mut to_proxy);
        let _ = to_proxy.shutdown(Shutdown::Write);
        result
    });
    let mut guest = std::fs::File::from(guest_out);
    let down = copy(&mut from_proxy, &mut guest);
    // The guest's side is a socket: say end-of-stream on it too.
    let _ = shutdown_write(&guest);
    let up = upstream
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("relay thread panicked")));
    down.and(up)
}

pub(crate) fn copy(from: &mut impl Read, to: &mut impl Write) -> io::Result<()> {
    let mut buf = vec![0; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}

/// `shutdown(2)` is the same call for every kind of socket: a Unix
/// stream's method serves for the socket QEMU hands over, whatever it is.
fn shutdown_write(file: &std::fs::File) -> io::Result<()> {
    let fd: OwnedFd = file.as_fd().try_clone_to_owned()?;
    std::os::unix::net::UnixStream::from(fd).shutdown(Shutdown::Write)
}

/// The descriptors QEMU is given as the program's stdout and stderr:
/// above those the jail passes (3, 4, ...: the sockets relayed to the
/// program's passed descriptors).
pub(crate) const STDOUT_FD: i32 = 3 + crate::spec::MAX_PASSED_FDS as i32;
pub(crate) const STDERR_FD: i32 = STDOUT_FD + 1;

/// `moat vm-qemu QEMU ARGS...`: starts the emulator, inside the jail, with
/// copies of its stdout and stderr at [`STDOUT_FD`] and [`STDERR_FD`]. QEMU takes no
/// standard stream as a descriptor set, reopening the launcher's pipes
/// through /proc is refused, and its `stdio` backend closes the port when
/// its stdin ends. Returns only on failure.
pub fn exec_qemu(argv: &[std::ffi::OsString]) -> io::Error {
    let Some((program, args)) = argv.split_first() else {
        return io::Error::new(io::ErrorKind::InvalidInput, "no emulator given");
    };
    // SAFETY (both): dup2 on descriptors this process owns; the copies are
    // meant to survive exec (dup2 clears close-on-exec).
    if unsafe { libc::dup2(1, STDOUT_FD) } < 0 || unsafe { libc::dup2(2, STDERR_FD) } < 0 {
        return io::Error::last_os_error();
    }
    use std::os::unix::process::CommandExt;
    std::process::Command::new(program).args(args).exec()
}
