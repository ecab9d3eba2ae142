//! What can go wrong talking to the control plane.

/// Errors of a call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answered (connection refused, reset, timed out, TLS).
    #[error("reaching the control plane at {base}: {message}")]
    Unreachable { base: String, message: String },
    /// The control plane answered with a refusal.
    #[error("{what}: the control plane answered {status} {reason}: {message}")]
    Refused {
        what: String,
        status: u16,
        reason: String,
        message: String,
    },
    /// The request could not be written as JSON.
    #[error("{what}: the request cannot be encoded: {message}")]
    Encode { what: String, message: String },
    /// The answer is not what the endpoint promises.
    #[error(
        "{what}: the control plane's answer ({status}) is not what this moat expects: {message}"
    )]
    Malformed {
        what: String,
        status: u16,
        message: String,
    },
}

impl ClientError {
    /// The refusal's stable reason (`lease_lost`, `not_found`...).
    pub fn reason(&self) -> Option<&str> {
        match self {
            ClientError::Refused { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// The HTTP status, if anything answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Refused { status, .. } | ClientError::Malformed { status, .. } => {
                Some(*status)
            }
            ClientError::Unreachable { .. } | ClientError::Encode { .. } => None,
        }
    }

    /// Worth retrying as is: nothing answered, or a gateway or the server
    /// said it is unavailable for now (a restart, a busy database).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Refused { status, .. } => matches!(status, 502..=504),
            ClientError::Malformed { .. } | ClientError::Encode { .. } => false,
        }
    }
}
