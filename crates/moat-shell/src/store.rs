//! The artifact store: files named by their SHA-256 under the state
//! directory, written atomically, never modified. Puts are made durable in
//! batches by [`ArtifactStore::sync`] before any result that names them.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A content-addressed store rooted at `<state>/artifacts`.
pub struct ArtifactStore {
    root: PathBuf,
}

impl ArtifactStore {
    pub fn open(state: &Path) -> std::io::Result<Self> {
        let root = state.join("artifacts");
        std::fs::create_dir_all(&root)?;
        Ok(ArtifactStore { root })
    }

    /// Makes every put so far durable (one `syncfs` for a batch), unless
    /// its filesystem is among `already_synced` (devices).
    pub fn sync(&self, already_synced: &[u64]) -> std::io::Result<()> {
        let dir = std::fs::File::open(&self.root)?;
        let device = rustix::fs::fstat(&dir)?.st_dev;
        if !already_synced.contains(&device) {
            rustix::fs::syncfs(&dir)?;
        }
        Ok(())
    }

    pub fn path_of(&self, sha256: &str) -> PathBuf {
        let prefix = sha256.get(..2).unwrap_or("00");
        self.root.join(prefix).join(sha256)
    }

    /// Stores `bytes`; returns their SHA-256. Storing the same content twice
    /// is a no-op.
    pub fn put(&self, bytes: &[u8]) -> std::io::Result<String> {
        let sha256 = moat_core::hash::sha256_hex(bytes);
        let path = self.path_of(&sha256);
        // An entry left short by a crash before its batch was synced is
        // rewritten; a complete one is content-addressed and stays.
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
            return Ok(sha256);
        }
        let dir = path.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{sha256}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            std::fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map(|()| sha256)
    }
}
