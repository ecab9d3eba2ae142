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
mod runtime;
mod services;
pub use moat_worker_api::wit;

pub use bindings::Grants;
pub use error::WorkerError;
pub use limits::WorkerLimits;
pub use moat_worker_api::{BindingUse, Denial, MAX_OUTCOME_BYTES, Outcome, WorkerExit};
pub use runtime::{Loaded, Runtime};
