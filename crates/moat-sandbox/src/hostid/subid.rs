//! The host's block for Moat: the `moat-sandboxes` entries of `/etc/subuid`
//! and `/etc/subgid`, written on first use when they are missing.
//!
//! Those files are where a Linux host records which blocks of ids belong to
//! whom (`useradd` and `newuidmap` read them), so a block recorded there is
//! one that no other user, container runtime or later `useradd` takes. An
//! entry is also a grant: `newuidmap` lets the account of that name map the
//! block. So the owner is a name that must not be an account (a launch is
//! refused if `/etc/passwd` has it; deployments create `moat` and
//! `moat-runner`, never this). A new block is 65,536 ids from 1879048192
//! (0x70000000) upwards: after the ranges `useradd` hands out and systemd's
//! container range, below 2^31.
//!
//! Every block, wherever it comes from, must hold no id that anything else
//! may use ([`check_claims`]): no id of the local user and group files, no
//! other owner's subordinate ids, none of systemd's reserved ranges.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::lease::{RUN_DIR, ensure_root_dir};
use super::range::{IdRange, RangeError};

pub const SUBUID: &str = "/etc/subuid";
pub const SUBGID: &str = "/etc/subgid";
/// The owner name of Moat's entries: not an account (see above).
pub const OWNER: &str = "moat-sandboxes";

/// Ids systemd hands out by itself, without recording them anywhere.
const SYSTEMD_RANGES: &[(u64, u64, &str)] = &[
    (60001, 513, "systemd-homed's users"),
    (61184, 4336, "systemd's dynamic users"),
    (
        524288,
        1879048192 - 524288,
        "systemd-nspawn's container range",
    ),
    (0x7FFE_0000, 0x1_0000, "systemd's foreign range"),
];

const BLOCK: u32 = 65536;
const SEARCH_FROM: u64 = 0x7000_0000;
/// systemd's "foreign" range starts here; nothing of ours goes past it.
const SEARCH_TO: u64 = 0x7FFE_0000;

/// Why the host's block could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum SubidError {
    #[error("{file}: {source}")]
    Io { file: PathBuf, source: io::Error },
    #[error("{file}: the `moat-sandboxes` entry: {source}")]
    Entry {
        file: &'static str,
        source: RangeError,
    },
    #[error(
        "the `moat-sandboxes` entries differ: {SUBUID} has {uids}, {SUBGID} has {gids}; a sandbox runs as \
         uid n and gid n of one block, so they must be the same (or give --uid-range)"
    )]
    Mismatch { uids: IdRange, gids: IdRange },
    #[error(
        "Moat's block {range} is in one of {SUBUID} and {SUBGID} and overlaps another entry of \
         {file}: add a matching `moat-sandboxes` line to {file} by hand, or give --uid-range"
    )]
    Clash { range: IdRange, file: &'static str },
    #[error(
        "no free block of {BLOCK} ids between {SEARCH_FROM} and {SEARCH_TO} in {SUBUID}, {SUBGID}, \
         /etc/passwd and /etc/group: add a `moat-sandboxes:BASE:COUNT` line to both files, or give --uid-range"
    )]
    NoRoom,
    #[error(transparent)]
    Lock(#[from] super::lease::LeaseError),
    #[error("the block {range} holds {what}: its ids must belong to nothing but Moat's sandboxes")]
    Claimed { range: IdRange, what: String },
    #[error("{file} has an account named `{OWNER}`, which the entries would let map Moat's block")]
    OwnerIsAnAccount { file: &'static str },
    #[error(
        "{0} is a symbolic link: add the `moat-sandboxes` lines to the file it points to by hand"
    )]
    Symlink(&'static str),
    #[error("{file} is locked by pid {pid} (useradd or usermod?): try again when it is done")]
    Busy { file: String, pid: String },
}

/// The block sandboxes take their ids from: `chosen` (`--uid-range`), else
/// the host's, made on first use; checked either way ([`check_claims`]).
/// A launch reads each file once.
pub fn block(chosen: Option<IdRange>) -> Result<IdRange, SubidError> {
    let (uids, gids) = (Entries::read(SUBUID)?, Entries::read(SUBGID)?);
    let range = match (chosen, uids.ours()?, gids.ours()?) {
        (Some(range), _, _) => range,
        (None, Some(u), Some(g)) => agree(u, g)?,
        (None, _, _) => {
            let made = made_on_first_use()?;
            let (uids, gids) = (Entries::read(SUBUID)?, Entries::read(SUBGID)?);
            check_claims(made, &uids, &gids)?;
            return Ok(made);
        }
    };
    check_claims(range, &uids, &gids)?;
    Ok(range)
}

/// Refuses a block that holds an id anything but Moat may use: an id of
/// `/etc/passwd` or `/etc/group` (unreadable files refuse too), another
/// owner's entry in `/etc/subuid` or `/etc/subgid` (as read: `uids`,
/// `gids`), or one of systemd's reserved ranges. Also refuses when an
/// account has Moat's owner name.
fn check_claims(range: IdRange, uids: &Entries, gids: &Entries) -> Result<(), SubidError> {
    let claimed = |what: String| SubidError::Claimed { range, what };
    for (file, kind) in [("/etc/passwd", "uid"), ("/etc/group", "gid")] {
        let text = std::fs::read_to_string(file).map_err(|source| SubidError::Io {
            file: file.into(),
            source,
        })?;
        for line in text.lines() {
            let mut fields = line.split(':');
            let name = fields.next().unwrap_or_default();
            if kind == "uid" && name == OWNER {
                return Err(SubidError::OwnerIsAnAccount { file });
            }
            if let Some(id) = fields.nth(1).and_then(|f| f.parse::<u32>().ok())
                && range.contains(id)
            {
                return Err(claimed(format!("{kind} {id} ({name} in {file})")));
            }
        }
    }
    for entries in [uids, gids] {
        if let Some((owner, base, count)) = entries
            .lines()
            .find(|(owner, base, count)| *owner != OWNER && range.overlaps(*base, *count))
        {
            let file = entries.file;
            return Err(claimed(format!("{owner}'s ids {base}+{count} in {file}")));
        }
    }
    for (base, count, what) in SYSTEMD_RANGES {
        if range.overlaps(*base, *count) {
            return Err(claimed(format!("ids of {what} ({base}+{count})")));
        }
    }
    Ok(())
}

/// The host's block, written into both files when it is missing from
/// either, under a lock so that concurrent first launches agree.
fn made_on_first_use() -> Result<IdRange, SubidError> {
    ensure_root_dir(Path::new(RUN_DIR), 0o755)?;
    let lock_path = Path::new(RUN_DIR).join("subid.lock");
    let lock = File::options()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock_path)
        .map_err(|source| SubidError::Io {
            file: lock_path.clone(),
            source,
        })?;
    // SAFETY: flock on a descriptor owned here; released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(SubidError::Io {
            file: lock_path,
            source: io::Error::last_os_error(),
        });
    }
    // Another launcher may have written the entries while this one waited.
    let (uids, gids) = (Entries::read(SUBUID)?, Entries::read(SUBGID)?);
    let range = match (uids.ours()?, gids.ours()?) {
        (Some(u), Some(g)) => return agree(u, g),
        (Some(u), None) if gids.free(u) => u,
        (None, Some(g)) if uids.free(g) => g,
        (Some(u), None) => {
            return Err(SubidError::Clash {
                range: u,
                file: SUBGID,
            });
        }
        (None, Some(g)) => {
            return Err(SubidError::Clash {
                range: g,
                file: SUBUID,
            });
        }
        (None, None) => choose(&uids, &gids)?,
    };
    // Each append re-reads its file under shadow-utils' lock and leaves an
    // entry already there alone.
    uids.append(range)?;
    gids.append(range)?;
    Ok(range)
}

fn agree(uids: IdRange, gids: IdRange) -> Result<IdRange, SubidError> {
    if uids == gids {
        Ok(uids)
    } else {
        Err(SubidError::Mismatch { uids, gids })
    }
}

/// The first block that no entry of either file and no user or group holds.
fn choose(uids: &Entries, gids: &Entries) -> Result<IdRange, SubidError> {
    let mut base = SEARCH_FROM;
    while base + u64::from(BLOCK) <= SEARCH_TO {
        if let Ok(range) = IdRange::new(base as u32, BLOCK)
            && uids.free(range)
            && gids.free(range)
            && check_claims(range, uids, gids).is_ok()
        {
            return Ok(range);
        }
        base += u64::from(BLOCK);
    }
    Err(SubidError::NoRoom)
}

/// One of the two files, as read.
struct Entries {
    file: &'static str,
    text: String,
}

impl Entries {
    fn read(file: &'static str) -> Result<Self, SubidError> {
        match std::fs::read_to_string(file) {
            Ok(text) => Ok(Entries { file, text }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Entries {
                file,
                text: String::new(),
            }),
            Err(source) => Err(SubidError::Io {
                file: file.into(),
                source,
            }),
        }
    }

    /// `(owner, base, count)` of every well-formed line.
    fn lines(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.text.lines().filter_map(|line| {
            let mut fields = line.trim().split(':');
            let owner = fields.next()?;
            let base = fields.next()?.parse().ok()?;
            let count = fields.next()?.parse().ok()?;
            Some((owner, base, count))
        })
    }

    /// Moat's entry (the first, if there are several).
    fn ours(&self) -> Result<Option<IdRange>, SubidError> {
        let Some((_, base, count)) = self.lines().find(|(owner, _, _)| *owner == OWNER) else {
            return Ok(None);
        };
        let too_big = |_| RangeError::TooHigh {
            base: u32::MAX,
            count: u32::MAX,
        };
        let range = u32::try_from(base)
            .map_err(too_big)
            .and_then(|b| IdRange::new(b, u32::try_from(count).map_err(too_big)?))
            .map_err(|source| SubidError::Entry {
                file: self.file,
                source,
            })?;
        Ok(Some(range))
    }

    /// No entry but Moat's own overlaps `range`.
    fn free(&self, range: IdRange) -> bool {
        !self
            .lines()
            .any(|(owner, base, count)| owner != OWNER && range.overlaps(base, count))
    }

    /// Adds Moat's line: the file is rewritten beside itself and renamed
    /// over, so a reader never sees half of it; mode and owner are kept. It
    /// takes shadow-utils' lock on the file (`FILE.lock`, made by linking a
    /// file holding our pid), so that `useradd` or `usermod` never rewrite
    /// it at the same time, and re-reads it under that lock.
    fn append(&self, range: IdRange) -> Result<(), SubidError> {
        let path = Path::new(self.file);
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(SubidError::Symlink(self.file));
        }
        let _lock = ShadowLock::take(self.file)?;
        let current = Entries::read(self.file)?;
        if current.ours()?.is_some() {
            return Ok(());
        }
        if !current.free(range) {
            return Err(SubidError::Clash {
                range,
                file: self.file,
            });
        }
        let io_err = |source| SubidError::Io {
            file: self.file.into(),
            source,
        };
        let (mode, owner) = match std::fs::metadata(path) {
            Ok(meta) => (
                meta.permissions().mode() & 0o7777,
                Some((meta.uid(), meta.gid())),
            ),
            Err(_) => (0o644, None),
        };
        let mut text = current.text;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("{OWNER}:{}:{}\n", range.base, range.count));
        let temp = sibling(path, "moat");
        let written = (|| {
            let mut file = File::options()
                .write(true)
                .create_new(true)
                .mode(mode)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&temp)?;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
            }
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temp, path)?;
            // The rename itself must survive a crash too.
            File::open(path.parent().unwrap_or(Path::new("/")))?.sync_all()
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written.map_err(io_err)
    }
}

/// `.NAME.TAG-PID` beside `path`.
fn sibling(path: &Path, tag: &str) -> PathBuf {
    path.with_file_name(format!(
        ".{}.{tag}-{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ))
}

/// shadow-utils' lock on one of its files: `FILE.lock`, a hard link to a
/// file holding the locker's pid. A lock whose pid is gone is stale and
/// taken over.
struct ShadowLock(PathBuf);

impl ShadowLock {
    fn take(file: &'static str) -> Result<Self, SubidError> {
        let io_err = |source| SubidError::Io {
            file: file.into(),
            source,
        };
        let lock = PathBuf::from(format!("{file}.lock"));
        let mine = PathBuf::from(format!("{file}.{}", std::process::id()));
        let _ = std::fs::remove_file(&mine);
        let mut pid_file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&mine)
            .map_err(io_err)?;
        let linked = pid_file
            .write_all(std::process::id().to_string().as_bytes())
            .and_then(|()| {
                for _ in 0..2 {
                    match std::fs::hard_link(&mine, &lock) {
                        Ok(()) => return Ok(true),
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                            let holder = std::fs::read_to_string(&lock).unwrap_or_default();
                            let pid = holder.trim();
                            let alive =
                                !pid.is_empty() && Path::new(&format!("/proc/{pid}")).exists();
                            if alive {
                                return Ok(false);
                            }
                            let _ = std::fs::remove_file(&lock);
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(false)
            });
        let _ = std::fs::remove_file(&mine);
        match linked {
            Ok(true) => Ok(ShadowLock(lock)),
            Ok(false) => Err(SubidError::Busy {
                file: file.into(),
                pid: std::fs::read_to_string(&lock)
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            }),
            Err(e) => Err(io_err(e)),
        }
    }
}

impl Drop for ShadowLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(text: &str) -> Entries {
        Entries {
            file: SUBUID,
            text: text.to_owned(),
        }
    }

    #[test]
    fn finds_moat_and_ignores_other_and_malformed_lines() {
        let e = entries(
            "alice:100000:65536\n# comment\nbad line\nmoat-sandboxes:1879048192:65536\nmoat:1:1\n",
        );
        assert_eq!(
            e.ours().unwrap(),
            Some(IdRange::new(1879048192, 65536).unwrap())
        );
        assert_eq!(entries("alice:100000:65536\n").ours().unwrap(), None);
        assert!(matches!(
            entries("moat-sandboxes:0:65536\n").ours(),
            Err(SubidError::Entry { .. })
        ));
    }

    #[test]
    fn a_new_block_skips_every_other_entry() {
        let taken = entries("alice:1879048192:10\nbob:1879113728:65536\n");
        let range = choose(&taken, &entries("")).unwrap();
        assert_eq!(range.base, 1879048192 + 2 * 65536);
        assert_eq!(range.count, 65536);
        let in_gids = entries("carol:1879179264:1\n");
        assert_eq!(
            choose(&taken, &in_gids).unwrap().base,
            1879048192 + 3 * 65536
        );
    }
}
