//! Secrets at rest: sealed with ChaCha20-Poly1305 under a key that lives in
//! a file outside the database (`moat serve --secrets-key`). Each secret's
//! org and name are its associated data, so a sealed value moved to another
//! org or name does not open.

pub use zeroize::Zeroizing;

/// A secret's value once opened: wiped from memory when dropped.
pub type Secret = Zeroizing<String>;

use base64::Engine as _;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("the secrets key must be 32 bytes, base64 (head -c 32 /dev/urandom | base64)")]
    BadKey,
    #[error("no randomness for a nonce")]
    Random,
    #[error("a sealed secret does not open with this key (wrong key, or moved or altered)")]
    Open,
    #[error("no secrets key is configured (moat serve --secrets-key)")]
    NoKey,
}

pub struct Vault {
    key: LessSafeKey,
    random: SystemRandom,
}

fn aad(org: &str, name: &str) -> Vec<u8> {
    format!("moat-secret\0{org}\0{name}").into_bytes()
}

impl Vault {
    /// From the key file's text: 32 bytes in base64.
    pub fn from_base64(text: &str) -> Result<Vault, VaultError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| VaultError::BadKey)?;
        if bytes.len() != 32 {
            return Err(VaultError::BadKey);
        }
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes).map_err(|_| VaultError::BadKey)?;
        Ok(Vault {
            key: LessSafeKey::new(key),
            random: SystemRandom::new(),
        })
    }

    /// `(nonce, ciphertext with tag)` of `value` for `org`'s secret `name`.
    pub fn seal(
        &self,
        org: &str,
        name: &str,
        value: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), VaultError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| VaultError::Random)?;
        let mut sealed = value.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(org, name)),
                &mut sealed,
            )
            .map_err(|_| VaultError::Random)?;
        Ok((nonce.to_vec(), sealed))
    }

    pub fn open(
        &self,
        org: &str,
        name: &str,
        nonce: &[u8],
        sealed: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, VaultError> {
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| VaultError::Open)?;
        // Wiped when dropped: the plaintext is in here too.
        let mut buffer = Zeroizing::new(sealed.to_vec());
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad(org, name)), &mut buffer)
            .map_err(|_| VaultError::Open)?;
        Ok(Zeroizing::new(plain.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_opens_only_where_it_was_sealed() {
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let vault = Vault::from_base64(&key).unwrap();
        let (nonce, sealed) = vault.seal("acme", "crm", b"s3cr3t").unwrap();
        assert!(!sealed.windows(6).any(|w| w == b"s3cr3t"));
        assert_eq!(
            vault
                .open("acme", "crm", &nonce, &sealed)
                .unwrap()
                .as_slice(),
            b"s3cr3t"
        );
        assert!(vault.open("globex", "crm", &nonce, &sealed).is_err());
        assert!(vault.open("acme", "erp", &nonce, &sealed).is_err());
        let other =
            Vault::from_base64(&base64::engine::general_purpose::STANDARD.encode([8u8; 32]))
                .unwrap();
        assert!(other.open("acme", "crm", &nonce, &sealed).is_err());
        assert!(Vault::from_base64("c2hvcnQ=").is_err());
    }
}
