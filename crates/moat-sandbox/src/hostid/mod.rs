//! A host uid/gid of its own for every sandbox launched by root.
//!
//! The ids come from a block reserved for Moat: an operator's
//! `--uid-range BASE:COUNT`, else the `moat-sandboxes` entries of `/etc/subuid` and
//! `/etc/subgid` (written on first use, see [`subid`]). A sandbox holds one id
//! of the block for as long as anything of it lives ([`lease`]): two live
//! sandboxes never share a host identity, so a program that got out of its
//! namespaces is still a stranger to every other run's processes and files.

mod identity;
pub mod lease;
mod proc_scan;
pub mod range;
pub mod subid;

pub(crate) use identity::{Identity, identity, write_id_maps};
pub use lease::{Lease, LeaseError};
pub(crate) use proc_scan::mapped_here;
pub use range::{IdRange, RangeError};
