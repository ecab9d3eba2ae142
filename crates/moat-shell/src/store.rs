//! The artifact store: files named by their SHA-256 under the state
//! directory, written atomically, never modified.

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

    pub fn path_of(&self, sha256: &str) -> PathBuf {
        let prefix = sha256.get(..2).unwrap_or("00");
        self.root.join(prefix).join(sha256)
    }

    /// Stores `bytes`; returns their SHA-256. Storing the same content twice
    /// is a no-op.
    pub fn put(&self, bytes: &[u8]) -> std::io::Result<String> {
        let sha256 = moat_core::hash::sha256_hex(bytes);
        let path = self.path_of(&sha256);
        if path.exists() {
            return Ok(sha256);
        }
        let dir = path.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{sha256}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map(|()| sha256)
    }
}
