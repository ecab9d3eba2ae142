//! Staged writes, kept out of the agent's namespace. A write's content goes
//! to an anonymous `O_TMPFILE` inode in its target's directory: it has no
//! name until the batch is published, so nothing the agent can list, read or
//! delete, and a shell killed meanwhile leaves nothing behind (the kernel
//! frees the inode). Publishing links the inode into place (`linkat`, which
//! also refuses an existing name: a write without `overwrite`). An overwrite
//! needs a rename, so the inode is first linked under an unguessable name in
//! this shell's private directory under the state directory, then renamed
//! onto the target. Only when that directory is on another mount is the
//! private name made in the target's directory instead, for the moment
//! between `linkat` and `renameat`.
//!
//! Where `O_TMPFILE` is unsupported, the content goes to a named file in the
//! private directory (same mount) or, failing that, under an unguessable
//! name in the target's directory. Nothing is ever removed from the agent's
//! namespace except such a file by the shell that made it.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{
    AtFlags, CWD, FileType, FlockOperation, Mode, OFlags, RenameFlags, ResolveFlags, StatxFlags,
};
use rustix::io::Errno;

/// This shell's private directory: `STATE/staging/<random>`, locked
/// (`flock`) for as long as the shell lives.
pub(crate) struct Staging {
    dir: OwnedFd,
    /// (device, mount id): a rename from here works only within one mount.
    mount: Option<(u32, u32, u64)>,
    secret: String,
    next: AtomicU64,
}

fn mount_of(fd: &OwnedFd) -> Option<(u32, u32, u64)> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID).ok()?;
    if st.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
        // Older than Linux 5.8: the mount is unknown, so never "the same".
        return None;
    }
    Some((st.stx_dev_major, st.stx_dev_minor, st.stx_mnt_id))
}

fn open_dir(at: impl AsFd, name: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
}

impl Staging {
    /// Creates this shell's directory under `parent`, after removing those
    /// of shells that are gone (their lock is free). The parent's own lock
    /// makes this exclusive, so no shell ever sees another's directory
    /// before it is locked.
    pub fn open(parent: &Path) -> std::io::Result<Self> {
        Self::create(parent).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("staging directory under {}: {e}", parent.display()),
            )
        })
    }

    fn create(parent: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        if let Some(state) = parent.parent() {
            std::fs::create_dir_all(state)?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(parent) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            created => created?,
        }
        let parent = rustix::fs::open(
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        rustix::fs::flock(&parent, FlockOperation::LockExclusive)?;
        remove_abandoned(&parent);
        let secret = moat_core::hash::sha256_hex(&moat_core::random::bytes::<16>());
        let name = format!("{}-{}", std::process::id(), &secret[..16]);
        rustix::fs::mkdirat(&parent, name.as_str(), Mode::from_raw_mode(0o700))?;
        let dir = open_dir(&parent, &name)?;
        rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive)?;
        rustix::fs::flock(&parent, FlockOperation::Unlock)?;
        Ok(Staging {
            mount: mount_of(&dir),
            dir,
            secret,
            next: AtomicU64::new(0),
        })
    }

    /// A name no one can guess (the shell's secret and a counter, hashed).
    fn private_name(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let hash = moat_core::hash::sha256_hex(format!("{}:{n}", self.secret).as_bytes());
        format!(".moat-{}.tmp", &hash[..32])
    }
}

/// Removes the directories (and the files in them, all private names) of
/// shells whose lock is free. Best effort: what stays is retried next time.
fn remove_abandoned(parent: &OwnedFd) {
    let Ok(entries) = rustix::fs::Dir::read_from(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let Ok(dir) = open_dir(parent, &name) else {
            continue;
        };
        if rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        if let Ok(files) = rustix::fs::Dir::read_from(&dir) {
            for file in files.flatten() {
                if file.file_type() == FileType::RegularFile {
                    let _ = rustix::fs::unlinkat(&dir, file.file_name(), AtFlags::empty());
                }
            }
        }
        let _ = rustix::fs::unlinkat(parent, name.as_str(), AtFlags::REMOVEDIR);
    }
}

/// Where a write's content waits for its batch to be published.
enum Content {
    /// An `O_TMPFILE` inode in the target's directory.
    Anonymous(OwnedFd),
    /// A named file (no `O_TMPFILE`): in the private directory, or else in
    /// the target's directory.
    Named { in_staging: bool, name: String },
}

/// A write whose content is staged, not yet visible at its target.
pub struct Staged {
    target: Target,
    content: Content,
    staging: Arc<Staging>,
}

/// Links an open inode (an `O_TMPFILE` one) at `dir/name`, failing if the
/// name exists. `AT_EMPTY_PATH` needs CAP_DAC_READ_SEARCH before Linux
/// 6.10; `/proc/self/fd` does not.
fn link(fd: &OwnedFd, dir: &OwnedFd, name: &str) -> rustix::io::Result<()> {
    match rustix::fs::linkat(fd, "", dir, name, AtFlags::EMPTY_PATH) {
        Err(Errno::NOENT) => {
            let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
            rustix::fs::linkat(CWD, proc_path.as_str(), dir, name, AtFlags::SYMLINK_FOLLOW)
        }
        other => other,
    }
}

/// What a staged write will do when published.
pub(super) struct Target {
    /// The directory of the target, open for real (linkat, renameat, fsync).
    pub dir: OwnedFd,
    pub name: String,
    pub overwrite: bool,
    /// The target existed when the write was staged.
    pub replace: bool,
    /// (device, inode of the directory, name): what the write will replace.
    pub key: (u64, u64, String),
    pub path: String,
}

impl Staged {
    /// Writes `bytes` where they wait for publishing (see the module's
    /// comment). `anonymous` is false only to exercise the fallback in tests.
    pub(super) fn write(
        target: Target,
        bytes: &[u8],
        staging: &Arc<Staging>,
        anonymous: bool,
    ) -> std::io::Result<Self> {
        let opened = if anonymous {
            rustix::fs::openat(
                &target.dir,
                ".",
                OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
        } else {
            Err(Errno::OPNOTSUPP)
        };
        let content = match opened {
            Ok(fd) => {
                let mut file = std::fs::File::from(fd);
                file.write_all(bytes)?;
                Content::Anonymous(OwnedFd::from(file))
            }
            // Not supported by this filesystem (EISDIR: a kernel before 3.11).
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                Self::write_named(&target.dir, bytes, staging)?
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Staged {
            target,
            content,
            staging: Arc::clone(staging),
        })
    }

    fn write_named(dir: &OwnedFd, bytes: &[u8], staging: &Staging) -> std::io::Result<Content> {
        let in_staging = staging.mount.is_some() && mount_of(dir) == staging.mount;
        let place = if in_staging { &staging.dir } else { dir };
        let name = staging.private_name();
        let written = (|| -> std::io::Result<()> {
            let fd = rustix::fs::openat(
                place,
                name.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )?;
            std::fs::File::from(fd).write_all(bytes)
        })();
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(place, name.as_str(), AtFlags::empty());
            return Err(e);
        }
        Ok(Content::Named { in_staging, name })
    }

    /// (device, inode of the directory, name): what the write will replace.
    pub(super) fn key(&self) -> &(u64, u64, String) {
        &self.target.key
    }

    fn place(&self, in_staging: bool) -> &OwnedFd {
        if in_staging {
            &self.staging.dir
        } else {
            &self.target.dir
        }
    }

    /// Puts the (already synced) content at its target.
    pub fn publish(&self) -> std::io::Result<()> {
        let published = match &self.content {
            Content::Anonymous(fd) => self.publish_anonymous(fd),
            Content::Named { in_staging, name } => {
                let flags = if self.target.overwrite {
                    RenameFlags::empty()
                } else {
                    RenameFlags::NOREPLACE
                };
                let place = self.place(*in_staging);
                let renamed = rustix::fs::renameat_with(
                    place,
                    name.as_str(),
                    &self.target.dir,
                    self.target.name.as_str(),
                    flags,
                );
                if renamed.is_err() {
                    let _ = rustix::fs::unlinkat(place, name.as_str(), AtFlags::empty());
                }
                renamed
            }
        };
        published.map_err(|e| {
            if e == Errno::EXIST {
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{}: appeared meanwhile", self.target.path),
                )
            } else {
                e.into()
            }
        })
    }

    fn publish_anonymous(&self, fd: &OwnedFd) -> rustix::io::Result<()> {
        // Without overwrite, never anything but linkat (which cannot replace).
        if !(self.target.overwrite && self.target.replace) {
            match link(fd, &self.target.dir, &self.target.name) {
                Err(Errno::EXIST) if self.target.overwrite => {}
                done => return done,
            }
        }
        // linkat never replaces: link under a private name, rename over.
        let private = self.staging.private_name();
        let in_staging = match link(fd, &self.staging.dir, &private) {
            Ok(()) => true,
            Err(Errno::XDEV) => {
                link(fd, &self.target.dir, &private)?;
                false
            }
            Err(e) => return Err(e),
        };
        let place = self.place(in_staging);
        let renamed = rustix::fs::renameat(
            place,
            private.as_str(),
            &self.target.dir,
            self.target.name.as_str(),
        );
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(place, private.as_str(), AtFlags::empty());
        }
        renamed
    }

    /// Drops the staged content (the write will not happen).
    pub fn abandon(&self) {
        if let Content::Named { in_staging, name } = &self.content {
            let _ = rustix::fs::unlinkat(self.place(*in_staging), name.as_str(), AtFlags::empty());
        }
    }

    /// The directory the target lives in (to fsync after publishing).
    pub fn directory(&self) -> (&OwnedFd, (u64, u64)) {
        (&self.target.dir, (self.target.key.0, self.target.key.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn target(dir: &Path, name: &str, overwrite: bool) -> Target {
        let fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        Target {
            dir: fd,
            name: name.into(),
            overwrite,
            replace: dir.join(name).exists(),
            key: (0, 0, name.into()),
            path: name.into(),
        }
    }

    /// Stages and publishes `content` at `dir/name`, checking that nothing
    /// appears in `dir` before publishing; returns the staged write's names
    /// in `dir` while it was in flight.
    fn write(dir: &Path, staging: &Arc<Staging>, anonymous: bool, content: &str) -> Vec<String> {
        let before = names(dir);
        let staged = Staged::write(
            target(dir, "t.txt", true),
            content.as_bytes(),
            staging,
            anonymous,
        )
        .unwrap();
        let in_flight = names(dir);
        staged.publish().unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("t.txt")).unwrap(), content);
        assert_eq!(names(dir), vec!["t.txt"]);
        in_flight
            .into_iter()
            .filter(|n| !before.contains(n))
            .collect()
    }

    fn staging_dir(parent: &Path) -> PathBuf {
        let dirs = names(parent);
        assert_eq!(dirs.len(), 1, "{dirs:?}");
        parent.join(&dirs[0])
    }

    use std::path::PathBuf;

    #[test]
    fn staged_content_has_no_name_in_the_targets_directory_on_one_mount() {
        let tmp = tempfile::tempdir().unwrap();
        let (out, parent) = (tmp.path().join("out"), tmp.path().join("staging"));
        std::fs::create_dir(&out).unwrap();
        let staging = Arc::new(Staging::open(&parent).unwrap());
        for anonymous in [true, false] {
            // Created, then replaced (linkat, then linkat + rename).
            std::fs::remove_file(out.join("t.txt")).ok();
            for round in 0..2 {
                let seen = write(&out, &staging, anonymous, &format!("{anonymous} {round}"));
                assert!(seen.is_empty(), "anonymous {anonymous}: {seen:?}");
            }
            assert!(names(&staging_dir(&parent)).is_empty());
        }
        // Without overwrite, an existing target is refused at publishing.
        let staged = Staged::write(target(&out, "t.txt", false), b"x", &staging, true).unwrap();
        let err = staged.publish().unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(
            std::fs::read_to_string(out.join("t.txt")).unwrap(),
            "false 1"
        );
    }

    #[test]
    fn with_the_state_on_another_mount_writes_still_land_whole() {
        // /dev/shm is a tmpfs; the test's temporary directory must be elsewhere.
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let staging = Arc::new(Staging::open(&shm.path().join("staging")).unwrap());
        let out_fd = rustix::fs::open(tmp.path(), OFlags::PATH, Mode::empty()).unwrap();
        assert_ne!(
            mount_of(&staging.dir),
            mount_of(&out_fd),
            "this test needs /dev/shm and {} on different mounts",
            std::env::temp_dir().display()
        );
        for round in 0..2 {
            let seen = write(tmp.path(), &staging, true, &format!("a{round}"));
            assert!(seen.is_empty(), "{seen:?}");
        }
        // The named fallback: a private name in the target's directory.
        let seen = write(tmp.path(), &staging, false, "named");
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].starts_with(".moat-") && seen[0].len() > 40,
            "{seen:?}"
        );
    }

    #[test]
    fn only_directories_of_shells_that_are_gone_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("staging");
        let gone = Staging::open(&parent).unwrap();
        let gone_dir = staging_dir(&parent);
        std::fs::write(gone_dir.join(".moat-left.tmp"), "x").unwrap();
        drop(gone);
        let alive = Staging::open(&parent).unwrap();
        assert!(!gone_dir.exists());
        let alive_dir = staging_dir(&parent);
        let second = Staging::open(&parent).unwrap();
        assert!(alive_dir.exists());
        assert_eq!(names(&parent).len(), 2);
        drop((alive, second));
    }
}
