//! Canonical hashing: RFC 8785 (JCS) JSON, then SHA-256, as lowercase hex.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// A value that cannot be canonicalised (a non-finite float, a map with
/// non-string keys).
#[derive(Debug, thiserror::Error)]
#[error("cannot canonicalise: {0}")]
pub struct CanonicalError(String);

/// The RFC 8785 canonical JSON bytes of `value`.
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CanonicalError> {
    serde_jcs::to_vec(value).map_err(|e| CanonicalError(e.to_string()))
}

/// `sha256(canonical_json(value))`, hex.
pub fn canonical_hash<T: Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    Ok(sha256_hex(&canonical_json(value)?))
}

/// SHA-256 of raw bytes, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Incremental SHA-256, for content read in chunks.
pub struct Sha256Stream(Sha256);

impl Sha256Stream {
    pub fn new() -> Self {
        Sha256Stream(Sha256::new())
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The hex digest.
    pub fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

impl Default for Sha256Stream {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b": 1, "a": [1, 2.0, "x"]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":[1,2,"x"],"b":1}"#).unwrap();
        assert_eq!(canonical_hash(&a).unwrap(), canonical_hash(&b).unwrap());
        assert_eq!(canonical_json(&a).unwrap(), br#"{"a":[1,2,"x"],"b":1}"#);
    }
}
