//! What can go wrong with a persistent area.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A snapshot that cannot be restored as it is.
    #[error("invalid snapshot: {0}")]
    Invalid(String),
    /// A chunk whose bytes do not hash to its name.
    #[error("chunk {sha256}: its content hashes to {actual}")]
    Corrupt { sha256: String, actual: String },
    /// A chunk the store does not have.
    #[error("chunk {0} is missing from the store")]
    Missing(String),
    /// Restore needs an empty directory.
    #[error("{0}: restore needs an empty directory")]
    NotEmpty(String),
    /// The area holds more than one snapshot may.
    #[error("{0}")]
    TooLarge(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("chunk store: {0}")]
    Store(String),
}

impl VolumeError {
    pub(crate) fn io(path: impl Into<String>, source: impl Into<io::Error>) -> VolumeError {
        VolumeError::Io {
            path: path.into(),
            source: source.into(),
        }
    }
}
