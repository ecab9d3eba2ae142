//! Collecting the candidates under a directory, through directory handles
//! one name at a time: no symbolic link is followed, no `..` resolved, so
//! a tree that changes while it is read cannot lead outside it.

use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::ExportError;
use crate::verify::{RejectRule, Rejection};

/// Deepest directory nesting walked.
const MAX_DEPTH: usize = 64;
/// Most entries examined; the rest are refused unread.
const MAX_ENTRIES: usize = 100_000;

/// A file read for judgement.
pub struct Candidate {
    pub path: String,
    pub bytes: Vec<u8>,
}

/// What the walk yields, in path order.
pub enum Entry {
    File(Candidate),
    /// Refused before its content was read.
    Refused {
        path: String,
        size: u64,
        reason: Rejection,
    },
}

fn refused(path: String, size: u64, rule: RejectRule, detail: impl Into<String>) -> Entry {
    Entry::Refused {
        path,
        size,
        reason: Rejection {
            rule,
            detail: detail.into(),
        },
    }
}

/// What the walk asks of its caller.
pub struct Visit<'a> {
    /// A relative path's size cap, `None` when no rule takes it (it is then
    /// not read).
    pub max_bytes: &'a dyn Fn(&str) -> Option<u64>,
    /// Paths not to look at (judged already, or not candidates); a
    /// directory's path ends with `/`, and skipping it skips all under it.
    pub skip: &'a dyn Fn(&str) -> bool,
    /// Told of a file before its content is read.
    pub reading: &'a mut dyn FnMut(&str),
    /// Each entry, in path order, as soon as it is known.
    pub entry: &'a mut dyn FnMut(Entry),
}

/// Every entry under `root` but directories, one at a time: a file's
/// content is read only when its turn comes, and dropped after.
pub fn walk(root: &Path, visit: &mut Visit<'_>) -> Result<(), ExportError> {
    let io = |e: rustix::io::Errno| ExportError::Io(root.display().to_string(), e.into());
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io)?;
    let mut seen = 0usize;
    descend(&dir, "", 0, visit, &mut seen).map_err(io)
}

fn descend(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    visit: &mut Visit<'_>,
    seen: &mut usize,
) -> Result<(), rustix::io::Errno> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    names.sort();
    for raw in names {
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let path = format!("{prefix}{shown}");
        let stat = rustix::fs::statat(dir, raw.as_slice(), AtFlags::SYMLINK_NOFOLLOW);
        let is_dir =
            matches!(&stat, Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory);
        // A directory is asked about by its path and a slash: skipped when
        // nothing under it is wanted. Skipped entries count for nothing.
        let asked = if is_dir {
            format!("{path}/")
        } else {
            path.clone()
        };
        if (visit.skip)(&asked) {
            continue;
        }
        *seen += 1;
        if *seen > MAX_ENTRIES {
            (visit.entry)(refused(
                path,
                0,
                RejectRule::TooManyFiles,
                format!("more than {MAX_ENTRIES} entries: not examined"),
            ));
            continue;
        }
        let stat = match stat {
            Ok(stat) => stat,
            Err(e) => {
                (visit.entry)(refused(
                    path,
                    0,
                    RejectRule::Unreadable,
                    format!("stat: {e}"),
                ));
                continue;
            }
        };
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        let kind = FileType::from_raw_mode(stat.st_mode);
        if kind == FileType::Directory {
            if std::str::from_utf8(&raw).is_err() || shown.chars().any(char::is_control) {
                (visit.entry)(refused(
                    path,
                    0,
                    RejectRule::BadName,
                    "a directory name that is not clean UTF-8: its files are not examined",
                ));
                continue;
            }
            if depth + 1 >= MAX_DEPTH {
                (visit.entry)(refused(
                    path,
                    0,
                    RejectRule::Unreadable,
                    format!("nested deeper than {MAX_DEPTH} directories: not examined"),
                ));
                continue;
            }
            // One name from readdir (no `/`), not followed if a link: what
            // `openat2`'s RESOLVE_BENEATH would give, where the sandbox's
            // seccomp filter refuses `openat2` itself.
            match rustix::fs::openat(
                dir,
                raw.as_slice(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(sub) => descend(&sub, &format!("{path}/"), depth + 1, visit, seen)?,
                Err(e) => (visit.entry)(refused(
                    path,
                    0,
                    RejectRule::Unreadable,
                    format!("open: {e}"),
                )),
            }
            continue;
        }
        if std::str::from_utf8(&raw).is_err() || shown.chars().any(char::is_control) {
            (visit.entry)(refused(
                path,
                size,
                RejectRule::BadName,
                "a name that is not UTF-8 or holds control characters",
            ));
            continue;
        }
        let found = match kind {
            // Not its target: the program chose it, and it may hold anything.
            FileType::Symlink => refused(path, size, RejectRule::Symlink, "a symbolic link"),
            FileType::RegularFile => regular(dir, &raw, path, &stat, visit),
            other => refused(
                path,
                size,
                RejectRule::SpecialFile,
                format!("not a regular file ({other:?})"),
            ),
        };
        (visit.entry)(found);
    }
    Ok(())
}

fn regular(
    dir: &OwnedFd,
    raw: &[u8],
    path: String,
    stat: &rustix::fs::Stat,
    visit: &mut Visit<'_>,
) -> Entry {
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if stat.st_nlink > 1 {
        return refused(
            path,
            size,
            RejectRule::Hardlink,
            format!("{} links to one file", stat.st_nlink),
        );
    }
    if stat.st_mode & 0o6000 != 0 {
        return refused(
            path,
            size,
            RejectRule::Setid,
            format!("mode {:o}: setuid or setgid", stat.st_mode & 0o7777),
        );
    }
    let Some(cap) = (visit.max_bytes)(&path) else {
        return refused(
            path,
            size,
            RejectRule::NoRule,
            "no export rule's path matches it",
        );
    };
    if size > cap {
        return refused(
            path,
            size,
            RejectRule::TooLarge,
            format!("{size} bytes, over its rule's {cap} (maxBytes)"),
        );
    }
    (visit.reading)(&path);
    // Not blocking: a FIFO put in its place since the stat must not hang us.
    let file = match rustix::fs::openat(
        dir,
        raw,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => return refused(path, size, RejectRule::Unreadable, format!("open: {e}")),
    };
    match rustix::fs::fstat(&file) {
        Ok(now)
            if now.st_ino == stat.st_ino
                && now.st_dev == stat.st_dev
                && FileType::from_raw_mode(now.st_mode) == FileType::RegularFile => {}
        _ => {
            return refused(
                path,
                size,
                RejectRule::Unreadable,
                "replaced while being examined",
            );
        }
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    match file.take(cap.saturating_add(1)).read_to_end(&mut bytes) {
        Ok(n) if n as u64 > cap => refused(
            path,
            n as u64,
            RejectRule::TooLarge,
            format!("grew past its rule's {cap} bytes while being read"),
        ),
        Ok(_) => Entry::File(Candidate { path, bytes }),
        Err(e) => refused(path, size, RejectRule::Unreadable, format!("read: {e}")),
    }
}
