//! Chunking a file that changed, knowing its previous chunks.
//!
//! Cutting a 1 GiB file again costs a full content-defined pass and a
//! SHA-256 of every byte. When the file had chunks before, most of them are
//! usually still there: each previous chunk's region is read where it is
//! expected and hashed (in batches, on two threads); a region that still
//! hashes to its chunk's SHA-256 keeps that chunk (the check is the same
//! SHA-256 that names it, so nothing weaker is trusted). From the first
//! region that does not, the file is cut by content again, until a cut
//! lands where a previous chunk began (at the same offset, or shifted by
//! how much the file grew or shrank): from there the previous chunks are
//! checked again. Any cut of a file is a correct one; this one only
//! decides which regions need to be read twice.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use crate::chunking::{self, Chunk, MAX_CHUNK};
use crate::model::ChunkRef;

/// Previous chunks hashed together (about 8 MiB at the average size).
const BATCH: usize = 16;

/// One piece of the new file: a previous chunk still there, or new bytes.
pub(crate) enum Piece {
    Kept(ChunkRef),
    New(Chunk),
}

/// Cuts `file` (`size` bytes now) given its `previous` chunks, calling
/// `each` with every piece in order.
pub(crate) fn rechunk(
    file: &File,
    size: u64,
    previous: &[ChunkRef],
    each: &mut dyn FnMut(Piece) -> Result<(), crate::VolumeError>,
    path: &str,
) -> Result<(), crate::VolumeError> {
    let io = |e: std::io::Error| crate::VolumeError::io(path.to_owned(), e);
    // Where each previous chunk began, and which one.
    let mut starts: HashMap<u64, usize> = HashMap::with_capacity(previous.len());
    let mut at = 0u64;
    for (i, chunk) in previous.iter().enumerate() {
        starts.insert(at, i);
        at += u64::from(chunk.len);
    }
    let old_size = at;
    let grown = i128::from(size) - i128::from(old_size);
    // The next previous chunk to check, the shift of the file at it, and
    // how many to check at once: from the start of the file a full batch;
    // after a resync one, doubling while they match, so that edits which
    // keep the cut points but change the chunks do not cost a batch each.
    let mut next = Some((0usize, 0i128, BATCH));
    let mut pos = 0u64;
    while pos < size {
        match next {
            Some((k, shift, at_once)) if k < previous.len() => {
                let batch = &previous[k..previous.len().min(k + at_once)];
                let kept = check_batch(file, pos, batch, size).map_err(io)?;
                for chunk in &batch[..kept] {
                    pos += u64::from(chunk.len);
                    each(Piece::Kept(chunk.clone()))?;
                }
                next = if kept == batch.len() {
                    Some((k + kept, shift, (at_once * 2).min(BATCH)))
                } else {
                    None
                };
            }
            _ => {
                // Cut by content from `pos` until a cut meets a previous start.
                let reader = ReadAt {
                    file,
                    offset: pos,
                    end: size,
                };
                let mut met = None;
                for chunk in chunking::chunks(reader) {
                    let chunk = chunk.map_err(io)?;
                    pos += u64::from(chunk.reference.len);
                    each(Piece::New(chunk))?;
                    met = [0, grown].iter().find_map(|shift| {
                        let old = i128::from(pos) - shift;
                        let old = u64::try_from(old).ok()?;
                        starts.get(&old).map(|k| (*k, *shift, 1))
                    });
                    if met.is_some() {
                        break;
                    }
                }
                next = met;
                if next.is_none() {
                    break; // cut to the end
                }
            }
        }
    }
    Ok(())
}

/// How many of `batch`, laid end to end from `pos`, still hash to
/// themselves (the first that does not ends the count).
fn check_batch(file: &File, pos: u64, batch: &[ChunkRef], size: u64) -> std::io::Result<usize> {
    let total: u64 = batch.iter().map(|c| u64::from(c.len)).sum();
    let readable = total.min(size.saturating_sub(pos));
    let mut bytes = vec![0u8; usize::try_from(readable).unwrap_or(0)];
    file.read_exact_at(&mut bytes, pos)?;
    // Each chunk's region in `bytes`, while it fits.
    let mut regions = Vec::with_capacity(batch.len());
    let mut at = 0usize;
    for chunk in batch {
        let end = at + chunk.len as usize;
        if end > bytes.len() {
            break;
        }
        regions.push((at, end));
        at = end;
    }
    let matches = |range: &[(usize, usize)], chunks: &[ChunkRef]| -> Vec<bool> {
        range
            .iter()
            .zip(chunks)
            .map(|((from, to), chunk)| chunking::sha256(&bytes[*from..*to]) == chunk.sha256)
            .collect()
    };
    // Two threads only when there is enough to share.
    let half = if regions.len() >= 4 {
        regions.len() / 2
    } else {
        regions.len()
    };
    let (first, second) = std::thread::scope(|scope| {
        let other = (half < regions.len())
            .then(|| scope.spawn(|| matches(&regions[half..], &batch[half..])));
        let first = matches(&regions[..half], &batch[..half]);
        let second = other.map_or_else(Vec::new, |t| t.join().unwrap_or_default());
        (first, second)
    });
    Ok(first
        .into_iter()
        .chain(second)
        .take_while(|same| *same)
        .count())
}

/// A file read from an offset to an end, for the chunker.
struct ReadAt<'a> {
    file: &'a File,
    offset: u64,
    end: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.end.saturating_sub(self.offset);
        let want = buf
            .len()
            .min(usize::try_from(left).unwrap_or(MAX_CHUNK as usize));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}
