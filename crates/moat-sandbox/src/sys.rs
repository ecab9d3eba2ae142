//! Thin, checked wrappers over the raw syscalls the launcher needs and that
//! `libc` does not wrap. Every `unsafe` block of the crate that talks to the
//! kernel directly lives here or next to the state it protects.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Converts a `-1`-on-error return into `io::Result`.
pub(crate) fn cvt<T: Copy + PartialEq + From<i8>>(ret: T) -> io::Result<T> {
    if ret == T::from(-1) {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub(crate) fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// The result of [`clone3`] as seen by each side.
pub(crate) enum Forked {
    Parent { pid: libc::pid_t, pidfd: OwnedFd },
    Child,
}

/// `CLONE_INTO_CGROUP` (Linux 5.7), as the `u64` clone3 takes (libc's
/// constant is a `c_int`, which it overflows).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3` with fork semantics (no shared memory, the child runs on a copy of
/// the caller's stack) into the namespaces in `flags`, returning a pidfd.
/// With `cgroup` (a cgroup v2 directory), the child starts in that cgroup.
///
/// The caller must be single-threaded: the child is a copy of this one thread.
pub(crate) fn clone3(flags: u64, cgroup: Option<RawFd>) -> io::Result<Forked> {
    let mut pidfd: RawFd = -1;
    // SAFETY: clone_args is plain old data; zero is a valid value for every field.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = flags | libc::CLONE_PIDFD as u64;
    if let Some(fd) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd as u64;
    }
    args.pidfd = std::ptr::addr_of_mut!(pidfd) as u64;
    args.exit_signal = libc::SIGCHLD as u64;
    // SAFETY: args is a valid clone_args of the size we pass; with no CLONE_VM and
    // a zero stack the child continues on a private copy of our stack, exactly as
    // after fork(2). The kernel writes the pidfd into `pidfd`, which outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of_mut!(args),
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    match cvt(ret)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent {
            pid: pid as libc::pid_t,
            // SAFETY: CLONE_PIDFD succeeded, so `pidfd` is a fresh descriptor we own.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

/// Runs `body` in a child made the way `posix_spawn` makes one:
/// `CLONE_VM | CLONE_VFORK` on a stack of its own. No page tables are copied,
/// no copy-on-write faults follow, and the caller sleeps until the child has
/// exec'd or exited (with `body`'s return value), usually on the caller's own
/// CPU. While it runs the child shares the caller's memory, allocator
/// included, and has one user at a time; it has its own descriptors, cwd,
/// credentials, namespaces, rlimits and seccomp/Landlock state.
pub(crate) fn vfork_run<F: FnMut() -> i32>(body: &mut F) -> io::Result<libc::pid_t> {
    extern "C" fn entry<F: FnMut() -> i32>(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `body` vfork_run passed, alive in the caller's
        // (suspended) frame until this child execs or exits.
        let body = unsafe { &mut *arg.cast::<F>() };
        body()
    }
    const STACK: usize = 1 << 20;
    const GUARD: usize = 64 << 10;
    // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            STACK + GUARD,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the lowest GUARD bytes of our own mapping become a guard page,
    // so a stack overflow faults instead of writing over the caller's memory.
    unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) };
    // SAFETY: the stack top is inside our mapping (stacks grow down); with
    // CLONE_VFORK the caller is suspended until the child execs or exits, so
    // `body` and everything it borrows stay valid and unshared meanwhile.
    let pid = unsafe {
        libc::clone(
            entry::<F>,
            base.cast::<u8>().add(STACK + GUARD).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (body as *mut F).cast(),
        )
    };
    // SAFETY: the child has exec'd or exited (or was never made): nothing
    // runs on this stack any more.
    unsafe { libc::munmap(base, STACK + GUARD) };
    cvt(pid)
}

/// `open_tree(2)`: a detached copy of the mount at `path` (with `OPEN_TREE_CLONE`).
pub(crate) fn open_tree(dirfd: RawFd, path: &CStr, flags: u32) -> io::Result<OwnedFd> {
    // SAFETY: path is NUL-terminated and lives across the call.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) })?;
    // SAFETY: open_tree returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `move_mount(2)` of the detached mount `from` onto `to` (relative to `to_dirfd`).
pub(crate) fn move_mount(from: RawFd, to_dirfd: RawFd, to: &CStr) -> io::Result<()> {
    let empty = c"";
    // SAFETY: both strings are NUL-terminated and outlive the call; `from` is open.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from,
            empty.as_ptr(),
            to_dirfd,
            to.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// `mount_setattr(2)` on the mount referred to by `fd` (and, with `recursive`,
/// every mount below it).
pub(crate) fn mount_setattr(
    fd: RawFd,
    recursive: bool,
    set: u64,
    clear: u64,
    userns_fd: Option<RawFd>,
) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: userns_fd.map_or(0, |fd| fd as u64),
    };
    let mut flags = libc::AT_EMPTY_PATH as u32;
    if recursive {
        flags |= libc::AT_RECURSIVE as u32;
    }
    let empty = c"";
    // SAFETY: attr is a valid mount_attr of the size passed; the path is "".
    cvt(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            empty.as_ptr(),
            flags,
            std::ptr::addr_of!(attr),
            std::mem::size_of::<libc::mount_attr>(),
        )
    })?;
    Ok(())
}

/// Classic `mount(2)`.
pub(crate) fn mount(
    source: &CStr,
    target: &CStr,
    fstype: &CStr,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let data = data.map_or(std::ptr::null(), |d| d.as_ptr().cast::<libc::c_void>());
    // SAFETY: all strings are NUL-terminated and outlive the call.
    cvt(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data,
        )
    })?;
    Ok(())
}

/// `pivot_root(2)`.
pub(crate) fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated and outlive the call.
    cvt(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })?;
    Ok(())
}

/// `pidfd_send_signal(2)`: signals exactly the process behind `pidfd`, never a
/// recycled pid.
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: a null siginfo is allowed; the pidfd is open.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

/// Marks every descriptor from `first` up as close-on-exec.
pub(crate) fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing; it only sets flags.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    })?;
    Ok(())
}

/// A pipe whose both ends are close-on-exec.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A connected pair of close-on-exec unix stream sockets.
pub(crate) fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for the two descriptors socketpair writes.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair succeeded, so both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes all of `buf` to a raw descriptor, retrying on `EINTR`.
pub(crate) fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is a valid slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        buf = buf.get(n as usize..).unwrap_or_default();
    }
    Ok(())
}

/// Reads into `buf` from a raw descriptor, retrying on `EINTR`; 0 means end of file.
pub(crate) fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid, writable slice for its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// The errno of the last failed libc call.
pub(crate) fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Number of threads in this process (the launcher must be single-threaded to clone).
pub(crate) fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// A TCP socket listening on `127.0.0.1:port` (close-on-exec).
pub(crate) fn tcp_listener_v4_loopback(port: u16) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: socket returned a new descriptor that nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: addr is a valid sockaddr_in of the size passed.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    })?;
    // SAFETY: listen on our own socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 1024) })?;
    Ok(fd)
}

/// Sends one descriptor over a unix socket (`SCM_RIGHTS`).
pub(crate) fn send_fd(socket: RawFd, fd: RawFd) -> io::Result<()> {
    send_with_fds(socket, &[0], &[fd]).map(|_| ())
}

/// Sends `data` (at least one byte) with `fds` (at most [`MAX_FDS`])
/// attached; returns how many bytes went (a stream socket may take fewer; the
/// descriptors go with the first byte).
pub(crate) fn send_with_fds(socket: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "more descriptors than a receiver takes from one message",
        ));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    let payload = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain old data; zero is valid for every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` bytes, enough for one cmsg
        // carrying `fds`; CMSG_FIRSTHDR and CMSG_DATA stay inside that buffer,
        // and the copy writes exactly `payload` bytes after CMSG_DATA.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                payload as usize,
            );
        }
    }
    // SAFETY: msg and everything it points at (the caller's data, which the
    // kernel only reads) are valid for the call.
    let n = cvt(unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) })?;
    Ok(n as usize)
}

/// Receives one descriptor sent with [`send_fd`]; `None` at end of stream.
pub(crate) fn recv_fd(socket: RawFd) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut fds = Vec::new();
    let n = recv_with_fds(socket, &mut byte, &mut fds)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(fds.pop())
}

/// Most descriptors taken from one message; more are closed by the kernel.
const MAX_FDS: usize = 4;

/// Reads into `buf`, appending any descriptors that came with the bytes
/// (close-on-exec) to `fds`, retrying on `EINTR`. Returns the byte count (0
/// at end of stream).
pub(crate) fn recv_with_fds(
    socket: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    recv_with_fds_and_pid(socket, buf, fds).map(|(n, _)| n)
}

/// Receives one descriptor sent with [`send_fd`], and the sender's pid in
/// the launcher's pid namespace when the socket has `SO_PASSCRED` (see
/// [`set_passcred`]); `None` at end of stream.
pub(crate) fn recv_fd_and_pid(socket: RawFd) -> io::Result<Option<(OwnedFd, Option<libc::pid_t>)>> {
    let mut byte = [0u8; 1];
    let mut fds = Vec::new();
    let (n, pid) = recv_with_fds_and_pid(socket, &mut byte, &mut fds)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(fds.pop().map(|fd| (fd, pid)))
}

/// Asks the kernel to attach the sender's credentials to what arrives on
/// `socket`, translated into the receiver's namespaces.
pub(crate) fn set_passcred(socket: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a plain int option on our own socket.
    cvt(unsafe {
        libc::setsockopt(
            socket,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            std::ptr::addr_of!(on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn recv_with_fds_and_pid(
    socket: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<(usize, Option<libc::pid_t>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe {
        libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32)
            + libc::CMSG_SPACE(std::mem::size_of::<libc::ucred>() as u32)
    } as usize;
    let mut pid = None;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain old data; zero is valid for every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    let n = loop {
        // SAFETY: msg and its buffers are valid for the call.
        match cvt(unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    // SAFETY: the kernel filled msg_control; CMSG_FIRSTHDR/NXTHDR return null or
    // a header inside it, and only SCM_RIGHTS and SCM_CREDENTIALS payloads
    // within cmsg_len are read.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize).saturating_sub(header)
                    / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            } else if (*cmsg).cmsg_level == libc::SOL_SOCKET
                && (*cmsg).cmsg_type == libc::SCM_CREDENTIALS
                && (*cmsg).cmsg_len as usize
                    >= libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) as usize
            {
                let creds = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::ucred>());
                // 0: the sender is in no namespace the receiver can name.
                pid = Some(creds.pid).filter(|p| *p > 0);
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // The kernel closed descriptors that did not fit: never act on part of them.
        return Err(io::Error::other(
            "descriptors sent with the message were dropped",
        ));
    }
    Ok((n as usize, pid))
}

/// `openat2(2)` relative to `dirfd` (`AT_FDCWD` for the cwd) with `resolve`
/// flags such as `RESOLVE_NO_SYMLINKS` or `RESOLVE_BENEATH`.
pub(crate) fn openat2(
    dirfd: RawFd,
    path: &CStr,
    flags: u64,
    mode: u64,
    resolve: u64,
) -> io::Result<OwnedFd> {
    // SAFETY: open_how is plain old data; zero is valid for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags;
    how.mode = mode;
    how.resolve = resolve;
    // SAFETY: how is a valid open_how of the size passed; path is NUL-terminated.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            std::ptr::addr_of!(how),
            std::mem::size_of::<libc::open_how>(),
        )
    })?;
    // SAFETY: openat2 returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// An `O_PATH` handle on `path`, refusing any symbolic link on the way.
pub(crate) fn open_no_symlinks(path: &Path) -> io::Result<OwnedFd> {
    openat2(
        libc::AT_FDCWD,
        &cstring(path)?,
        (libc::O_PATH | libc::O_CLOEXEC) as u64,
        0,
        libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    )
}

/// Whether `fd` is a Unix stream socket.
pub(crate) fn is_unix_stream(fd: RawFd) -> bool {
    let option = |name| {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value and len are valid for an int-sized option.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(value)
    };
    option(libc::SO_DOMAIN) == Some(libc::AF_UNIX)
        && option(libc::SO_TYPE) == Some(libc::SOCK_STREAM)
}

/// `fstat(2)`.
pub(crate) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data for the kernel to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid, writable stat.
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// Creates `name` (one component) in `dir`: a directory, or an empty regular
/// file, owned by `owner`. Never follows a symbolic link and never truncates;
/// an existing entry of the right type is left alone.
pub(crate) fn make_mount_point(
    dir: &OwnedFd,
    name: &CStr,
    is_dir: bool,
    owner: (u32, u32),
) -> io::Result<()> {
    let created = if is_dir {
        // SAFETY: name is NUL-terminated; dir is an open directory.
        cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) }).map(|_| ())
    } else {
        // SAFETY: as above; O_EXCL|O_NOFOLLOW never opens an existing entry.
        cvt(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        })
        // SAFETY: the descriptor just opened is ours.
        .map(|fd| unsafe {
            libc::close(fd);
        })
    };
    match created {
        Ok(()) => {
            // SAFETY: name is NUL-terminated; AT_SYMLINK_NOFOLLOW keeps it to the entry itself.
            cvt(unsafe {
                libc::fchownat(
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    owner.0,
                    owner.1,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            // SAFETY: stat is plain old data for the kernel to fill.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            cvt(unsafe {
                libc::fstatat(
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
            let kind = st.st_mode & libc::S_IFMT;
            let right = if is_dir {
                kind == libc::S_IFDIR
            } else {
                kind == libc::S_IFREG
            };
            if right {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists and is not of the mounted type (a symlink?)",
                ))
            }
        }
        Err(e) => Err(e),
    }
}
