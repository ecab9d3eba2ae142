//! What the `worker` class's two sides share without either carrying the
//! other: the outcome the worker runtime (`moat-worker`, which links
//! wasmtime) reports, the effects it asks the host to make, and the WIT
//! worlds a worker is built against. `moat` depends on this crate alone,
//! so it links none of wasmtime.
#![forbid(unsafe_code)]

mod effects;
mod outcome;
pub mod wit;

pub use effects::{
    Effects, KvSnapshot, KvWrite, MAX_KEY_BYTES, MAX_KV_WRITES, MAX_MESSAGE_BYTES, MAX_SENDS,
    MAX_VALUE_BYTES, QueueSend, Value, valid_idempotency_key, valid_key, valid_name,
};
pub use outcome::{BindingUse, Denial, Outcome, WorkerExit};

/// Most bytes an outcome takes as one JSON line without its output: less
/// than a pipe's default buffer, so a runtime writing it to a pipe nobody
/// reads yet never waits.
pub const MAX_OUTCOME_BYTES: usize = 48 << 10;
