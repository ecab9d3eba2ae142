//! The capability shell: an agent's structured operations, checked against a
//! signed manifest, run through the OS sandbox or against the workspace with
//! handle-relative path resolution, and recorded — every request, grant,
//! denial and artifact — in the ledger before the result is returned.
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

pub mod browser;
pub mod child;
mod collect;
pub mod egress;
pub mod exec;
pub mod lines;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod network;
mod shell;
pub mod store;
pub mod verifier;
pub mod worker;
pub mod workspace;

pub use lines::Line;
pub use shell::{MAX_LINE, Shell, ShellConfig, ShellError};
