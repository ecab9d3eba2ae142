//! Persistent work areas: what of a run outlives its runner.
//!
//! An area is a directory a run writes. After each operation that changed
//! it, the runner takes an incremental [`Snapshot`] ([`Tracker::take`]):
//! files are cut into content-defined chunks named by their SHA-256, only
//! chunks the [`ChunkStore`] lacks travel, and the snapshot itself (the list
//! of entries and their chunks) is stored under the SHA-256 of its
//! canonical JSON. Another runner restores it ([`Tracker::restore`]) into an
//! empty directory, every chunk checked against its name.
//!
//! The walk never follows a link and reads through directory handles, so
//! an area a sandboxed program wrote cannot make Moat read or write outside
//! it; an unchanged file (same inode, size, modification and change times)
//! is never read again.

pub mod chunking;
pub mod error;
pub mod model;
mod rechunk;
mod restore;
pub mod store;
mod take;

pub use error::VolumeError;
pub use model::{ChunkRef, Entry, EntryKind, Snapshot};
pub use restore::Restored;
pub use store::{ChunkStore, DirStore};
pub use take::{Costs, Taken, Tracker};
