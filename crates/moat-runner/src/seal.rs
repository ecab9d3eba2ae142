//! Sealed runners: the `moat` binary with a signed manifest appended.
//!
//! Layout: `BINARY | MANIFEST JSON | length (u64 little-endian) | "MOATSEAL"`.
//! The kernel loads an ELF by its program headers and ignores the appended
//! bytes, so the sealed file runs as `moat` does. Its identity is the SHA-256
//! of the whole file: the binary and the manifest it may act under.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use moat_core::SignedManifest;

const MAGIC: &[u8; 8] = b"MOATSEAL";
/// A signed manifest larger than this is refused.
const MAX_MANIFEST: u64 = 1 << 20;

/// Errors reading a sealed runner.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}: the sealed manifest's length is out of range")]
    Length(String),
    #[error("{path}: the sealed manifest: {message}")]
    Manifest { path: String, message: String },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> SealError + '_ {
    move |source| SealError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The sealed manifest of `path` and its bytes, or `None` if the file is
/// not sealed.
pub fn read_trailer(path: &Path) -> Result<Option<(SignedManifest, Vec<u8>)>, SealError> {
    let mut file = File::open(path).map_err(io(path))?;
    let size = file.metadata().map_err(io(path))?.len();
    if size < 16 {
        return Ok(None);
    }
    file.seek(SeekFrom::End(-16)).map_err(io(path))?;
    let mut tail = [0u8; 16];
    file.read_exact(&mut tail).map_err(io(path))?;
    if &tail[8..] != MAGIC {
        return Ok(None);
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&tail[..8]);
    let len = u64::from_le_bytes(len);
    if len > MAX_MANIFEST || len + 16 > size {
        return Err(SealError::Length(path.display().to_string()));
    }
    // Both bounded by MAX_MANIFEST above.
    file.seek(SeekFrom::End(-16 - len as i64))
        .map_err(io(path))?;
    let mut bytes = vec![0u8; len as usize];
    file.read_exact(&mut bytes).map_err(io(path))?;
    let signed: SignedManifest =
        serde_json::from_slice(&bytes).map_err(|e| SealError::Manifest {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
    Ok(Some((signed, bytes)))
}

/// The trailer for `manifest` (its bytes as given, length, magic).
pub fn trailer(manifest: &[u8]) -> Vec<u8> {
    let mut out = manifest.to_vec();
    out.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
    out.extend_from_slice(MAGIC);
    out
}

/// SHA-256 of a whole file, hex.
pub fn file_sha256(path: &Path) -> Result<String, SealError> {
    let mut file = File::open(path).map_err(io(path))?;
    let mut hash = moat_core::hash::Sha256Stream::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(hash.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsealed_or_short_file_has_no_trailer_and_a_bad_length_is_refused()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"\x7fELF and nothing appended")?;
        assert!(read_trailer(&plain)?.is_none());
        let short = dir.path().join("short");
        std::fs::write(&short, b"tiny")?;
        assert!(read_trailer(&short)?.is_none());
        let lying = dir.path().join("lying");
        let mut bytes = b"binary".to_vec();
        bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
        bytes.extend_from_slice(MAGIC);
        std::fs::write(&lying, bytes)?;
        assert!(matches!(read_trailer(&lying), Err(SealError::Length(_))));
        Ok(())
    }
}
