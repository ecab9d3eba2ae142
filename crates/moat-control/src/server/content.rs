//! An artifact's bytes, wherever they are kept: the database's `blobs`, or
//! the trusted output store for files promoted at the export boundary.
//! Bytes are hashed on the way out: a store edited behind the control
//! plane's back serves an error, never other bytes under the name.

use std::sync::Arc;

use axum::http::StatusCode;
use moat_store::{Store, StoreError};

use super::AppState;
use super::error::{ApiError, ApiResult, outputs_unavailable};

/// Where the bytes of an artifact the org may read are.
pub(super) enum Stored {
    Bytes(Vec<u8>),
    InOutputs,
}

/// Where the bytes of `sha256` are, if one of the org's artifacts names them.
pub(super) fn locate(s: &Store, org: &str, sha256: &str) -> Result<Option<Stored>, StoreError> {
    if let Some(bytes) = s.artifact_bytes(org, sha256)? {
        return Ok(Some(Stored::Bytes(bytes)));
    }
    Ok(s.promoted_output(org, sha256)?.map(|_| Stored::InOutputs))
}

/// The bytes as kept, unchecked (what `/verify` hashes).
pub(super) async fn fetch(
    state: &Arc<AppState>,
    stored: Stored,
    sha256: &str,
) -> ApiResult<Vec<u8>> {
    match stored {
        Stored::Bytes(bytes) => Ok(bytes),
        Stored::InOutputs => state
            .config
            .outputs
            .get(sha256)
            .await
            .map_err(outputs_unavailable)?
            .ok_or_else(|| {
                eprintln!(
                    "moat serve: output store {}: promoted file {sha256} is missing",
                    state.config.outputs.describe()
                );
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "output_missing",
                    format!("the output store has lost promoted file {sha256}"),
                )
            }),
    }
}

/// `bytes`, if they hash to `sha256`.
pub(super) fn checked(bytes: Vec<u8>, sha256: &str) -> ApiResult<Vec<u8>> {
    let computed = moat_core::hash::sha256_hex(&bytes);
    if computed == sha256 {
        return Ok(bytes);
    }
    eprintln!("moat serve: artifact {sha256} reads back as {computed}: not served");
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "artifact_corrupt",
        format!("the bytes kept for artifact {sha256} no longer hash to it; nothing was sent"),
    ))
}
