//! TLS to PostgreSQL (rustls), with libpq's `sslmode` and `sslrootcert`
//! honoured in either form of connection string (`postgres://...?sslmode=`
//! or `key=value`): the PostgreSQL client reads neither `sslrootcert` nor
//! the `verify-*` modes, so both are taken out of the string here and the
//! TLS configuration is built from them.
//!
//! As in libpq: `disable` never uses TLS; `prefer` (the default) and
//! `require` encrypt without checking the server's certificate, unless
//! `sslrootcert` names a file, which makes them check it as `verify-ca`
//! does; `verify-ca` checks the certificate chains to `sslrootcert`;
//! `verify-full` also checks that it names the host. `sslrootcert=system`
//! is the machine's trust store (`SSL_CERT_FILE`, else
//! `/etc/ssl/certs/ca-certificates.crt`), and, as in libpq 16, it means
//! `verify-full`: any other mode with it is refused. TLS is used over TCP
//! only: a server's unix socket never offers it.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::StoreError;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Result<SslMode, StoreError> {
        Ok(match text {
            "disable" => SslMode::Disable,
            // libpq's `allow` tries without TLS first; the client here
            // cannot, and TLS first is the safer side of it.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(StoreError::Tls(format!(
                    "sslmode={other}: expected disable, allow, prefer, require, verify-ca or verify-full"
                )));
            }
        })
    }
}

/// Where the trusted certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    File(PathBuf),
    /// The machine's trust store.
    System,
}

/// The TLS options of a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    pub mode: SslMode,
    pub root: Option<RootCert>,
}

/// `url` without its `sslmode` and `sslrootcert` (for the PostgreSQL
/// client, which refuses what it does not know), and what they said.
pub fn split_options(url: &str) -> Result<(String, TlsOptions), StoreError> {
    let mut mode = None;
    let mut root = None;
    let mut take = |key: &str, value: String| -> Result<bool, StoreError> {
        match key {
            "sslmode" => mode = Some(SslMode::parse(&value)?),
            "sslrootcert" if value == "system" => root = Some(RootCert::System),
            "sslrootcert" => root = Some(RootCert::File(PathBuf::from(value))),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if is_url(url) {
        split_url(url, &mut take)?
    } else {
        split_pairs(url, &mut take)?
    };
    // As libpq (16 and later): the machine's whole trust store vouches for
    // any name, so it is only ever used with the name checked.
    let mode = match (mode, &root) {
        (None, Some(RootCert::System)) => SslMode::VerifyFull,
        (Some(m), Some(RootCert::System)) if m != SslMode::VerifyFull => {
            return Err(StoreError::Tls(
                "sslrootcert=system is only used with sslmode=verify-full (any certificate a \
                 public CA issued would pass otherwise)"
                    .into(),
            ));
        }
        (mode, _) => mode.unwrap_or(SslMode::Prefer),
    };
    let options = TlsOptions { mode, root };
    if matches!(options.mode, SslMode::VerifyCa | SslMode::VerifyFull) && options.root.is_none() {
        return Err(StoreError::Tls(
            "sslmode=verify-ca and verify-full need sslrootcert=FILE (the CA certificates, PEM) \
             or sslrootcert=system"
                .into(),
        ));
    }
    Ok((rest, options))
}

/// A URL connection string (the PostgreSQL client's own test), rather than
/// libpq's `key=value` pairs.
pub(crate) fn is_url(text: &str) -> bool {
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

type Take<'a> = dyn FnMut(&str, String) -> Result<bool, StoreError> + 'a;

/// `postgres://...?a=b&c=d`: parameters `take` keeps are dropped from the query.
fn split_url(url: &str, take: &mut Take<'_>) -> Result<String, StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| StoreError::Tls(format!("{key}: not UTF-8 once decoded")))?;
        if !take(key, value.into_owned())? {
            kept.push(pair);
        }
    }
    Ok(if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    })
}

/// One `key = value` pair of a libpq string: where it is, and what it says.
struct Pair<'a> {
    text: &'a str,
    key: &'a str,
    value: String,
}

/// libpq's `key = value` pairs (a value may be single-quoted, with `\`
/// escaping the next character).
fn pairs(text: &str) -> Result<Vec<Pair<'_>>, StoreError> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    let skip_space = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_space(i);
        if i >= bytes.len() {
            break;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &text[start..i];
        i = skip_space(i);
        if bytes.get(i) != Some(&b'=') {
            return Err(StoreError::Tls(format!(
                "connection string: {key:?} has no value"
            )));
        }
        i = skip_space(i + 1);
        let mut value = String::new();
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => {
                        return Err(StoreError::Tls(format!(
                            "connection string: the value of {key} has no closing quote"
                        )));
                    }
                    Some(b'\'') => break,
                    Some(b'\\') if i + 1 < bytes.len() => i += 1,
                    Some(_) => {}
                }
                let c = text[i..].chars().next().unwrap_or_default();
                value.push(c);
                i += c.len_utf8();
            }
            i += 1;
        } else {
            let from = i;
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            value.push_str(&text[from..i]);
        }
        found.push(Pair {
            text: &text[start..i],
            key,
            value,
        });
    }
    Ok(found)
}

/// The pairs `take` keeps are dropped, the others kept as written.
fn split_pairs(text: &str, take: &mut Take<'_>) -> Result<String, StoreError> {
    let mut kept = Vec::new();
    for pair in pairs(text)? {
        if !take(pair.key, pair.value)? {
            kept.push(pair.text);
        }
    }
    Ok(kept.join(" "))
}

/// `text` (libpq pairs) with its password masked; nothing of it when it
/// does not parse (a password may be anywhere in what did not).
pub(crate) fn redact_pairs(text: &str) -> String {
    match pairs(text) {
        Ok(pairs) => pairs
            .iter()
            .map(|p| {
                if p.key.eq_ignore_ascii_case("password") {
                    format!("{}=***", p.key)
                } else {
                    p.text.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => "(a connection string that does not parse)".into(),
    }
}

/// How to open a connection: the client's configuration, and TLS unless
/// `sslmode=disable`.
#[derive(Clone)]
pub(crate) struct PgConnect {
    pub config: postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

impl PgConnect {
    /// From a connection string (URL or `key=value`); the password is
    /// `password` when given (never also in the string), else the string's,
    /// else `PGPASSWORD`'s.
    pub fn parse(url: &str, password: Option<&str>) -> Result<PgConnect, StoreError> {
        let (rest, options) = split_options(url)?;
        let mut config: postgres::Config = rest
            .parse()
            .map_err(|_| StoreError::Url(crate::redact_url(url)))?;
        match password {
            Some(_) if config.get_password().is_some() => {
                return Err(StoreError::Options(
                    "the URL holds a password and another was given apart: give it once".into(),
                ));
            }
            Some(given) => {
                config.password(given);
            }
            None => {
                if config.get_password().is_none()
                    && let Ok(password) = std::env::var("PGPASSWORD")
                {
                    config.password(password);
                }
            }
        }
        config.application_name("moat");
        // As libpq: sslmode means nothing over a unix socket, where the
        // server offers no TLS (the client here would refuse `require`).
        let local = !config.get_hosts().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|h| matches!(h, postgres::config::Host::Unix(_)))
            && config.get_hostaddrs().is_empty();
        if local {
            config.ssl_mode(postgres::config::SslMode::Disable);
            return Ok(PgConnect { config, tls: None });
        }
        config.ssl_mode(match options.mode {
            SslMode::Disable => postgres::config::SslMode::Disable,
            SslMode::Prefer => postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                postgres::config::SslMode::Require
            }
        });
        let tls = client_config(&options)?.map(tokio_postgres_rustls::MakeRustlsConnect::new);
        Ok(PgConnect { config, tls })
    }

    pub fn connect(&self) -> Result<postgres::Client, postgres::Error> {
        match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(postgres::NoTls),
        }
    }
}

/// The client's TLS configuration for `options`; `None` for `disable`.
pub fn client_config(options: &TlsOptions) -> Result<Option<ClientConfig>, StoreError> {
    if options.mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Tls(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match &options.root {
        None => Arc::new(Unchecked(provider)),
        Some(root) => {
            let roots = Arc::new(roots(root)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| StoreError::Tls(e.to_string()))?;
            if options.mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
    };
    Ok(Some(
        builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    ))
}

fn roots(root: &RootCert) -> Result<RootCertStore, StoreError> {
    let file = match root {
        RootCert::File(path) => path.clone(),
        RootCert::System => std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/etc/ssl/certs/ca-certificates.crt")),
    };
    let unreadable =
        |e: &dyn std::fmt::Display| StoreError::Tls(format!("sslrootcert {}: {e}", file.display()));
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&file).map_err(|e| unreadable(&e))? {
        store
            .add(cert.map_err(|e| unreadable(&e))?)
            .map_err(|e| unreadable(&e))?;
    }
    if store.is_empty() {
        return Err(unreadable(&"no certificate in it"));
    }
    Ok(store)
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not
/// checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without `sslrootcert`, as libpq: encrypted, the
/// certificate not checked (the handshake's signatures still are). This
/// stops a listener, not an impostor: only `verify-full` does.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, TlsOptions) {
        match split_options(url) {
            Ok(split) => split,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn tls_options_leave_the_string_and_the_rest_stays_as_written() {
        let (rest, tls) = split(
            "host=db.example port=5432 sslmode=verify-full sslrootcert='/etc/moat/ca dir/ca.pem' \
             user=moat password='it\\'s'",
        );
        assert_eq!(
            rest,
            "host=db.example port=5432 user=moat password='it\\'s'"
        );
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(
            tls.root,
            Some(RootCert::File("/etc/moat/ca dir/ca.pem".into()))
        );

        let (rest, tls) = split(
            "postgres://moat:pw@db:5432/moat?application_name=x&sslmode=require&sslrootcert=%2Fca.pem",
        );
        assert_eq!(rest, "postgres://moat:pw@db:5432/moat?application_name=x");
        assert_eq!(tls.mode, SslMode::Require);
        assert_eq!(tls.root, Some(RootCert::File("/ca.pem".into())));

        // The machine's trust store: verify-full, unless said otherwise
        // (which is refused below).
        let (rest, tls) = split("postgresql://db/moat?sslrootcert=system");
        assert_eq!(rest, "postgresql://db/moat");
        assert_eq!(
            (tls.mode, tls.root),
            (SslMode::VerifyFull, Some(RootCert::System))
        );

        // `://` in a value does not make a key=value string a URL.
        let (rest, tls) = split("host=db sslmode=require application_name=http://x");
        assert_eq!(rest, "host=db application_name=http://x");
        assert_eq!(tls.mode, SslMode::Require);

        let (rest, tls) = split("host = /run/postgresql dbname=moat");
        assert_eq!(rest, "host = /run/postgresql dbname=moat");
        assert_eq!((tls.mode, tls.root), (SslMode::Prefer, None));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused() {
        for bad in [
            "host=db sslmode=verify-full",
            "postgres://db/moat?sslmode=verify-ca",
            "host=db sslmode=sometimes",
            "postgres://db/moat?sslmode=verify-ca&sslrootcert=system",
            "host=db sslmode=require sslrootcert=system",
            "host=db sslrootcert='/unterminated",
            "host=db sslmode",
        ] {
            assert!(
                matches!(split_options(bad), Err(StoreError::Tls(_))),
                "{bad}"
            );
        }
    }
}
