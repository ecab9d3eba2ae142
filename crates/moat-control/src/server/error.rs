//! API errors: a status and `{"error": {"reason", "message"}}`, where the
//! reason is a stable snake_case word a client can branch on.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use moat_store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            reason,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn forbidden(reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, reason, message)
    }

    /// Also what another org's objects look like.
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("no {what}"))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        // Details stay in the server's log: database messages can quote data.
        match e {
            StoreError::Conflict(what) => ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("{what} already exists"),
            ),
            StoreError::NoSuch(what) => ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no such {what}"),
            ),
            StoreError::InUse(why) => ApiError::new(StatusCode::CONFLICT, "in_use", why),
            StoreError::Sqlite(_) | StoreError::Postgres(_) => {
                eprintln!("moat serve: store: {e}");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the database could not be reached or was busy; retry",
                )
            }
            other => {
                eprintln!("moat serve: store: {other}");
                ApiError::internal("stored data could not be read or written")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"reason": self.reason, "message": self.message}});
        (self.status, axum::Json(body)).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// The trusted output store did not take or give back a promoted file:
/// 503, retried by runners (details in the server's log: a backend's
/// message can name a bucket or a path).
pub fn outputs_unavailable(e: moat_store::OutputsError) -> ApiError {
    eprintln!("moat serve: {e}");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "outputs_unavailable",
        "the output store could not be reached; retry",
    )
}
