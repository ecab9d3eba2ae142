//! Where chunks and snapshots are kept: a content-addressed store. A
//! chunk is put once whatever number of snapshots name it; what comes back
//! is checked against its name before anyone uses it.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use moat_core::ids::Sha256;

use crate::chunking::sha256;
use crate::error::VolumeError;
use crate::model::{ChunkRef, Snapshot};

/// A content-addressed store of chunks and snapshots.
pub trait ChunkStore {
    /// Those of `chunks` the store does not hold yet.
    fn missing(&self, chunks: &[&ChunkRef]) -> Result<Vec<ChunkRef>, VolumeError>;
    /// Stores a chunk (its name was computed from `bytes`); durable once
    /// [`ChunkStore::sync`] returns.
    fn put(&self, chunk: &ChunkRef, bytes: &[u8]) -> Result<(), VolumeError>;
    /// Makes every chunk put so far durable.
    fn sync(&self) -> Result<(), VolumeError>;
    /// A chunk's bytes, as stored (checked by [`get_checked`]).
    fn get(&self, chunk: &ChunkRef) -> Result<Vec<u8>, VolumeError>;
    /// Stores a snapshot durably, by its id.
    fn put_snapshot(&self, id: &Sha256, bytes: &[u8]) -> Result<(), VolumeError>;
    /// A snapshot's bytes, as stored.
    fn get_snapshot(&self, id: &Sha256) -> Result<Vec<u8>, VolumeError>;
}

/// A chunk's bytes, refused unless they are the chunk named.
pub fn get_checked(store: &dyn ChunkStore, chunk: &ChunkRef) -> Result<Vec<u8>, VolumeError> {
    let bytes = store.get(chunk)?;
    let actual = sha256(&bytes);
    if actual != chunk.sha256 || bytes.len() != chunk.len as usize {
        return Err(VolumeError::Corrupt {
            sha256: chunk.sha256.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(bytes)
}

/// Stores a snapshot, once every chunk it names is durable, and returns
/// its id.
pub fn put_snapshot(store: &dyn ChunkStore, snapshot: &Snapshot) -> Result<Sha256, VolumeError> {
    store.sync()?;
    let id = snapshot.id()?;
    let bytes = moat_core::hash::canonical_json(snapshot)
        .map_err(|e| VolumeError::Invalid(format!("the snapshot does not serialize: {e}")))?;
    store.put_snapshot(&id, &bytes)?;
    Ok(id)
}

/// Largest snapshot document read back (a million entries of a few
/// hundred bytes each fit).
pub const MAX_SNAPSHOT_BYTES: u64 = 512 << 20;

/// A stored snapshot, checked: its bytes hash to `id` (they are the
/// canonical JSON it was named by) and it can be restored safely.
pub fn get_snapshot(store: &dyn ChunkStore, id: &Sha256) -> Result<Snapshot, VolumeError> {
    let bytes = store.get_snapshot(id)?;
    let actual = sha256(&bytes);
    if &actual != id {
        return Err(VolumeError::Corrupt {
            sha256: id.to_string(),
            actual: actual.to_string(),
        });
    }
    Snapshot::parse(&bytes)
}

/// A store in a local directory: `chunks/ab/abcd…` and `snapshots/abcd…`.
///
/// A chunk is written under `tmp/` and only renamed into place by
/// [`ChunkStore::sync`], after one `syncfs` made every staged chunk
/// durable (and a second made the renames durable): a chunk's name is never
/// seen with less than its bytes, even after a crash. A file at a chunk's
/// name whose size is not the chunk's counts as missing and is replaced. A
/// snapshot is written and synced with its directory on its own.
#[derive(Debug)]
pub struct DirStore {
    root: PathBuf,
    /// Held open for `syncfs`: a writeback error is reported to a
    /// descriptor that was open when it happened, not to one opened later.
    root_fd: std::fs::File,
    /// Chunks written under `tmp/` and not yet in place: (temporary, final).
    staged: std::sync::Mutex<Staged>,
}

/// Chunks written under `tmp/` and not yet in place: (temporary, final).
type Staged = std::collections::HashMap<Sha256, (PathBuf, PathBuf)>;

impl DirStore {
    /// Opens (making it if needed, mode 0700) a store at `root`; what an
    /// interrupted writer left in `tmp/` is removed.
    pub fn open(root: &Path) -> Result<DirStore, VolumeError> {
        for dir in [
            root.to_path_buf(),
            root.join("chunks"),
            root.join("snapshots"),
            root.join("tmp"),
        ] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| VolumeError::io(dir.display().to_string(), e))?;
        }
        let tmp = root.join("tmp");
        let leftovers =
            std::fs::read_dir(&tmp).map_err(|e| VolumeError::io(tmp.display().to_string(), e))?;
        for entry in leftovers.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        let root_fd = std::fs::File::open(root)
            .map_err(|e| VolumeError::io(root.display().to_string(), e))?;
        Ok(DirStore {
            root: root.to_path_buf(),
            root_fd,
            staged: std::sync::Mutex::new(std::collections::HashMap::new()),
        })
    }

    fn chunk_path(&self, sha256: &Sha256) -> PathBuf {
        let hex = sha256.as_str();
        self.root.join("chunks").join(&hex[..2]).join(hex)
    }

    fn snapshot_path(&self, id: &Sha256) -> PathBuf {
        self.root.join("snapshots").join(id.as_str())
    }

    fn staged(&self) -> Result<std::sync::MutexGuard<'_, Staged>, VolumeError> {
        self.staged
            .lock()
            .map_err(|_| VolumeError::Store("a writer panicked".into()))
    }

    /// Whether the chunk is in place with its whole length.
    fn in_place(&self, chunk: &ChunkRef) -> bool {
        std::fs::symlink_metadata(self.chunk_path(&chunk.sha256))
            .is_ok_and(|m| m.is_file() && m.len() == u64::from(chunk.len))
    }

    /// A new file under `tmp/` holding `bytes`; with `durable`, synced.
    fn write_temp(&self, bytes: &[u8], durable: bool) -> Result<PathBuf, VolumeError> {
        let temp = self
            .root
            .join("tmp")
            .join(format!("{}.part", moat_core::random::hex(12)));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)?;
            file.write_all(bytes)?;
            if durable {
                file.sync_all()?;
            }
            Ok::<(), std::io::Error>(())
        })();
        match written {
            Ok(()) => Ok(temp),
            Err(e) => {
                let _ = std::fs::remove_file(&temp);
                Err(VolumeError::io(temp.display().to_string(), e))
            }
        }
    }

    fn syncfs(&self) -> Result<(), VolumeError> {
        rustix::fs::syncfs(&self.root_fd)
            .map_err(|e| VolumeError::io(self.root.display().to_string(), e))
    }

    /// Reads at most `max` bytes of `path`; a longer file is corrupt.
    fn read(
        &self,
        path: &Path,
        max: u64,
        missing: impl FnOnce() -> VolumeError,
    ) -> Result<Vec<u8>, VolumeError> {
        let shown = || path.display().to_string();
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing()),
            Err(e) => return Err(VolumeError::io(shown(), e)),
        };
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, max + 1), &mut bytes)
            .map_err(|e| VolumeError::io(shown(), e))?;
        if bytes.len() as u64 > max {
            return Err(VolumeError::Store(format!(
                "{}: larger than {max} bytes",
                shown()
            )));
        }
        Ok(bytes)
    }
}

impl ChunkStore for DirStore {
    fn missing(&self, chunks: &[&ChunkRef]) -> Result<Vec<ChunkRef>, VolumeError> {
        let staged = self.staged()?;
        Ok(chunks
            .iter()
            .filter(|c| !staged.contains_key(&c.sha256) && !self.in_place(c))
            .map(|c| (*c).clone())
            .collect())
    }

    fn put(&self, chunk: &ChunkRef, bytes: &[u8]) -> Result<(), VolumeError> {
        if self.staged()?.contains_key(&chunk.sha256) || self.in_place(chunk) {
            return Ok(());
        }
        let temp = self.write_temp(bytes, false)?;
        let target = self.chunk_path(&chunk.sha256);
        self.staged()?.insert(chunk.sha256.clone(), (temp, target));
        Ok(())
    }

    fn sync(&self) -> Result<(), VolumeError> {
        let staged: Vec<(PathBuf, PathBuf)> = self.staged()?.values().cloned().collect();
        if staged.is_empty() {
            return Ok(());
        }
        // Every staged chunk's bytes on disk, then their names.
        self.syncfs()?;
        for (temp, target) in &staged {
            let shown = || target.display().to_string();
            if let Some(parent) = target.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)
                    .map_err(|e| VolumeError::io(shown(), e))?;
            }
            std::fs::rename(temp, target).map_err(|e| VolumeError::io(shown(), e))?;
        }
        self.syncfs()?;
        self.staged()?.clear();
        Ok(())
    }

    fn get(&self, chunk: &ChunkRef) -> Result<Vec<u8>, VolumeError> {
        self.read(
            &self.chunk_path(&chunk.sha256),
            u64::from(chunk.len),
            || VolumeError::Missing(chunk.sha256.to_string()),
        )
    }

    fn put_snapshot(&self, id: &Sha256, bytes: &[u8]) -> Result<(), VolumeError> {
        let target = self.snapshot_path(id);
        if target.exists() {
            return Ok(());
        }
        let shown = || target.display().to_string();
        let temp = self.write_temp(bytes, true)?;
        std::fs::rename(&temp, &target).map_err(|e| VolumeError::io(shown(), e))?;
        let dir = target.parent().unwrap_or(&self.root);
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| VolumeError::io(shown(), e))
    }

    fn get_snapshot(&self, id: &Sha256) -> Result<Vec<u8>, VolumeError> {
        self.read(&self.snapshot_path(id), MAX_SNAPSHOT_BYTES, || {
            VolumeError::Missing(id.to_string())
        })
    }
}
