//! The one way out for connections Moat opens itself: the egress proxy's
//! (for a sandbox, and `http_request`) and the control plane's tool calls.
//! A name is resolved once, every address it resolves to is checked, and
//! only those addresses are dialled. Nothing is looked up a second time, so
//! an answer that changes between the check and the connection (DNS
//! rebinding) cannot lead anywhere the check did not see.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{HeaderName, HeaderValue};
pub use hyper::{Method, Uri};
use hyper_util::rt::TokioIo;
use moat_core::DenialReason;
use tokio::net::TcpStream;

use crate::addr::AddressPolicy;
use crate::proxy::strip_hop_by_hop;

const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a connection or an exchange did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    /// The name resolves to an address the policy refuses.
    #[error("{host} resolves to {ip} ({class})")]
    AddressNotAllowed {
        host: String,
        ip: IpAddr,
        class: &'static str,
    },
    /// The name does not resolve, no address accepts the connection, or the
    /// exchange broke off.
    #[error("{0}")]
    Unreachable(String),
    /// The request itself is malformed (method, header).
    #[error("{0}")]
    Invalid(String),
}

impl OutboundError {
    pub fn reason(&self) -> DenialReason {
        match self {
            OutboundError::AddressNotAllowed { .. } => DenialReason::AddressNotAllowed,
            OutboundError::Unreachable(_) => DenialReason::UpstreamUnreachable,
            OutboundError::Invalid(_) => DenialReason::InvalidArgs,
        }
    }
}

/// Where names resolve (fixed answers first, then the system resolver) and
/// which addresses may be dialled.
#[derive(Clone, Copy)]
pub struct Gate<'a> {
    hosts: &'a BTreeMap<String, Vec<IpAddr>>,
    addresses: &'a AddressPolicy,
}

impl<'a> Gate<'a> {
    pub fn new(hosts: &'a BTreeMap<String, Vec<IpAddr>>, addresses: &'a AddressPolicy) -> Self {
        Gate { hosts, addresses }
    }

    /// Every address of `host` (a name or an address, without brackets),
    /// each checked; one refused address refuses the name.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, OutboundError> {
        let addresses = self.lookup(host, port).await?;
        for address in &addresses {
            if let Err(class) = self.addresses.check(address.ip()) {
                return Err(OutboundError::AddressNotAllowed {
                    host: host.to_owned(),
                    ip: address.ip(),
                    class,
                });
            }
        }
        Ok(addresses)
    }

    /// A connection to one of the addresses [`Gate::resolve`] checked, tried
    /// in order.
    pub async fn connect(
        &self,
        host: &str,
        port: u16,
    ) -> Result<(TcpStream, SocketAddr), OutboundError> {
        let mut last = String::from("no address");
        for address in self.resolve(host, port).await? {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok((stream, address));
                }
                Ok(Err(e)) => last = format!("connecting to {address}: {e}"),
                Err(_) => last = format!("connecting to {address}: timed out"),
            }
        }
        Err(OutboundError::Unreachable(format!("{host}: {last}")))
    }

    async fn lookup(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, OutboundError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        if let Some(fixed) = self.hosts.get(host) {
            return Ok(fixed.iter().map(|ip| SocketAddr::new(*ip, port)).collect());
        }
        let unreachable =
            |why: String| OutboundError::Unreachable(format!("resolving {host}: {why}"));
        // RFC 6761 6.4: resolver libraries answer these at once, and never
        // ask a name server.
        if host == "invalid" || host.ends_with(".invalid") {
            return Err(unreachable("names under .invalid never resolve".to_owned()));
        }
        // As given, not with a trailing dot: glibc's files backend does not
        // match "name." against /etc/hosts. Names with a dot are tried as
        // they are before any search domain; whatever they resolve to is
        // checked all the same.
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(found)) => {
                let mut all: Vec<SocketAddr> = found.collect();
                all.dedup();
                if all.is_empty() {
                    return Err(unreachable("no address".to_owned()));
                }
                Ok(all)
            }
            Ok(Err(e)) => Err(unreachable(e.to_string())),
            Err(_) => Err(unreachable("timed out".to_owned())),
        }
    }
}

/// TLS client settings.
pub type TlsConfig = Arc<rustls::ClientConfig>;

/// TLS client settings: the bundled Mozilla roots, plus `extra_pem`.
pub fn tls_config(extra_pem: Option<&[u8]>) -> Result<TlsConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_pem {
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("extra CA certificates: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("extra CA certificate: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// An HTTP request Moat makes itself, to an absolute `http(s)://` URI.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: Method,
    pub uri: Uri,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// What came back: the body up to the cap asked for.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body was longer than the cap and was cut there.
    pub truncated: bool,
}

/// Where a request goes: TLS or not, the host (its name, for TLS and the
/// gate) and the port.
pub(crate) struct Target {
    pub(crate) tls: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl HttpRequest {
    pub(crate) fn target(&self) -> Result<Target, OutboundError> {
        let invalid = |m: &str| OutboundError::Invalid(m.to_owned());
        let tls = match self.uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(invalid("the URL must start with http:// or https://")),
        };
        let authority = self
            .uri
            .authority()
            .ok_or_else(|| invalid("the URL has no host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid("the URL carries user information"));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(invalid("the URL has no host"));
        }
        Ok(Target {
            tls,
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
        })
    }

    /// The request as sent: origin form, `Host` from the URI, hop-by-hop
    /// headers removed.
    pub(crate) fn build(&self) -> Result<Request<Full<Bytes>>, OutboundError> {
        if self.method == Method::CONNECT {
            return Err(OutboundError::Invalid(
                "CONNECT is not a request Moat makes".into(),
            ));
        }
        let path = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut builder = Request::builder().method(self.method.clone()).uri(path);
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| OutboundError::Invalid(format!("header name {name:?}")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| OutboundError::Invalid(format!("header {name} has a bad value")))?;
            builder = builder.header(name, value);
        }
        let mut req = builder
            .body(Full::new(Bytes::from(self.body.clone())))
            .map_err(|e| OutboundError::Invalid(e.to_string()))?;
        strip_hop_by_hop(req.headers_mut());
        if let Some(value) = self
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(hyper::header::HOST, value);
        }
        Ok(req)
    }
}

/// One HTTP/1.1 exchange through `gate`: no redirect is followed and no
/// proxy from the environment is used. The response body is read up to
/// `cap` bytes. Returns the address it went to.
pub async fn request(
    gate: &Gate<'_>,
    tls: &TlsConfig,
    request: &HttpRequest,
    cap: u64,
) -> Result<(HttpResponse, SocketAddr), OutboundError> {
    let target = request.target()?;
    let req = request.build()?;
    let (stream, address) = gate.connect(&target.host, target.port).await?;
    let tls = target.tls.then(|| (tls.clone(), target.host.as_str()));
    let response = exchange(stream, tls, req, cap)
        .await
        .map_err(OutboundError::Unreachable)?;
    Ok((response, address))
}

/// Sends `req` over `io` (in TLS with the named server first, when given).
pub(crate) async fn exchange<I>(
    io: I,
    tls: Option<(Arc<rustls::ClientConfig>, &str)>,
    req: Request<Full<Bytes>>,
    cap: u64,
) -> Result<HttpResponse, String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    match tls {
        Some((config, host)) => {
            let connector = tokio_rustls::TlsConnector::from(config);
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|_| format!("{host} is not a TLS server name"))?;
            let stream = connector
                .connect(name, io)
                .await
                .map_err(|e| format!("TLS with {host}: {e}"))?;
            send(TokioIo::new(stream), req, cap).await
        }
        None => send(TokioIo::new(io), req, cap).await,
    }
}

async fn send<I>(io: I, req: Request<Full<Bytes>>, cap: u64) -> Result<HttpResponse, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let mut body = response.into_body();
    let mut content = Vec::new();
    let mut truncated = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Some(data) = frame.data_ref() {
            let room = cap.saturating_sub(content.len() as u64) as usize;
            if data.len() > room {
                content.extend_from_slice(&data[..room]);
                truncated = true;
                break;
            }
            content.extend_from_slice(data);
        }
    }
    Ok(HttpResponse {
        status,
        headers,
        body: content,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(url: &str) -> HttpRequest {
        HttpRequest {
            method: Method::GET,
            uri: url.parse().unwrap(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    #[test]
    fn a_target_is_read_from_the_uri_once() {
        let t = request("https://api.example.com/v1?a=b").target().unwrap();
        assert_eq!(
            (t.tls, t.host.as_str(), t.port),
            (true, "api.example.com", 443)
        );
        let t = request("http://[::1]:8080/").target().unwrap();
        assert_eq!((t.tls, t.host.as_str(), t.port), (false, "::1", 8080));
        for bad in ["ftp://x/y", "/relative", "http://user@host/"] {
            assert!(request(bad).target().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn every_address_is_checked_and_fixed_answers_come_first() {
        let hosts = BTreeMap::from([(
            "app.test".to_owned(),
            vec![
                "93.184.216.34".parse().unwrap(),
                "10.0.0.1".parse().unwrap(),
            ],
        )]);
        let closed = AddressPolicy::default();
        let gate = Gate::new(&hosts, &closed);
        let refused = gate.resolve("app.test", 80).await.unwrap_err();
        assert_eq!(refused.reason(), DenialReason::AddressNotAllowed);
        assert!(
            refused.to_string().contains("10.0.0.1 (private)"),
            "{refused}"
        );
        let open = AddressPolicy {
            allowed: vec!["10.0.0.0/8".parse().unwrap()],
        };
        let found = Gate::new(&hosts, &open)
            .resolve("app.test", 80)
            .await
            .unwrap();
        assert_eq!(found.len(), 2);
        let missing = gate.resolve("nothing.invalid", 80).await.unwrap_err();
        assert_eq!(missing.reason(), DenialReason::UpstreamUnreachable);
    }
}
