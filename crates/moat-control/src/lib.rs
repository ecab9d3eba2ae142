//! Moat's control plane. This first part decides operations with Cedar
//! policies and turns an allow into a capability the runner checks offline.
//!
//! The Cedar vocabulary (namespace `Moat`):
//!
//! | request part | Cedar |
//! |---|---|
//! | principal | `Moat::Runner::"<runner>"`, member of `Moat::Org::"<org>"` |
//! | action | `Moat::Action::"<op>"` (`artifact_read`, `exec_argv`, `http_request`, ...) |
//! | resource | `Moat::Path::"<path>"`, `Moat::Executable::"<path>"`, `Moat::Domain::"<host>"`, `Moat::Tool::"<name>"`, else `Moat::Run::"<run id>"` |
//! | context | `size` (Long, bytes asked for), `network` and `sandbox` (the modes, as strings), `path` (an artifact operation's path), `method` (a direct HTTP request's method), `action` (a browser step's action); "" where they do not apply |
//!
//! `permit` allows, `forbid` denies (and wins), no match denies. A `permit`
//! annotated `@approval("required")` that decides an allow makes it
//! `require_approval` instead (`@risk("low|medium|high|critical")` tells
//! the approver how much is at stake).
//!
//! The manifest lifecycle's rules, shared with runners, are
//! `moat_core::lifecycle`.
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

pub mod audit;
pub mod clock;
pub mod decide;
pub mod describe;
pub mod enrolment;
pub mod placement;
pub mod policy;
pub mod server;
pub mod tools;
pub mod vault;

pub use policy::{Decision, OpRequest, PolicyEngine, PolicyError, Resource};
