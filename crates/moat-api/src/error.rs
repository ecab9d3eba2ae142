//! The body of every refusal: `{"error": {"reason", "message"}}`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a non-2xx answer carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorDetail {
    /// A stable snake_case word a client can branch on (`lease_lost`,
    /// `manifest_expired`, `not_found`...).
    pub reason: String,
    /// For people: what was wrong and what to do.
    pub message: String,
}

impl ErrorBody {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                reason: reason.into(),
                message: message.into(),
            },
        }
    }
}
