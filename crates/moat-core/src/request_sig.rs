//! Signed runner requests. A runner signs every request to the control
//! plane with the Ed25519 key it registered at bootstrap (one key per boot):
//! the signature covers the method, the path with its query, a timestamp, a
//! single-use nonce and the SHA-256 of the body, so a captured request can
//! be neither altered nor replayed.

use crate::hash::sha256_hex;
use crate::sign::{PrivateKey, PublicKey, SignError};

/// Header naming the runner.
pub const RUNNER: &str = "x-moat-runner";
/// Header with the request's time, milliseconds since the epoch.
pub const TIMESTAMP: &str = "x-moat-timestamp";
/// Header with the request's nonce (hex, at least 16 bytes).
pub const NONCE: &str = "x-moat-nonce";
/// Header with the base64 signature.
pub const SIGNATURE: &str = "x-moat-signature";

/// How far a request's timestamp may be from the control plane's clock.
pub const MAX_SKEW_MS: i64 = 30_000;

/// The bytes signed for one request.
pub fn message(
    method: &str,
    path_and_query: &str,
    timestamp_ms: i64,
    nonce: &str,
    body: &[u8],
) -> Vec<u8> {
    format!(
        "moat-runner-request/1\n{}\n{}\n{}\n{}\n{}",
        method.to_ascii_uppercase(),
        path_and_query,
        timestamp_ms,
        nonce,
        sha256_hex(body)
    )
    .into_bytes()
}

/// The signature header's value.
pub fn sign(
    key: &PrivateKey,
    method: &str,
    path_and_query: &str,
    timestamp_ms: i64,
    nonce: &str,
    body: &[u8],
) -> String {
    key.sign(&message(method, path_and_query, timestamp_ms, nonce, body))
}

/// Checks a request's signature.
pub fn verify(
    key: &PublicKey,
    signature: &str,
    method: &str,
    path_and_query: &str,
    timestamp_ms: i64,
    nonce: &str,
    body: &[u8],
) -> Result<(), SignError> {
    key.verify(
        &message(method, path_and_query, timestamp_ms, nonce, body),
        signature,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_change_breaks_the_signature() {
        let key = PrivateKey::from_seed([7; 32]);
        let sig = sign(&key, "POST", "/v1/runner/claim", 1000, "ab", b"{}");
        let public = key.public();
        assert!(verify(&public, &sig, "POST", "/v1/runner/claim", 1000, "ab", b"{}").is_ok());
        assert!(verify(&public, &sig, "POST", "/v1/runner/claim", 1001, "ab", b"{}").is_err());
        assert!(verify(&public, &sig, "POST", "/v1/runner/claim", 1000, "ac", b"{}").is_err());
        assert!(
            verify(
                &public,
                &sig,
                "POST",
                "/v1/runner/claim",
                1000,
                "ab",
                b"{ }"
            )
            .is_err()
        );
        assert!(verify(&public, &sig, "GET", "/v1/runner/claim", 1000, "ab", b"{}").is_err());
    }
}
