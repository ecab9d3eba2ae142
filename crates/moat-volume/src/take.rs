//! Taking a snapshot of an area, incrementally.
//!
//! The area was written by a sandboxed program, so it is walked through
//! directory handles one name at a time, never following a link (a file
//! swapped for a link to a host file is not read), never blocking on what
//! is not a regular file, and within budgets (entries, bytes) counted before
//! anything is read. The caller takes a snapshot only when nothing else
//! writes the area (the program's sandbox has ended).
//!
//! A file whose device, inode, size, modification and change times are what
//! they were when it was last chunked keeps its chunks unread, unless those
//! times were too close to when that snapshot began to tell a rewrite in
//! the same clock tick apart ("racy", as git calls it): such a file, and
//! every file a restore wrote, is checked again next time (hashed where its
//! chunks were, nothing sent unless it changed). Only chunks the store lacks
//! are sent to it.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::chunking;
use crate::error::VolumeError;
use crate::model::{
    ChunkRef, Entry, EntryKind, MAX_AREA_BYTES, MAX_DEPTH, MAX_ENTRIES, MODE_BITS, Snapshot,
};
use crate::rechunk::{self, Piece};
use crate::store::{self, ChunkStore};

/// Names of skipped entries kept in a [`Taken`] (the rest are counted).
const MAX_SKIPPED_NAMES: usize = 100;

/// How close to a snapshot's start a file's times make its stamp racy:
/// more than a coarse clock's tick (a few milliseconds)...
const RACY_NS: i128 = 20_000_000;
/// ...or, on a filesystem that keeps whole seconds only (its times have no
/// nanoseconds), more than a second.
const RACY_COARSE_NS: i128 = 2_000_000_000;

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, u64),
    ctime: (i64, u64),
}

impl Stamp {
    fn of(stat: &rustix::fs::Stat) -> Stamp {
        Stamp {
            dev: stat.st_dev,
            ino: stat.st_ino,
            size: u64::try_from(stat.st_size).unwrap_or(0),
            mtime: (stat.st_mtime, stat.st_mtime_nsec),
            ctime: (stat.st_ctime, stat.st_ctime_nsec),
        }
    }

    /// Whether a rewrite could hide behind these times: they are within
    /// [`RACY_NS`] (or [`RACY_COARSE_NS`]) of `since` (nanoseconds since
    /// the epoch) or after it.
    fn racy(&self, since: i128) -> bool {
        let ns = |(s, n): (i64, u64)| i128::from(s) * 1_000_000_000 + i128::from(n);
        let window = if self.mtime.1 == 0 && self.ctime.1 == 0 {
            RACY_COARSE_NS
        } else {
            RACY_NS
        };
        ns(self.mtime) > since - window || ns(self.ctime) > since - window
    }
}

#[derive(Debug, Clone)]
struct Known {
    stamp: Stamp,
    /// Not to be trusted without reading (see [`Stamp::racy`]).
    racy: bool,
    chunks: Vec<ChunkRef>,
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(0))
}

/// One area's memory of its files between snapshots (and after a restore).
#[derive(Debug, Default)]
pub struct Tracker {
    known: HashMap<String, Known>,
    /// The snapshot the area stood at after the last take or restore: an
    /// unchanged area is not stored again.
    last: Option<moat_core::ids::Sha256>,
}

/// A snapshot taken, and what it cost.
#[derive(Debug)]
pub struct Taken {
    pub snapshot: Snapshot,
    pub id: moat_core::ids::Sha256,
    pub costs: Costs,
}

/// What taking a snapshot read, sent and left out.
#[derive(Debug, Default)]
pub struct Costs {
    /// File bytes read to chunk changed files.
    pub bytes_read: u64,
    /// Chunks (and their bytes) the store did not have.
    pub chunks_sent: usize,
    pub bytes_sent: u64,
    /// Files whose chunks were known without reading them.
    pub files_unchanged: usize,
    /// Entries left out: not a directory, file or link (a FIFO, socket or
    /// device), a name that is not UTF-8, or an entry that changed kind
    /// while it was read; the first names (quoted), and how many in all.
    pub skipped: Vec<String>,
    pub skipped_count: usize,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// Remembers the snapshot a restore wrote.
    pub(crate) fn restored(&mut self, id: moat_core::ids::Sha256) {
        self.last = Some(id);
    }

    /// Remembers a file restored or written by Moat itself, so the next
    /// snapshot does not read it again.
    /// (Always racy: the times are those of the writing, just now.)
    pub(crate) fn remember(&mut self, path: &str, stat: &rustix::fs::Stat, chunks: Vec<ChunkRef>) {
        self.known.insert(
            path.to_owned(),
            Known {
                stamp: Stamp::of(stat),
                racy: true,
                chunks,
            },
        );
    }

    /// Snapshots the area at `root` into `store` (chunks first, then the
    /// snapshot itself, each durably): when this returns, the snapshot can
    /// be restored from the store alone.
    pub fn take(&mut self, root: &Path, store: &dyn ChunkStore) -> Result<Taken, VolumeError> {
        let shown = root.display().to_string();
        let dir = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| VolumeError::io(shown, e))?;
        let mut walk = Walk {
            store,
            started: now_ns(),
            previous: std::mem::take(&mut self.known),
            known: HashMap::new(),
            entries: Vec::new(),
            seen: 0,
            bytes: 0,
            costs: Costs::default(),
        };
        let walked = walk.descend(&dir, "", 0);
        let snapshot = Snapshot {
            format: crate::model::FORMAT,
            entries: walk.entries,
        };
        // Nothing learnt is kept unless the snapshot was stored: chunks sent
        // by a take that failed may not be durable.
        let id = walked.and_then(|()| {
            let id = snapshot.id()?;
            if self.last.as_ref() == Some(&id) {
                return Ok(id);
            }
            store::put_snapshot(store, &snapshot)
        })?;
        self.known = walk.known;
        self.last = Some(id.clone());
        Ok(Taken {
            snapshot,
            id,
            costs: walk.costs,
        })
    }
}

struct Walk<'a> {
    store: &'a dyn ChunkStore,
    /// When the walk began (nanoseconds since the epoch).
    started: i128,
    previous: HashMap<String, Known>,
    known: HashMap<String, Known>,
    entries: Vec<Entry>,
    /// Directory entries read, kept or not, against [`MAX_ENTRIES`].
    seen: usize,
    /// File bytes taken, against [`MAX_AREA_BYTES`].
    bytes: u64,
    costs: Costs,
}

impl Walk<'_> {
    fn descend(&mut self, dir: &OwnedFd, prefix: &str, depth: usize) -> Result<(), VolumeError> {
        let io = |path: &str, e: rustix::io::Errno| VolumeError::io(path.to_owned(), e);
        let shown = if prefix.is_empty() { "." } else { prefix };
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(dir).map_err(|e| io(shown, e))? {
            let name = entry
                .map_err(|e| io(shown, e))?
                .file_name()
                .to_bytes()
                .to_vec();
            if name != b"." && name != b".." {
                // Counted as read, so a directory of millions of names
                // fails here rather than after they are all held.
                self.seen += 1;
                if self.seen > MAX_ENTRIES {
                    return Err(VolumeError::TooLarge(format!(
                        "more than {MAX_ENTRIES} entries: a snapshot holds no more"
                    )));
                }
                names.push(name);
            }
        }
        names.sort();
        for raw in names {
            let Ok(name) = String::from_utf8(raw.clone()) else {
                self.skip(format!("{prefix}{}", String::from_utf8_lossy(&raw)));
                continue;
            };
            let path = format!("{prefix}{name}");
            let Ok(rel) = moat_core::ids::RelPath::try_from(path.clone()) else {
                self.skip(path);
                continue;
            };
            let stat = rustix::fs::statat(dir, raw.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io(&path, e))?;
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => {
                    if depth + 1 >= MAX_DEPTH {
                        return Err(VolumeError::TooLarge(format!(
                            "{path:?}: nested deeper than {MAX_DEPTH} directories"
                        )));
                    }
                    // One name, not followed if it became a link meanwhile.
                    let sub = rustix::fs::openat(
                        dir,
                        raw.as_slice(),
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| io(&path, e))?;
                    self.entries.push(Entry {
                        path: rel,
                        kind: EntryKind::Dir {
                            mode: stat.st_mode & MODE_BITS,
                        },
                    });
                    self.descend(&sub, &format!("{path}/"), depth + 1)?;
                }
                FileType::RegularFile => match self.file(dir, &raw, &path)? {
                    Some(kind) => self.entries.push(Entry { path: rel, kind }),
                    None => self.skip(path),
                },
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(dir, raw.as_slice(), Vec::new())
                        .map_err(|e| io(&path, e))?;
                    match target.into_string() {
                        Ok(target) if !target.is_empty() && target.len() <= 4096 => {
                            self.entries.push(Entry {
                                path: rel,
                                kind: EntryKind::Symlink { target },
                            });
                        }
                        _ => self.skip(path),
                    }
                }
                _ => self.skip(path),
            }
        }
        Ok(())
    }

    /// A regular file's entry: its known chunks if unchanged, else its
    /// content chunked and what the store lacks sent; `None` if it is no
    /// longer a regular file.
    fn file(
        &mut self,
        dir: &OwnedFd,
        raw: &[u8],
        path: &str,
    ) -> Result<Option<EntryKind>, VolumeError> {
        let io = |e: rustix::io::Errno| VolumeError::io(path.to_owned(), e);
        // Non-blocking: a name swapped for a FIFO meanwhile must not hang.
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        let fd = rustix::fs::openat(dir, raw, flags, Mode::empty()).map_err(io)?;
        // What was opened, not what was looked at before.
        let stat = rustix::fs::fstat(&fd).map_err(io)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        let stamp = Stamp::of(&stat);
        // Counted before a byte is read: a sparse or many-linked file is
        // restored in full, so it counts in full.
        self.bytes = self.bytes.saturating_add(stamp.size);
        if self.bytes > MAX_AREA_BYTES {
            return Err(VolumeError::TooLarge(format!(
                "more than {MAX_AREA_BYTES} bytes of files (at {path:?})"
            )));
        }
        let chunks = match self.previous.remove(path) {
            Some(known) if known.stamp == stamp && !known.racy => {
                self.costs.files_unchanged += 1;
                known.chunks
            }
            Some(known) => self.rechunk(&File::from(fd), stamp.size, &known.chunks, path)?,
            None => self.chunk(File::from(fd), path)?,
        };
        let size: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
        let racy = stamp.racy(self.started);
        self.known.insert(
            path.to_owned(),
            Known {
                stamp,
                racy,
                chunks: chunks.clone(),
            },
        );
        Ok(Some(EntryKind::File {
            size,
            mode: stat.st_mode & MODE_BITS,
            chunks,
        }))
    }

    fn skip(&mut self, path: String) {
        self.costs.skipped_count += 1;
        if self.costs.skipped.len() < MAX_SKIPPED_NAMES {
            self.costs.skipped.push(format!("{path:?}"));
        }
    }

    fn chunk(&mut self, file: File, path: &str) -> Result<Vec<ChunkRef>, VolumeError> {
        let mut chunks = Vec::new();
        for chunk in chunking::chunks(file) {
            let chunk = chunk.map_err(|e| VolumeError::io(path.to_owned(), e))?;
            chunks.push(self.send(chunk)?);
        }
        Ok(chunks)
    }

    /// A changed file with chunks before: see [`rechunk`].
    fn rechunk(
        &mut self,
        file: &File,
        size: u64,
        previous: &[ChunkRef],
        path: &str,
    ) -> Result<Vec<ChunkRef>, VolumeError> {
        let mut chunks = Vec::new();
        rechunk::rechunk(
            file,
            size,
            previous,
            &mut |piece| {
                let chunk = match piece {
                    Piece::Kept(chunk) => {
                        self.costs.bytes_read += u64::from(chunk.len);
                        chunk
                    }
                    Piece::New(chunk) => self.send(chunk)?,
                };
                chunks.push(chunk);
                Ok(())
            },
            path,
        )?;
        Ok(chunks)
    }

    /// Counts a chunk read, and sends it unless the store has it.
    fn send(&mut self, chunk: chunking::Chunk) -> Result<ChunkRef, VolumeError> {
        self.costs.bytes_read += u64::from(chunk.reference.len);
        if !self.store.missing(&[&chunk.reference])?.is_empty() {
            self.store.put(&chunk.reference, &chunk.bytes)?;
            self.costs.chunks_sent += 1;
            self.costs.bytes_sent += u64::from(chunk.reference.len);
        }
        Ok(chunk.reference)
    }
}
