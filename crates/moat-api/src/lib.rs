//! The control plane's HTTP protocol, as types: what each endpoint takes
//! and what it answers, shared by the server (`moat-control`) and its
//! clients (`moat-client`), each with a JSON Schema for the OpenAPI
//! document.
//!
//! Requests refuse unknown fields (a typo is an error, not a silent
//! default); answers accept them, so a client keeps working against a
//! newer server that says more.
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

pub mod error;
pub mod org;
pub mod queues;
pub mod runner;
pub mod views;

pub use error::{ErrorBody, ErrorDetail};
pub use views::{ManifestView, RunInput, RunView};
