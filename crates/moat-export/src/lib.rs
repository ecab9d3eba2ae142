//! The export boundary. Files a program writes are candidates, not
//! artifacts: this crate judges each against the run's export rules (type
//! from content, size, count, validators, refusals, a secret scan) and
//! copies out only what passed, exactly as it was verified.
//!
//! The verifier parses untrusted bytes; callers run it in a sandbox of its
//! own (`moat export` does: see `docs/export.md`).

#![forbid(unsafe_code)]

pub mod detect;
mod promote;
pub mod rules;
pub mod secrets;
pub mod validate;
mod verify;
mod walk;
mod zip;

pub use promote::{promote, read_verified};
pub use rules::{CsvShape, ExportRule, ExportRules, ExportType, compile, parse};
pub use verify::{
    ExportReport, FileVerdict, Progress, RejectRule, Rejection, Verdict, Verifier, totals,
};

/// What can go wrong around the verdicts (a bad file is a verdict, not an
/// error).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("export rules: {0}")]
    Rules(String),
    #[error("the secret scan: {0}")]
    Scanner(String),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0} changed after it was verified: not promoted")]
    Changed(String),
}
