//! Ed25519 keys and signatures, encoded as standard base64 in files and JSON.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

/// Why a key or signature was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignError {
    #[error("not valid base64")]
    Base64,
    #[error("a {expected}-byte key was expected, got {got} bytes")]
    KeyLength { expected: usize, got: usize },
    #[error("not a valid Ed25519 public key")]
    BadPublicKey,
    #[error("a 64-byte signature was expected")]
    SignatureLength,
    #[error("the signature does not verify")]
    BadSignature,
}

/// Decodes a base64 32-byte key.
fn decode_key(text: &str) -> Result<[u8; 32], SignError> {
    let bytes = B64.decode(text.trim()).map_err(|_| SignError::Base64)?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| SignError::KeyLength {
            expected: 32,
            got: bytes.len(),
        })
}

/// A private signing key (the 32-byte seed).
pub struct PrivateKey(SigningKey);

impl PrivateKey {
    /// From 32 bytes of key material (use [`PrivateKey::from_seed`] with
    /// bytes from the OS random source to generate one).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        PrivateKey(SigningKey::from_bytes(&seed))
    }

    pub fn from_base64(text: &str) -> Result<Self, SignError> {
        Ok(Self::from_seed(decode_key(text)?))
    }

    pub fn to_base64(&self) -> String {
        B64.encode(self.0.to_bytes())
    }

    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// Signs `message`; the signature is base64.
    pub fn sign(&self, message: &[u8]) -> String {
        B64.encode(self.0.sign(message).to_bytes())
    }
}

/// A public verifying key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    pub fn from_base64(text: &str) -> Result<Self, SignError> {
        VerifyingKey::from_bytes(&decode_key(text)?)
            .map(PublicKey)
            .map_err(|_| SignError::BadPublicKey)
    }

    pub fn to_base64(&self) -> String {
        B64.encode(self.0.to_bytes())
    }

    /// Verifies a base64 signature over `message` (strict: no malleable forms).
    pub fn verify(&self, message: &[u8], signature: &str) -> Result<(), SignError> {
        let bytes = B64
            .decode(signature.trim())
            .map_err(|_| SignError::Base64)?;
        let raw: [u8; 64] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| SignError::SignatureLength)?;
        self.0
            .verify_strict(message, &Signature::from_bytes(&raw))
            .map_err(|_| SignError::BadSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_only_for_their_message_and_key() {
        let key = PrivateKey::from_seed([7; 32]);
        let other = PrivateKey::from_seed([8; 32]);
        let sig = key.sign(b"manifest");
        assert_eq!(key.public().verify(b"manifest", &sig), Ok(()));
        assert_eq!(
            key.public().verify(b"manifesT", &sig),
            Err(SignError::BadSignature)
        );
        assert_eq!(
            other.public().verify(b"manifest", &sig),
            Err(SignError::BadSignature)
        );
        let round = PublicKey::from_base64(&key.public().to_base64()).unwrap();
        assert_eq!(round, key.public());
    }
}
