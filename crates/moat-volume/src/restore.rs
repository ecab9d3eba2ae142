//! Restoring a snapshot into an empty directory, every chunk checked
//! against its name before it is written.
//!
//! The snapshot was checked first ([`Snapshot::check`]): each entry's
//! parent is a directory listed before it. Parents are opened one name at
//! a time without following links, and every entry is created new
//! (`O_EXCL`, `mkdirat`, `symlinkat`), so nothing is written outside the
//! directory, whatever the snapshot says.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

use moat_core::ids::Sha256;
use rustix::fs::{Mode, OFlags};

use crate::error::VolumeError;
use crate::model::{EntryKind, Snapshot};
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
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
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
        let mut restored = Restored {
            id: snapshot.id()?,
            files: 0,
            bytes: 0,
        };
        for entry in &snapshot.entries {
            let path = entry.path.as_str();
            let io = |e: rustix::io::Errno| VolumeError::io(path.to_owned(), e);
            let (parent, name) = match path.rsplit_once('/') {
                Some((parent, name)) => (Some(open_dir(&root, parent)?), name),
                None => (None, path),
            };
            let parent = parent.as_ref().unwrap_or(&root);
            match &entry.kind {
                EntryKind::Dir => {
                    rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)).map_err(io)?;
                }
                EntryKind::Symlink { target } => {
                    rustix::fs::symlinkat(target.as_str(), parent, name).map_err(io)?;
                }
                EntryKind::File {
                    size,
                    executable,
                    chunks,
                } => {
                    let mode = if *executable { 0o755 } else { 0o644 };
                    let fd = rustix::fs::openat(
                        parent,
                        name,
                        OFlags::WRONLY
                            | OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(mode),
                    )
                    .map_err(io)?;
                    let mut file = std::fs::File::from(fd);
                    for chunk in chunks {
                        let bytes = store::get_checked(store, chunk)?;
                        file.write_all(&bytes)
                            .map_err(|e| VolumeError::io(path.to_owned(), e))?;
                    }
                    // The umask may have cut the mode asked for.
                    rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(io)?;
                    let stat = rustix::fs::fstat(&file).map_err(io)?;
                    self.remember(path, &stat, chunks.clone());
                    restored.files += 1;
                    restored.bytes += size;
                }
            }
        }
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
