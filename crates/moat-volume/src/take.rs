//! Taking a snapshot of an area, incrementally.
//!
//! The area was written by a sandboxed program, so it is walked through
//! directory handles one name at a time, never following a link (a file
//! swapped for a link to a host file is not read). A file whose inode,
//! size, modification and change times are what they were when it was last
//! chunked keeps its chunks unread: the change time cannot be set back by
//! a program, so an unchanged file is never read twice. Only the chunks the
//! store lacks are sent to it.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::chunking;
use crate::error::VolumeError;
use crate::model::{ChunkRef, Entry, EntryKind, MAX_ENTRIES, Snapshot};
use crate::rechunk::{self, Piece};
use crate::store::{self, ChunkStore};

/// Deepest directory nesting taken.
pub const MAX_DEPTH: usize = 64;

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime: (i64, u64),
    ctime: (i64, u64),
}

impl Stamp {
    fn of(stat: &rustix::fs::Stat) -> Stamp {
        Stamp {
            ino: stat.st_ino,
            size: u64::try_from(stat.st_size).unwrap_or(0),
            mtime: (stat.st_mtime, stat.st_mtime_nsec),
            ctime: (stat.st_ctime, stat.st_ctime_nsec),
        }
    }
}

#[derive(Debug, Clone)]
struct Known {
    stamp: Stamp,
    chunks: Vec<ChunkRef>,
}

/// One area's memory of its files between snapshots (and after a restore).
#[derive(Debug, Default)]
pub struct Tracker {
    known: HashMap<String, Known>,
}

/// A snapshot taken, and what it cost.
#[derive(Debug)]
pub struct Taken {
    pub snapshot: Snapshot,
    pub id: moat_core::ids::Sha256,
    /// File bytes read to chunk changed files.
    pub bytes_read: u64,
    /// Chunks (and their bytes) the store did not have.
    pub chunks_sent: usize,
    pub bytes_sent: u64,
    /// Files whose chunks were known without reading them.
    pub files_unchanged: usize,
    /// Entries left out: not a directory, file or link (a FIFO, socket or
    /// device), or a name that is not UTF-8.
    pub skipped: Vec<String>,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// Remembers a file restored or written by Moat itself, so the next
    /// snapshot does not read it again.
    pub(crate) fn remember(&mut self, path: &str, stat: &rustix::fs::Stat, chunks: Vec<ChunkRef>) {
        self.known.insert(
            path.to_owned(),
            Known {
                stamp: Stamp::of(stat),
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
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| VolumeError::io(shown, e))?;
        let mut walk = Walk {
            store,
            previous: std::mem::take(&mut self.known),
            known: HashMap::new(),
            entries: Vec::new(),
            taken: Taken {
                snapshot: Snapshot::empty(),
                id: chunking::sha256(b""),
                bytes_read: 0,
                chunks_sent: 0,
                bytes_sent: 0,
                files_unchanged: 0,
                skipped: Vec::new(),
            },
        };
        let walked = walk.descend(&dir, "", 0);
        // What was learnt stays learnt, even when the walk failed part way.
        self.known = walk.known;
        walked?;
        let mut taken = walk.taken;
        taken.snapshot = Snapshot {
            format: crate::model::FORMAT,
            entries: walk.entries,
        };
        taken.id = store::put_snapshot(store, &taken.snapshot)?;
        Ok(taken)
    }
}

struct Walk<'a> {
    store: &'a dyn ChunkStore,
    previous: HashMap<String, Known>,
    known: HashMap<String, Known>,
    entries: Vec<Entry>,
    taken: Taken,
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
                names.push(name);
            }
        }
        names.sort();
        for raw in names {
            let Ok(name) = String::from_utf8(raw.clone()) else {
                self.taken
                    .skipped
                    .push(format!("{prefix}{}", String::from_utf8_lossy(&raw)));
                continue;
            };
            let path = format!("{prefix}{name}");
            if self.entries.len() >= MAX_ENTRIES {
                return Err(VolumeError::TooLarge(format!(
                    "more than {MAX_ENTRIES} entries: a snapshot holds no more"
                )));
            }
            let Ok(rel) = moat_core::ids::RelPath::try_from(path.clone()) else {
                self.taken.skipped.push(path);
                continue;
            };
            let stat = rustix::fs::statat(dir, raw.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io(&path, e))?;
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => {
                    if depth + 1 >= MAX_DEPTH {
                        return Err(VolumeError::TooLarge(format!(
                            "{path}: nested deeper than {MAX_DEPTH} directories"
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
                        kind: EntryKind::Dir,
                    });
                    self.descend(&sub, &format!("{path}/"), depth + 1)?;
                }
                FileType::RegularFile => {
                    let kind = self.file(dir, &raw, &path)?;
                    self.entries.push(Entry { path: rel, kind });
                }
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
                        _ => self.taken.skipped.push(path),
                    }
                }
                _ => self.taken.skipped.push(path),
            }
        }
        Ok(())
    }

    /// A regular file's entry: its known chunks if unchanged, else its
    /// content chunked and what the store lacks sent.
    fn file(&mut self, dir: &OwnedFd, raw: &[u8], path: &str) -> Result<EntryKind, VolumeError> {
        let io = |e: rustix::io::Errno| VolumeError::io(path.to_owned(), e);
        let fd = rustix::fs::openat(
            dir,
            raw,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(io)?;
        // What was opened, not what was looked at before.
        let stat = rustix::fs::fstat(&fd).map_err(io)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(VolumeError::io(
                path.to_owned(),
                std::io::Error::other("changed while the area was being taken"),
            ));
        }
        let stamp = Stamp::of(&stat);
        let executable = stat.st_mode & 0o100 != 0;
        let chunks = match self.previous.remove(path) {
            Some(known) if known.stamp == stamp => {
                self.taken.files_unchanged += 1;
                known.chunks
            }
            Some(known) => self.rechunk(&File::from(fd), stamp.size, &known.chunks, path)?,
            None => self.chunk(File::from(fd), path)?,
        };
        let size: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
        self.known.insert(
            path.to_owned(),
            Known {
                stamp,
                chunks: chunks.clone(),
            },
        );
        Ok(EntryKind::File {
            size,
            executable,
            chunks,
        })
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
                        self.taken.bytes_read += u64::from(chunk.len);
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
        self.taken.bytes_read += u64::from(chunk.reference.len);
        if !self.store.missing(&[&chunk.reference])?.is_empty() {
            self.store.put(&chunk.reference, &chunk.bytes)?;
            self.taken.chunks_sent += 1;
            self.taken.bytes_sent += u64::from(chunk.reference.len);
        }
        Ok(chunk.reference)
    }
}
