//! An org's secrets, opened for the credential proxy and the scrubber.

use axum::http::StatusCode;

use super::AppState;
use super::error::ApiError;
use crate::vault::VaultError;

/// Every secret of `org`, opened: `(name, value)`. A secret that does not
/// open (another key) is an error: fail closed.
pub(crate) fn open_secrets(
    state: &AppState,
    org: &str,
    sealed: &[moat_store::SealedSecret],
) -> Result<Vec<(String, crate::vault::Secret)>, ApiError> {
    if sealed.is_empty() {
        return Ok(Vec::new());
    }
    let vault = state.config.vault.as_ref().ok_or_else(no_vault)?;
    sealed
        .iter()
        .map(|s| {
            let plain = vault
                .open(org, &s.name, &s.nonce, &s.ciphertext)
                .map_err(|e| ApiError::internal(format!("secret {}: {e}", s.name)))?;
            let text = std::str::from_utf8(&plain)
                .map_err(|_| ApiError::internal(format!("secret {}: not UTF-8", s.name)))?;
            Ok((s.name.clone(), crate::vault::Secret::new(text.to_owned())))
        })
        .collect()
}

/// The refusal when no secrets key is configured.
pub(super) fn no_vault() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_secrets_key",
        VaultError::NoKey.to_string(),
    )
}
