//! Holding one id of a range for the life of one sandbox.
//!
//! Each id of a range has a slot file in `/run/moat/hostids` (usually on a
//! tmpfs, emptied at boot; where it is not, a slot left `held` is simply
//! checked again). A
//! launcher holds an id by holding an exclusive `flock` on its slot, which
//! the kernel drops when the launcher ends however it ends. The slot's text
//! says how its last holder let go:
//!
//! - `free` (each text is padded to one 128-byte record): after the
//!   sandbox's init was reaped, which with a pid namespace
//!   means every process of the sandbox is gone: the id is taken at once;
//! - anything else (`held ...` left by a launcher that was killed, or an empty
//!   slot never used since boot): the id is taken only after a scan of
//!   `/proc` finds no task holding it.
//!
//! Slot files are never removed, so a lock is never taken on a file that
//! another launcher has just unlinked.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::proc_scan;
use super::range::IdRange;

/// Moat's run-time directory: root's, on a tmpfs.
pub const RUN_DIR: &str = "/run/moat";
/// Where the slot files live.
pub const SLOT_DIR: &str = "/run/moat/hostids";

/// Every slot text is one record of this many bytes, rewritten in place:
/// never truncating the file keeps a launch to two small writes (truncating
/// costs a journal transaction where /run is not a tmpfs).
const RECORD: usize = 128;

/// A slot's text: `text`, padded to [`RECORD`] bytes.
fn record(text: &str) -> [u8; RECORD] {
    let mut out = [b' '; RECORD];
    let n = text.len().min(RECORD - 1);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out[RECORD - 1] = b'\n';
    out
}

const FREE: &str = "free";

/// Why no id could be held.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{path}: {source}")]
    Dir { path: PathBuf, source: io::Error },
    #[error("host id slot {path}: {source}")]
    Slot { path: PathBuf, source: io::Error },
    #[error("cannot tell whether host id {id} is still in use (reading /proc: {source})")]
    Scan { id: u32, source: io::Error },
    #[error(
        "every host id of the range {range} is taken ({held} held by running sandboxes, \
         {lingering} still owning a process): wait for a run to end, or give a wider --uid-range"
    )]
    Exhausted {
        range: IdRange,
        held: u64,
        lingering: u64,
    },
}

/// One host id, exclusive to the holder until dropped. Dropping it says the
/// id is free: drop it only once nothing that ran as the id can be left.
#[derive(Debug)]
pub struct Lease {
    slot: File,
    id: u32,
}

impl Lease {
    /// Holds the lowest id of `range` that no other sandbox holds and no
    /// task owns. `holder` (a run id) is written into the slot for whoever
    /// looks at the directory.
    pub fn take(range: IdRange, holder: &str) -> Result<Lease, LeaseError> {
        ensure_root_dir(Path::new(RUN_DIR), 0o755)?;
        ensure_root_dir(Path::new(SLOT_DIR), 0o700)?;
        let (mut held, mut lingering) = (0, 0);
        for id in range.base..=range.last() {
            let path = Path::new(SLOT_DIR).join(id.to_string());
            let slot_err = |source| LeaseError::Slot {
                path: path.clone(),
                source,
            };
            let slot = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(slot_err)?;
            if !try_lock(&slot).map_err(slot_err)? {
                held += 1;
                continue;
            }
            let mut head = [0u8; RECORD];
            let read = slot.read_at(&mut head, 0).map_err(slot_err)?;
            let freed = head[..read] == record(FREE);
            if !freed
                && proc_scan::id_in_use(id).map_err(|source| LeaseError::Scan { id, source })?
            {
                lingering += 1;
                continue;
            }
            // SAFETY: plain id query.
            let pid = unsafe { libc::getpid() };
            let note = record(&format!("held by pid {pid} for run {holder}"));
            slot.write_all_at(&note, 0).map_err(slot_err)?;
            return Ok(Lease { slot, id });
        }
        Err(LeaseError::Exhausted {
            range,
            held,
            lingering,
        })
    }

    /// The host uid, and gid, held.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // If this fails the slot keeps its `held` text: the next taker scans
        // /proc before reusing the id, as after a killed launcher.
        let _ = self.slot.write_all_at(&record(FREE), 0);
        // Closing the slot releases the lock.
    }
}

fn try_lock(file: &File) -> io::Result<bool> {
    loop {
        // SAFETY: flock on a descriptor this function borrows.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Makes `path` if it is missing, then insists that it is a real directory
/// that only root can write: anyone else able to plant a slot or a lock file
/// there could hold ids or make two sandboxes share one.
pub(crate) fn ensure_root_dir(path: &Path, mode: u32) -> Result<(), LeaseError> {
    let dir_err = |source| LeaseError::Dir {
        path: path.to_owned(),
        source,
    };
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(dir_err(e)),
    }
    let meta = std::fs::symlink_metadata(path).map_err(dir_err)?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(dir_err(io::Error::other(
            "must be a directory owned by root and writable by root alone",
        )));
    }
    Ok(())
}
