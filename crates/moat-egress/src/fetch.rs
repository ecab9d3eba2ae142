//! `http_request` made by the proxy itself: the same gate as proxied
//! traffic, TLS verified against the bundled Mozilla roots (plus any the run
//! adds), credential headers stripped from what returns, the body capped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use moat_core::DenialReason;
use serde::{Deserialize, Serialize};

use crate::gate::{Access, Refused, Scope};
use crate::proxy::{Counts, Metered, strip_hop_by_hop};

const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

/// A request as the agent gives it (body base64).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FetchRequest {
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    pub max_response_bytes: u64,
}

/// What came back, with credential-bearing headers removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FetchResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body_base64: String,
    /// The body was longer than `maxResponseBytes` and was cut there.
    pub truncated: bool,
    /// Names of the headers that were removed.
    pub stripped_headers: Vec<String>,
}

/// Why there is no response: a denial, or a failure to reach the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FetchError {
    pub reason: Option<DenialReason>,
    pub message: String,
}

/// Response headers never shown to the agent: they carry credentials or
/// session state that belongs to the host side.
pub fn is_credential_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "set-cookie"
            | "set-cookie2"
            | "cookie"
            | "authorization"
            | "proxy-authorization"
            | "proxy-authenticate"
            | "www-authenticate"
            | "x-api-key"
            | "x-amz-security-token"
            | "authentication-info"
            | "proxy-authentication-info"
    ) || name.contains("token")
        || name.contains("secret")
        || name.contains("api-key")
        || name.contains("apikey")
        || name.starts_with("x-auth")
}

fn invalid(message: impl Into<String>) -> FetchError {
    FetchError {
        reason: Some(DenialReason::InvalidArgs),
        message: message.into(),
    }
}

impl From<Refused> for FetchError {
    fn from(r: Refused) -> Self {
        FetchError {
            reason: r.reason,
            message: r.detail,
        }
    }
}

pub(crate) async fn fetch(
    scope: &Scope,
    request: &FetchRequest,
) -> Result<FetchResponse, FetchError> {
    let started = Instant::now();
    let uri: Uri = request
        .url
        .parse()
        .map_err(|_| invalid(format!("{:?} is not a URL", request.url)))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(invalid("the URL must start with http:// or https://")),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| invalid("the URL has no host"))?
        .clone();
    let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let method: Method = request
        .method
        .to_ascii_uppercase()
        .parse()
        .map_err(|_| invalid(format!("{:?} is not an HTTP method", request.method)))?;
    if method == Method::CONNECT {
        return Err(invalid("CONNECT is not a request http_request makes"));
    }
    let body = match &request.body_base64 {
        Some(b) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|_| invalid("bodyBase64 is not base64"))?,
        None => Vec::new(),
    };
    let raw_host = authority.host().to_owned();
    let access = Access {
        method: method.as_str(),
        host: &raw_host,
        port,
        started,
    };
    let admitted = match scope.admit(&raw_host, port).await {
        Ok(a) => a,
        Err(refused) => {
            scope.refused(&access, &refused);
            return Err(refused.into());
        }
    };
    let host = admitted.host.clone();
    let address = admitted.address;
    let counts = Arc::new(Counts::default());
    let metered = Metered {
        inner: admitted.stream,
        run: scope.run.clone(),
        counts: counts.clone(),
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut builder = Request::builder().method(method.clone()).uri(path);
    for (name, value) in &request.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("header name {name:?}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| invalid(format!("header {name} has a bad value")))?;
        builder = builder.header(name, value);
    }
    let mut req = builder
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| invalid(e.to_string()))?;
    strip_hop_by_hop(req.headers_mut());
    if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
        req.headers_mut().insert(hyper::header::HOST, value);
    }
    let cap = request.max_response_bytes;
    let exchange = async {
        if tls {
            let connector = tokio_rustls::TlsConnector::from(scope.run.tls_config()?);
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|_| format!("{host} is not a TLS server name"))?;
            let stream = connector
                .connect(name, metered)
                .await
                .map_err(|e| format!("TLS with {host}: {e}"))?;
            send(TokioIo::new(stream), req, cap).await
        } else {
            send(TokioIo::new(metered), req, cap).await
        }
    };
    let result = tokio::time::timeout(FETCH_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "{host}: no complete response in {} s",
                FETCH_TIMEOUT.as_secs()
            ))
        });
    let bytes = (
        counts.out.load(std::sync::atomic::Ordering::Relaxed),
        counts.into.load(std::sync::atomic::Ordering::Relaxed),
    );
    let access = Access {
        host: &host,
        ..access
    };
    match result {
        Ok(response) => {
            scope.completed(&access, address, Some(response.status), bytes, None);
            drop(admitted._slot);
            Ok(response)
        }
        Err(message) => {
            let refused = if counts.limit_hit.load(std::sync::atomic::Ordering::Relaxed) {
                Refused::deny(
                    DenialReason::EgressLimit,
                    "the run's egress byte limit is spent",
                )
            } else {
                Refused {
                    reason: None,
                    detail: message,
                }
            };
            scope.refused(&access, &refused);
            Err(refused.into())
        }
    }
}

async fn send<I>(io: I, req: Request<Full<Bytes>>, cap: u64) -> Result<FetchResponse, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let mut headers = Vec::new();
    let mut stripped = Vec::new();
    for (name, value) in response.headers() {
        if is_credential_header(name.as_str()) {
            if !stripped.iter().any(|s| s == name.as_str()) {
                stripped.push(name.as_str().to_owned());
            }
            continue;
        }
        headers.push((
            name.as_str().to_owned(),
            String::from_utf8_lossy(value.as_bytes()).into_owned(),
        ));
    }
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
    Ok(FetchResponse {
        status,
        headers,
        body_base64: base64::engine::general_purpose::STANDARD.encode(&content),
        truncated,
        stripped_headers: stripped,
    })
}
