//! Checks of signed manifests and runner builds, shared by publishing
//! (admin API) and registration (runner API).

use moat_core::SignedManifest;
use moat_core::event_data::RunnerRejection;

use super::AppState;
use super::error::ApiError;

/// `text` is a SHA-256 (the rule of [`moat_core::ids::Sha256`]).
pub fn is_sha256(text: &str) -> bool {
    text.parse::<moat_core::ids::Sha256>().is_ok()
}

/// Checks a signed manifest against this control plane: signed with its
/// key, naming its key, for its environment. The manifest on success.
pub fn check_manifest(
    state: &AppState,
    signed: &SignedManifest,
) -> Result<(), (RunnerRejection, String)> {
    let public = state.config.key.public();
    signed.verify(&public).map_err(|e| {
        (
            RunnerRejection::BadSignature,
            format!("the manifest does not verify with the control plane's key: {e}"),
        )
    })?;
    let m = &signed.manifest;
    if m.control_plane_public_key != public.to_base64() {
        return Err((
            RunnerRejection::BadSignature,
            "the manifest names another control plane's key".into(),
        ));
    }
    if m.environment != state.config.environment {
        return Err((
            RunnerRejection::WrongEnvironment,
            format!(
                "manifest for {:?}, this control plane serves {:?}",
                m.environment, state.config.environment
            ),
        ));
    }
    Ok(())
}

pub fn manifest_expiry(signed: &SignedManifest) -> Result<i64, ApiError> {
    moat_core::time::parse_rfc3339(&signed.manifest.expires_at)
        .map(crate::clock::ms)
        .map_err(|_| ApiError::bad_request("manifest expiresAt is not RFC 3339"))
}
