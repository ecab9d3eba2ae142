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

/// A stored snapshot, checked: its bytes hash to `id` and it can be
/// restored safely.
pub fn get_snapshot(store: &dyn ChunkStore, id: &Sha256) -> Result<Snapshot, VolumeError> {
    let bytes = store.get_snapshot(id)?;
    let snapshot = Snapshot::parse(&bytes)?;
    let actual = snapshot.id()?;
    if &actual != id {
        return Err(VolumeError::Corrupt {
            sha256: id.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(snapshot)
}

/// A store in a local directory: `chunks/ab/abcd…` and `snapshots/abcd…`,
/// each written to a temporary name and renamed into place; chunks are made
/// durable together (one `syncfs`) before a snapshot naming them is
/// written, and a snapshot itself is synced with its directory.
#[derive(Debug, Clone)]
pub struct DirStore {
    root: PathBuf,
}

impl DirStore {
    /// Opens (making it if needed, mode 0700) a store at `root`.
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
        Ok(DirStore {
            root: root.to_path_buf(),
        })
    }

    fn chunk_path(&self, sha256: &Sha256) -> PathBuf {
        let hex = sha256.as_str();
        self.root.join("chunks").join(&hex[..2]).join(hex)
    }

    fn snapshot_path(&self, id: &Sha256) -> PathBuf {
        self.root.join("snapshots").join(id.as_str())
    }

    /// Writes `bytes` at `path` unless it is there already; with `durable`,
    /// synced with its directory before this returns.
    fn write_once(&self, path: &Path, bytes: &[u8], durable: bool) -> Result<(), VolumeError> {
        let shown = || path.display().to_string();
        if path.exists() {
            return Ok(());
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| VolumeError::io(shown(), e))?;
        }
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
            std::fs::rename(&temp, path)?;
            if let Some(parent) = path.parent().filter(|_| durable) {
                std::fs::File::open(parent)?.sync_all()?;
            }
            Ok::<(), std::io::Error>(())
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written.map_err(|e| VolumeError::io(shown(), e))
    }

    fn read(
        &self,
        path: &Path,
        missing: impl FnOnce() -> VolumeError,
    ) -> Result<Vec<u8>, VolumeError> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(missing()),
            Err(e) => Err(VolumeError::io(path.display().to_string(), e)),
        }
    }
}

impl ChunkStore for DirStore {
    fn missing(&self, chunks: &[&ChunkRef]) -> Result<Vec<ChunkRef>, VolumeError> {
        Ok(chunks
            .iter()
            .filter(|c| !self.chunk_path(&c.sha256).exists())
            .map(|c| (*c).clone())
            .collect())
    }

    fn put(&self, chunk: &ChunkRef, bytes: &[u8]) -> Result<(), VolumeError> {
        self.write_once(&self.chunk_path(&chunk.sha256), bytes, false)
    }

    fn sync(&self) -> Result<(), VolumeError> {
        let shown = || self.root.display().to_string();
        let dir = std::fs::File::open(&self.root).map_err(|e| VolumeError::io(shown(), e))?;
        rustix::fs::syncfs(&dir).map_err(|e| VolumeError::io(shown(), e))
    }

    fn get(&self, chunk: &ChunkRef) -> Result<Vec<u8>, VolumeError> {
        self.read(&self.chunk_path(&chunk.sha256), || {
            VolumeError::Missing(chunk.sha256.to_string())
        })
    }

    fn put_snapshot(&self, id: &Sha256, bytes: &[u8]) -> Result<(), VolumeError> {
        self.write_once(&self.snapshot_path(id), bytes, true)
    }

    fn get_snapshot(&self, id: &Sha256) -> Result<Vec<u8>, VolumeError> {
        self.read(&self.snapshot_path(id), || {
            VolumeError::Missing(id.to_string())
        })
    }
}
