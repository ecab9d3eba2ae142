//! Restoring a snapshot into an empty directory, every chunk checked
//! against its name before it is written.
//!
//! The snapshot was checked first ([`Snapshot::check`]): each entry's
//! parent is a directory listed before it. Parents are opened one name at
//! a time without following links, and every entry is created new
//! (`O_EXCL`, `mkdirat`, `symlinkat`), so nothing is written outside the
//! directory, whatever the snapshot says. Links are restored as written,
//! absolute or not: whoever later works in the area by path must not follow
//! them. Every chunk is known to be in the store before anything is
//! written; a restore that still fails part way (a chunk corrupt or lost
//! meanwhile) leaves the directory and the tracker to be thrown away.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

use moat_core::ids::Sha256;
use rustix::fs::{Mode, OFlags};

use crate::error::VolumeError;
use crate::model::{EntryKind, MODE_BITS, Snapshot};
use crate::store::{self, ChunkStore};
use crate::take::Tracker;

/// What a restore wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub id: Sha256,
    pub files: usize,
    pub bytes: u64,
}

impl Tracker {
    /// Restores the stored snapshot `id` into `into`, an existing empty
    /// directory, and remembers what it wrote (the next snapshot reads
    /// none of it again).
    pub fn restore(
        &mut self,
        store: &dyn ChunkStore,
        id: &Sha256,
        into: &Path,
    ) -> Result<Restored, VolumeError> {
        let snapshot = store::get_snapshot(store, id)?;
        self.restore_snapshot(store, &snapshot, into)
    }

    /// [`Tracker::restore`] of a snapshot already read (and checked).
    pub fn restore_snapshot(
        &mut self,
        store: &dyn ChunkStore,
        snapshot: &Snapshot,
        into: &Path,
    ) -> Result<Restored, VolumeError> {
        snapshot.check()?;
        let shown = into.display().to_string();
        let root = rustix::fs::open(
            into,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| VolumeError::io(shown.clone(), e))?;
        let mut listing =
            rustix::fs::Dir::read_from(&root).map_err(|e| VolumeError::io(shown.clone(), e))?;
        let occupied = listing.any(|e| {
            e.map_or(true, |e| {
                let name = e.file_name().to_bytes();
                name != b"." && name != b".."
            })
        });
        if occupied {
            return Err(VolumeError::NotEmpty(shown));
        }
        // Every chunk is asked for before anything is written: a snapshot
        // the store cannot restore whole leaves the directory empty.
        if let Some(absent) = store.missing(&snapshot.chunks())?.first() {
            return Err(VolumeError::Missing(absent.sha256.to_string()));
        }
        let mut restored = Restored {
            id: snapshot.id()?,
            files: 0,
            bytes: 0,
        };
        // The last parent opened (entries come in order, so most share it).
        let mut last: Option<(String, OwnedFd)> = None;
        // Directories get their modes last: one without write permission
        // must still be filled first.
        let mut dir_modes: Vec<(String, u32)> = Vec::new();
        for entry in &snapshot.entries {
            let path = entry.path.as_str();
            let io = |e: rustix::io::Errno| VolumeError::io(format!("{path:?}"), e);
            let (parent_path, name) = path.rsplit_once('/').unwrap_or(("", path));
            if !parent_path.is_empty() && last.as_ref().is_none_or(|(p, _)| p != parent_path) {
                last = Some((parent_path.to_owned(), open_dir(&root, parent_path)?));
            }
            let parent = match &last {
                Some((_, fd)) if !parent_path.is_empty() => fd,
                _ => &root,
            };
            match &entry.kind {
                EntryKind::Dir { mode } => {
                    rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)).map_err(io)?;
                    dir_modes.push((path.to_owned(), *mode));
                }
                EntryKind::Symlink { target } => {
                    rustix::fs::symlinkat(target.as_str(), parent, name).map_err(io)?;
                }
                EntryKind::File { size, mode, chunks } => {
                    let fd = rustix::fs::openat(
                        parent,
                        name,
                        OFlags::WRONLY
                            | OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o600),
                    )
                    .map_err(io)?;
                    let mut file = std::fs::File::from(fd);
                    for chunk in chunks {
                        let bytes = store::get_checked(store, chunk)?;
                        file.write_all(&bytes)
                            .map_err(|e| VolumeError::io(format!("{path:?}"), e))?;
                    }
                    rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & MODE_BITS)).map_err(io)?;
                    let stat = rustix::fs::fstat(&file).map_err(io)?;
                    self.remember(path, &stat, chunks.clone());
                    restored.files += 1;
                    restored.bytes += size;
                }
            }
        }
        drop(last);
        // Deepest first, so a parent made read-only does not stop its children.
        for (path, mode) in dir_modes.iter().rev() {
            let dir = open_dir(&root, path)?;
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode & MODE_BITS))
                .map_err(|e| VolumeError::io(format!("{path:?}"), e))?;
        }
        self.restored(restored.id.clone());
        Ok(restored)
    }
}

/// The directory `path` beneath `root`, opened one name at a time without
/// following a link.
fn open_dir(root: &OwnedFd, path: &str) -> Result<OwnedFd, VolumeError> {
    let mut dir: Option<OwnedFd> = None;
    for name in path.split('/') {
        let at = dir.as_ref().unwrap_or(root);
        let next = rustix::fs::openat(
            at,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| VolumeError::io(path.to_owned(), e))?;
        dir = Some(next);
    }
    dir.ok_or_else(|| VolumeError::Invalid(format!("{path}: an empty directory path")))
}
