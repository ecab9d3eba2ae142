//! Moat's `worker` class: WebAssembly components (WASI 0.2) run by
//! wasmtime, with no filesystem, no sockets, no environment and no host
//! process of their own: only the bindings they were granted.
//!
//! A worker has no syscalls to filter. What it may touch is what the
//! linker gives it: WASI's streams, clocks and randomness, a root
//! directory every open of which is refused and recorded (so a guest's
//! `open("/etc/passwd")` is a denial on the record, not a silent
//! `ENOENT`), and sockets whose every address is refused and recorded.
//! Limits: an epoch deadline (the wall-clock timeout), a resource limiter
//! on memories and tables, and capped output streams.
//!
//! The process that runs wasmtime is itself started inside Moat's
//! namespace sandbox (`moat exec --class worker`): the `moat-worker`
//! binary of this crate is what runs there.
#![forbid(unsafe_code)]

mod bindings;
pub mod cli;
mod deny;
mod error;
mod host;
mod http;
mod limits;
mod outcome;
mod runtime;
pub mod wit;

pub use bindings::{BindingUse, Grants};
pub use error::WorkerError;

/// Most bytes an outcome takes as one JSON line without its output: less
/// than a pipe's default buffer, so a runtime writing it to a pipe nobody
/// reads yet never waits.
pub const MAX_OUTCOME_BYTES: usize = 48 << 10;
pub use limits::WorkerLimits;
pub use outcome::{Denial, Outcome, WorkerExit};
pub use runtime::{Loaded, Runtime};
