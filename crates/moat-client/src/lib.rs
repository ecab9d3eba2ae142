//! A typed client of the control plane's HTTP API (the types are
//! `moat-api`'s): [`RunnerClient`] signs every request with a runner's
//! per-boot key; [`OrgClient`] carries an org's bearer token (operator
//! commands, `moat up`, tests).
//!
//! An answer that does not parse as the type the endpoint promises is an
//! error ([`ClientError::Malformed`]), never a default value.
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

mod error;
mod http;
mod org;
mod roots;
mod runner;
mod tunnel;

pub use error::ClientError;
pub use http::Answer;
pub use org::OrgClient;
pub use roots::{CaFileError, CaRoots};
pub use runner::{Retry, RunnerClient, VolumeSpace};
pub use tunnel::{TUNNEL_PROTOCOL, Tunnel};
