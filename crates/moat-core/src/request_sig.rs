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

/// What a signature covers: everything that makes one request this request.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    /// The runner id (so a request signed for one runner never passes for
    /// another that registered the same key).
    pub runner: &'a str,
    pub method: &'a str,
    pub path_and_query: &'a str,
    pub timestamp_ms: i64,
    pub nonce: &'a str,
    pub body: &'a [u8],
}

impl Signed<'_> {
    /// The bytes signed.
    pub fn message(&self) -> Vec<u8> {
        format!(
            "moat-runner-request/1\n{}\n{}\n{}\n{}\n{}\n{}",
            self.runner,
            self.method.to_ascii_uppercase(),
            self.path_and_query,
            self.timestamp_ms,
            self.nonce,
            sha256_hex(self.body)
        )
        .into_bytes()
    }

    /// The signature header's value.
    pub fn sign(&self, key: &PrivateKey) -> String {
        key.sign(&self.message())
    }

    pub fn verify(&self, key: &PublicKey, signature: &str) -> Result<(), SignError> {
        key.verify(&self.message(), signature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_change_breaks_the_signature() {
        let key = PrivateKey::from_seed([7; 32]);
        let request = Signed {
            runner: "r1",
            method: "POST",
            path_and_query: "/v1/runner/claim",
            timestamp_ms: 1000,
            nonce: "ab",
            body: b"{}",
        };
        let sig = request.sign(&key);
        let public = key.public();
        assert!(request.verify(&public, &sig).is_ok());
        for changed in [
            Signed {
                runner: "r2",
                ..request
            },
            Signed {
                method: "GET",
                ..request
            },
            Signed {
                path_and_query: "/v1/runner/claim?x",
                ..request
            },
            Signed {
                timestamp_ms: 1001,
                ..request
            },
            Signed {
                nonce: "ac",
                ..request
            },
            Signed {
                body: b"{ }",
                ..request
            },
        ] {
            assert!(changed.verify(&public, &sig).is_err(), "{changed:?}");
        }
    }
}
