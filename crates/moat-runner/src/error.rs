//! What stops a runner, or one of its runs.

use moat_client::ClientError;

/// Errors of a runner.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Seal(#[from] crate::seal::SealError),
    #[error(transparent)]
    Shell(#[from] moat_shell::child::ChildError),
    #[error("the shell's ledger: {0}")]
    Ledger(#[from] moat_ledger::LedgerError),
    /// This binary or its configuration cannot serve (not sealed, a
    /// manifest that does not verify, an empty token file...).
    #[error("{0}")]
    Setup(String),
    /// The control plane sent something this runner will not act on.
    #[error("{0}")]
    Protocol(String),
    /// A persistent area could not be restored or snapshotted: the run
    /// cannot go on without losing what it wrote.
    #[error("{0}")]
    Volume(String),
}

/// `.io(|| "what")` on I/O results: the error names what was being done.
pub(crate) trait IoContext<T> {
    fn io(self, context: impl FnOnce() -> String) -> Result<T, RunnerError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io(self, context: impl FnOnce() -> String) -> Result<T, RunnerError> {
        self.map_err(|source| RunnerError::Io {
            context: context(),
            source,
        })
    }
}
