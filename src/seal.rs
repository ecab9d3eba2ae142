//! Sealed runners: the `moat` binary with a signed manifest appended.
//!
//! Layout: `BINARY | MANIFEST JSON | length (u64 little-endian) | "MOATSEAL"`.
//! The kernel loads an ELF by its program headers and ignores the appended
//! bytes, so the sealed file runs as `moat` does. Its identity is the SHA-256
//! of the whole file: the binary and the manifest it may act under.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{Context, bail};
use moat_core::SignedManifest;

const MAGIC: &[u8; 8] = b"MOATSEAL";
/// A signed manifest larger than this is refused.
const MAX_MANIFEST: u64 = 1 << 20;

/// The sealed manifest of `path`, or `None` if the file is not sealed.
pub fn read_trailer(path: &Path) -> anyhow::Result<Option<(SignedManifest, Vec<u8>)>> {
    let mut file = File::open(path).with_context(|| format!("{}", path.display()))?;
    let size = file.metadata()?.len();
    if size < 16 {
        return Ok(None);
    }
    file.seek(SeekFrom::End(-16))?;
    let mut tail = [0u8; 16];
    file.read_exact(&mut tail)?;
    if &tail[8..] != MAGIC {
        return Ok(None);
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&tail[..8]);
    let len = u64::from_le_bytes(len);
    if len > MAX_MANIFEST || len + 16 > size {
        bail!(
            "{}: the sealed manifest's length is out of range",
            path.display()
        );
    }
    file.seek(SeekFrom::End(-16 - len as i64))?;
    let mut bytes = vec![0u8; len as usize];
    file.read_exact(&mut bytes)?;
    let signed: SignedManifest = serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: the sealed manifest", path.display()))?;
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
pub fn file_sha256(path: &Path) -> anyhow::Result<String> {
    let mut file = File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut hash = moat_core::hash::Sha256Stream::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(hash.finish())
}
