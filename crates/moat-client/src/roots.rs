//! Which certificate authorities a client trusts for an `https://` control
//! plane: Mozilla's roots by default, or only the ones in a PEM file
//! (`--ca-file`: a private CA).

use std::path::Path;
use std::sync::Arc;

use ureq::tls::{Certificate, PemItem, RootCerts};

/// The CAs of a `--ca-file`.
#[derive(Debug, Clone)]
pub struct CaRoots(Arc<Vec<Certificate<'static>>>);

/// Why a CA file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    #[error("--ca-file {path}: {message}")]
    Read { path: String, message: String },
    #[error("--ca-file {0}: no PEM certificate in it")]
    Empty(String),
    #[error("--ca-file is for an https:// control plane; {0} is plain HTTP, which no CA protects")]
    NotHttps(String),
}

impl CaRoots {
    /// The CAs of `path` for talking to `base`, which must then be
    /// `https://`: a CA given for a plain-HTTP URL would protect nothing.
    pub fn for_control_plane(path: &Path, base: &str) -> Result<CaRoots, CaFileError> {
        if !base
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("https://")
        {
            return Err(CaFileError::NotHttps(base.to_owned()));
        }
        CaRoots::from_pem_file(path)
    }

    /// Every certificate in the PEM file at `path` (other PEM items, such
    /// as a key, are refused: a CA file holds certificates only).
    pub fn from_pem_file(path: &Path) -> Result<CaRoots, CaFileError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| CaFileError::Read {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        let mut certificates = Vec::new();
        for item in ureq::tls::parse_pem(&bytes) {
            match item {
                Ok(PemItem::Certificate(cert)) => certificates.push(cert),
                Ok(_) => {
                    return Err(CaFileError::Read {
                        path: shown,
                        message: "holds something other than certificates (a private key?)".into(),
                    });
                }
                Err(e) => {
                    return Err(CaFileError::Read {
                        path: shown,
                        message: e.to_string(),
                    });
                }
            }
        }
        if certificates.is_empty() {
            return Err(CaFileError::Empty(shown));
        }
        Ok(CaRoots(Arc::new(certificates)))
    }

    /// Each CA certificate, DER-encoded (for a TLS client of one's own).
    pub fn ders(&self) -> Vec<Vec<u8>> {
        self.0.iter().map(|c| c.der().to_vec()).collect()
    }

    pub(crate) fn root_certs(&self) -> RootCerts {
        RootCerts::Specific(Arc::clone(&self.0))
    }
}
