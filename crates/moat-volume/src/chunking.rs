//! Content-defined chunking (FastCDC): cut points depend on the bytes
//! around them, not on offsets, so a change in the middle of a file
//! changes only the chunks it touches, and an insertion does not shift
//! every chunk after it.

use std::io::Read;

use moat_core::ids::Sha256;

use crate::model::ChunkRef;

/// Smallest chunk (but a file's last).
pub const MIN_CHUNK: u32 = 128 << 10;
/// The size chunks tend to.
pub const AVG_CHUNK: u32 = 512 << 10;
/// Largest chunk: a 1 MiB change travels as at most a few of these.
pub const MAX_CHUNK: u32 = 2 << 20;

/// A chunk of a file and its bytes.
pub struct Chunk {
    pub reference: ChunkRef,
    pub bytes: Vec<u8>,
}

/// The chunks of `source`, in order.
pub fn chunks(source: impl Read) -> impl Iterator<Item = std::io::Result<Chunk>> {
    fastcdc::v2020::StreamCDC::new(
        source,
        MIN_CHUNK as usize,
        AVG_CHUNK as usize,
        MAX_CHUNK as usize,
    )
    .map(|piece| {
        let piece = piece.map_err(|e| match e {
            fastcdc::v2020::Error::IoError(e) => e,
            other => std::io::Error::other(other.to_string()),
        })?;
        Ok(Chunk {
            reference: ChunkRef {
                sha256: sha256(&piece.data),
                len: u32::try_from(piece.length).unwrap_or(MAX_CHUNK),
            },
            bytes: piece.data,
        })
    })
}

pub fn sha256(bytes: &[u8]) -> Sha256 {
    let hex = moat_core::hash::sha256_hex(bytes);
    // 64 lower-case hex digits: what Sha256 holds.
    Sha256::try_from(hex).unwrap_or_else(|_| unreachable!("a SHA-256 is 64 hex digits"))
}
