//! A snapshot: what a persistent area held at one moment, as a list of
//! entries whose files are lists of content-addressed chunks. The snapshot
//! itself is named by the SHA-256 of its canonical JSON, so a run's record
//! can name what it started from and ended with by one hash.

use std::collections::HashSet;

use moat_core::ids::{RelPath, Sha256};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::VolumeError;

/// The snapshot format's version.
pub const FORMAT: u32 = 1;

/// Most entries one snapshot holds.
pub const MAX_ENTRIES: usize = 1_000_000;

/// Most bytes of file content one snapshot holds: what a restore writes
/// (a sparse file or a file linked many times counts in full).
pub const MAX_AREA_BYTES: u64 = 64 << 30;

/// Deepest nesting of directories.
pub const MAX_DEPTH: usize = 64;

/// The permission bits kept (never set-id or sticky bits).
pub const MODE_BITS: u32 = 0o777;

/// One persistent area's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Snapshot {
    pub format: u32,
    /// Every entry, parents before children, in path order.
    pub entries: Vec<Entry>,
}

/// A directory, file or symbolic link, by its path in the area. (Unknown
/// fields are not refused here: serde cannot with a flattened kind; the
/// snapshot's hash is what binds its content.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub path: RelPath,
    #[serde(flatten)]
    pub kind: EntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum EntryKind {
    Dir {
        /// Permission bits (`MODE_BITS`).
        mode: u32,
    },
    File {
        size: u64,
        /// Permission bits (`MODE_BITS`).
        mode: u32,
        /// The content, in order.
        chunks: Vec<ChunkRef>,
    },
    /// Kept as written; restored as a link, never followed by Moat.
    Symlink { target: String },
}

/// A piece of a file's content, named by its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChunkRef {
    pub sha256: Sha256,
    pub len: u32,
}

impl Snapshot {
    pub fn empty() -> Snapshot {
        Snapshot {
            format: FORMAT,
            entries: Vec::new(),
        }
    }

    /// The snapshot's name: the SHA-256 of its canonical JSON.
    pub fn id(&self) -> Result<Sha256, VolumeError> {
        let hash = moat_core::hash::canonical_hash(self)
            .map_err(|e| VolumeError::Invalid(format!("the snapshot does not serialize: {e}")))?;
        hash.parse()
            .map_err(|e| VolumeError::Invalid(format!("snapshot hash: {e}")))
    }

    /// Bytes of file content it holds.
    pub fn bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match &e.kind {
                EntryKind::File { size, .. } => *size,
                _ => 0,
            })
            .sum()
    }

    /// Every chunk it names, once each.
    pub fn chunks(&self) -> Vec<&ChunkRef> {
        let mut seen = HashSet::new();
        self.entries
            .iter()
            .filter_map(|e| match &e.kind {
                EntryKind::File { chunks, .. } => Some(chunks),
                _ => None,
            })
            .flatten()
            .filter(|c| seen.insert(&c.sha256))
            .collect()
    }

    /// Parses a snapshot from untrusted bytes and checks it can be restored
    /// safely: see [`Snapshot::check`].
    pub fn parse(bytes: &[u8]) -> Result<Snapshot, VolumeError> {
        let snapshot: Snapshot = serde_json::from_slice(bytes)
            .map_err(|e| VolumeError::Invalid(format!("the snapshot does not parse: {e}")))?;
        snapshot.check()?;
        Ok(snapshot)
    }

    /// What restore relies on: a known format; each path once, at most
    /// [`MAX_DEPTH`] deep; every entry's parent is a directory entry listed
    /// before it (so nothing is ever written through a link); permission
    /// bits only; chunks of 1 to `MAX_CHUNK` bytes; a file's size is the
    /// sum of its chunks; at most [`MAX_AREA_BYTES`] in all.
    pub fn check(&self) -> Result<(), VolumeError> {
        let bad = |m: String| Err(VolumeError::Invalid(m));
        if self.format != FORMAT {
            return bad(format!(
                "snapshot format {} (this Moat reads {FORMAT})",
                self.format
            ));
        }
        if self.entries.len() > MAX_ENTRIES {
            return bad(format!("more than {MAX_ENTRIES} entries"));
        }
        let mut dirs: HashSet<&str> = HashSet::new();
        let mut seen: HashSet<&str> = HashSet::new();
        let mut total = 0u64;
        for entry in &self.entries {
            let path = entry.path.as_str();
            if !seen.insert(path) {
                return bad(format!("{path:?} is listed twice"));
            }
            if path.split('/').count() > MAX_DEPTH {
                return bad(format!("{path:?}: deeper than {MAX_DEPTH}"));
            }
            let mode = match &entry.kind {
                EntryKind::Dir { mode } | EntryKind::File { mode, .. } => *mode,
                EntryKind::Symlink { .. } => 0,
            };
            if mode & !MODE_BITS != 0 {
                return bad(format!(
                    "{path:?}: mode {mode:o} is more than permission bits"
                ));
            }
            if let Some((parent, _)) = path.rsplit_once('/')
                && !dirs.contains(parent)
            {
                return bad(format!("{path:?}: its directory is not listed before it"));
            }
            match &entry.kind {
                EntryKind::Dir { .. } => {
                    dirs.insert(path);
                }
                EntryKind::File { size, chunks, .. } => {
                    if let Some(c) = chunks
                        .iter()
                        .find(|c| c.len == 0 || c.len > crate::chunking::MAX_CHUNK)
                    {
                        return bad(format!("{path:?}: a chunk of {} bytes", c.len));
                    }
                    let sum: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
                    if sum != *size {
                        return bad(format!("{path:?}: its chunks hold {sum} bytes, not {size}"));
                    }
                    total = total.saturating_add(sum);
                    if total > MAX_AREA_BYTES {
                        return bad(format!("more than {MAX_AREA_BYTES} bytes of files"));
                    }
                }
                EntryKind::Symlink { target } => {
                    if target.is_empty() || target.len() > 4096 || target.contains('\0') {
                        return bad(format!(
                            "{path}: a link target must be 1-4096 bytes, no NUL"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
