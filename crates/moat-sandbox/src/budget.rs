//! Storage budgets: what a program writes into its writable roots, all
//! together, is capped (`limits.maxWriteBytes`, `moat exec --max-write`).
//!
//! Each writable root is an overlay inside the sandbox's own mount
//! namespace: the declared root below, and above it a directory on one
//! tmpfs of the budget's size shared by all the run's roots. Writes past the
//! budget fail with `ENOSPC`; the host's disk is not touched while the
//! program runs (the tmpfs's pages count against the run's memory limit).
//! When the program has ended, init merges what the upper layers hold into
//! the roots: it has the program's own rights there (no capability, the
//! same uid), reads names from its own directory handles and never follows
//! a link, so nothing it writes could not have been written by the program.
//! Works the same launched by root or not (overlay and tmpfs in a user
//! namespace; `userxattr`). Renaming a directory on such a root fails with
//! `EXDEV` (no `redirect_dir`), as on any overlay without it.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::sys;

/// The tmpfs holding the upper layers, and each root's two sides.
pub(crate) struct Budget {
    pub(crate) limit: u64,
    tmpfs: OwnedFd,
    roots: Vec<Layers>,
}

struct Layers {
    /// Where the program saw it.
    inside: PathBuf,
    /// What the program wrote (the overlay's upper directory).
    upper: OwnedFd,
    /// The declared root itself.
    lower: OwnedFd,
}

/// What the merge did.
pub(crate) struct Merged {
    /// Bytes the upper layers held (what the program wrote, rounded to
    /// the tmpfs's pages).
    pub(crate) written: u64,
    /// The budget was used up: some writes got `ENOSPC`.
    pub(crate) full: bool,
    /// Entries that could not be merged (first few), empty when all were.
    pub(crate) failures: Vec<String>,
}

impl Budget {
    pub(crate) fn new(limit: u64, tmpfs: OwnedFd) -> Budget {
        Budget {
            limit,
            tmpfs,
            roots: Vec::new(),
        }
    }

    pub(crate) fn add(&mut self, inside: PathBuf, upper: OwnedFd, lower: OwnedFd) {
        self.roots.push(Layers {
            inside,
            upper,
            lower,
        });
    }

    /// Bytes in use on the tmpfs.
    fn used(&self) -> u64 {
        // SAFETY: statfs is plain old data for fstatfs to fill.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a valid statfs to fill.
        if unsafe { libc::fstatfs(self.tmpfs.as_raw_fd(), &mut st) } != 0 {
            return 0;
        }
        let blocks = (st.f_blocks as u64).saturating_sub(st.f_bfree as u64);
        blocks.saturating_mul(st.f_bsize as u64)
    }

    /// Merges every upper layer into its root (init, once the program and
    /// everything it started are gone). The merge itself writes at most
    /// the budget: hard links and sparse files cost the tmpfs less than
    /// their copies cost the root, so the copies are counted too.
    pub(crate) fn merge(&self) -> Merged {
        let written = self.used();
        // A page or two short of the size is as full as writes get.
        let full = written.saturating_add(2 * 4096) >= self.limit;
        let mut walk = Walk {
            failures: Vec::new(),
            left: self.limit,
            dev: 0,
        };
        for root in &self.roots {
            walk.dev = sys::fstat(root.lower.as_raw_fd()).map_or(0, |st| st.st_dev);
            merge_dir(
                root.upper.as_raw_fd(),
                root.lower.as_raw_fd(),
                &root.inside,
                0,
                &mut walk,
            );
        }
        Merged {
            written,
            full,
            failures: walk.failures,
        }
    }
}

/// One merge's state.
struct Walk {
    /// What could not be merged (the first few, each short: they travel on
    /// the status pipe, which nobody reads until init is gone).
    failures: Vec<String>,
    /// Bytes the merge may still write into the roots.
    left: u64,
    /// The device of the root being merged: nothing on another (a mount
    /// below the root, which the program never saw) is touched.
    dev: u64,
}

const MAX_FAILURES: usize = 5;
const MAX_FAILURE_LEN: usize = 240;

impl Walk {
    fn fail(&mut self, path: &std::path::Path, what: &str, e: io::Error) {
        if self.failures.len() < MAX_FAILURES {
            let mut line = format!("{}: {what}: {e}", path.display());
            if line.len() > MAX_FAILURE_LEN {
                let mut cut = MAX_FAILURE_LEN;
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                line.truncate(cut);
                line.push('…');
            }
            self.failures.push(line);
        }
    }
}

/// The names in directory `dir` (not `.` and `..`).
fn names(dir: RawFd) -> io::Result<Vec<CString>> {
    // A descriptor of its own for the stream, which closedir closes; it
    // shares `dir`'s offset, hence the rewind.
    // SAFETY: dup of a descriptor we hold.
    let fd = unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh directory descriptor; fdopendir takes it over.
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so fd is still ours.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    // SAFETY: rewinding a directory stream we own.
    unsafe { libc::rewinddir(stream) };
    let mut out = Vec::new();
    let result = loop {
        // readdir reports an error only through errno.
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: stream is valid until closedir below.
        let entry = unsafe { libc::readdir64(stream) };
        if entry.is_null() {
            break match sys::errno() {
                0 => Ok(()),
                errno => Err(io::Error::from_raw_os_error(errno)),
            };
        }
        // SAFETY: d_name is NUL-terminated within the entry, which stays
        // valid until the next readdir; the name is copied before that.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            out.push(name.to_owned());
        }
    };
    // SAFETY: closing the stream we opened (and its descriptor).
    unsafe { libc::closedir(stream) };
    result.map(|()| out)
}

fn lstat_at(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data for fstatat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: name is NUL-terminated; st is valid.
    let r = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: name is NUL-terminated; the result is checked.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the overlay marked directory `name` opaque (it replaced, not
/// merged with, what was below).
fn opaque(dir: RawFd, name: &CStr) -> io::Result<bool> {
    let fd = open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let mut value = [0u8; 2];
    // SAFETY: value is a writable buffer of the size passed.
    let n = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            c"user.overlay.opaque".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(n >= 1 && value[0] == b'y')
}

/// Directories deeper than this are neither merged nor removed: the walk
/// recurses, and a program may build a tree as deep as its budget allows.
const MAX_DEPTH: usize = 256;

fn too_deep() -> io::Error {
    io::Error::other(format!("deeper than {MAX_DEPTH} directories"))
}

fn elsewhere() -> io::Error {
    io::Error::other("a mount below the root, which the program did not see: left as it is")
}

/// Removes `name` from `dir`, whatever it is, without following links or
/// leaving the root's filesystem.
fn remove_all(dir: RawFd, name: &CStr, dev: u64) -> io::Result<()> {
    remove_below(dir, name, dev, 0)
}

fn remove_below(dir: RawFd, name: &CStr, dev: u64, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    let st = match lstat_at(dir, name) {
        Ok(st) => st,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if st.st_dev != dev {
        return Err(elsewhere());
    }
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let child = open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        for entry in names(child.as_raw_fd())? {
            remove_below(child.as_raw_fd(), &entry, dev, depth + 1)?;
        }
        // SAFETY: name is NUL-terminated.
        sys::cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) })?;
    } else {
        // SAFETY: name is NUL-terminated.
        sys::cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), 0) })?;
    }
    Ok(())
}

/// A name for a file being put in place: random, so that it is no name
/// the program chose (created with `O_EXCL`, or a link that must not exist).
fn temporary() -> CString {
    CString::new(format!(".moat-merge-{}", moat_core::random::hex(8)))
        .unwrap_or_else(|_| c".moat-merge".to_owned())
}

fn merge_dir(upper: RawFd, lower: RawFd, at: &std::path::Path, depth: usize, walk: &mut Walk) {
    if depth > MAX_DEPTH {
        return walk.fail(at, "merging", too_deep());
    }
    let entries = match names(upper) {
        Ok(entries) => entries,
        Err(e) => return walk.fail(at, "listing what was written", e),
    };
    for name in entries {
        let path = at.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        if let Err(e) = merge_entry(upper, lower, &name, &path, depth, walk) {
            walk.fail(&path, "merging", e);
        }
    }
}

fn merge_entry(
    upper: RawFd,
    lower: RawFd,
    name: &CStr,
    path: &std::path::Path,
    depth: usize,
    walk: &mut Walk,
) -> io::Result<()> {
    let st = lstat_at(upper, name)?;
    let below = match lstat_at(lower, name) {
        Ok(below) if below.st_dev != walk.dev => return Err(elsewhere()),
        Ok(below) => Some(below),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
        Err(e) => return Err(e),
    };
    let mode = st.st_mode & 0o7777 & !(libc::S_ISUID | libc::S_ISGID);
    match st.st_mode & libc::S_IFMT {
        // A whiteout: the program removed it.
        libc::S_IFCHR if st.st_rdev == 0 => remove_all(lower, name, walk.dev),
        libc::S_IFDIR => {
            // The program's own directory, in a layer about to go: init
            // may need to read it whatever mode the program left.
            // SAFETY: name is NUL-terminated.
            sys::cvt(unsafe { libc::fchmodat(upper, name.as_ptr(), 0o700, 0) })?;
            let opaque = opaque(upper, name)?;
            let below_is_dir = below.is_some_and(|b| b.st_mode & libc::S_IFMT == libc::S_IFDIR);
            if below.is_some() && (!below_is_dir || opaque) {
                remove_all(lower, name, walk.dev)?;
            }
            let made = !below_is_dir || opaque;
            if made {
                // SAFETY: name is NUL-terminated.
                sys::cvt(unsafe { libc::mkdirat(lower, name.as_ptr(), 0o700) })?;
            }
            let from = open_at(upper, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            let to = open_at(lower, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            merge_dir(from.as_raw_fd(), to.as_raw_fd(), path, depth + 1, walk);
            // Its mode as the program left it; a directory that was there
            // keeps its set-group-id bit (a shared group's directory).
            let kept = below
                .filter(|_| !made)
                .map_or(0, |b| b.st_mode & libc::S_ISGID);
            let old = below.filter(|_| !made).map(|b| b.st_mode & 0o7777);
            if made || old != Some(mode | kept) {
                // SAFETY: a directory descriptor of ours.
                sys::cvt(unsafe { libc::fchmod(to.as_raw_fd(), mode | kept) })?;
            }
            Ok(())
        }
        libc::S_IFREG => {
            let size = st.st_size as u64;
            if size > walk.left {
                return Err(io::Error::other(
                    "over the budget (the merge writes no more than the budget): not merged",
                ));
            }
            walk.left -= size;
            let from = match open_at(upper, name, libc::O_RDONLY, 0) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                    // The program's own file, made unreadable by it.
                    // SAFETY: name is NUL-terminated.
                    sys::cvt(unsafe { libc::fchmodat(upper, name.as_ptr(), 0o600, 0) })?;
                    open_at(upper, name, libc::O_RDONLY, 0)?
                }
                Err(e) => return Err(e),
            };
            let tmp = temporary();
            let to = open_at(
                lower,
                &tmp,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )?;
            let copied = copy(from.as_raw_fd(), to.as_raw_fd(), size)
                // SAFETY: a file descriptor of ours.
                .and_then(|()| sys::cvt(unsafe { libc::fchmod(to.as_raw_fd(), mode) }).map(drop));
            drop(to);
            let placed = copied.and_then(|()| put_in_place(lower, &tmp, name, walk.dev));
            if placed.is_err() {
                let _ = remove_all(lower, &tmp, walk.dev);
            }
            placed
        }
        libc::S_IFLNK => {
            let mut target = vec![0u8; libc::PATH_MAX as usize];
            // SAFETY: target is a writable buffer of the size passed.
            let n = unsafe {
                libc::readlinkat(
                    upper,
                    name.as_ptr(),
                    target.as_mut_ptr().cast(),
                    target.len(),
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            target.truncate(n as usize);
            let target = CString::new(target).map_err(|_| io::Error::other("a NUL in a link"))?;
            let tmp = temporary();
            // SAFETY: both are NUL-terminated.
            sys::cvt(unsafe { libc::symlinkat(target.as_ptr(), lower, tmp.as_ptr()) })?;
            let placed = put_in_place(lower, &tmp, name, walk.dev);
            if placed.is_err() {
                let _ = remove_all(lower, &tmp, walk.dev);
            }
            placed
        }
        // FIFOs, sockets and devices are not carried over.
        _ => Ok(()),
    }
}

/// Renames `tmp` over `name` in `dir`; a directory in the way goes first
/// (rename cannot replace one with a file).
fn put_in_place(dir: RawFd, tmp: &CStr, name: &CStr, dev: u64) -> io::Result<()> {
    if lstat_at(dir, name).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR) {
        remove_all(dir, name, dev)?;
    }
    // SAFETY: both names are NUL-terminated.
    sys::cvt(unsafe { libc::renameat(dir, tmp.as_ptr(), dir, name.as_ptr()) }).map(drop)
}

/// Copies `size` bytes, leaving holes where the source has them (a sparse
/// file stays sparse, and costs the root what it cost the budget).
fn copy(from: RawFd, to: RawFd, size: u64) -> io::Result<()> {
    let mut at: i64 = 0;
    let end = i64::try_from(size).unwrap_or(i64::MAX);
    let mut buf = vec![0u8; 256 << 10];
    while at < end {
        // SAFETY: plain lseek on a descriptor we hold.
        let data = unsafe { libc::lseek(from, at, libc::SEEK_DATA) };
        if data < 0 {
            if sys::errno() == libc::ENXIO {
                break; // only a hole is left
            }
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(from, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut pos = data;
        while pos < hole.min(end) {
            let want = usize::try_from((hole.min(end) - pos) as u64)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            // SAFETY: buf is writable for `want` bytes.
            let n = unsafe { libc::pread(from, buf.as_mut_ptr().cast(), want, pos) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                break;
            }
            let mut written = 0usize;
            while written < n as usize {
                // SAFETY: the slice is within buf.
                let w = unsafe {
                    libc::pwrite(
                        to,
                        buf[written..n as usize].as_ptr().cast(),
                        n as usize - written,
                        pos + written as i64,
                    )
                };
                if w < 0 {
                    return Err(io::Error::last_os_error());
                }
                written += w as usize;
            }
            pos += n as i64;
        }
        at = hole;
    }
    // SAFETY: a file descriptor of ours; the size the source had.
    sys::cvt(unsafe { libc::ftruncate(to, end) }).map(drop)
}
