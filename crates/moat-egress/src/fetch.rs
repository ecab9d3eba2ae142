//! `http_request` made by the proxy itself: the same gate as proxied
//! traffic, TLS verified against the bundled Mozilla roots (plus any the run
//! adds), credential headers stripped from what returns, the body capped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use hyper::{Method, Uri};
use moat_core::DenialReason;
use serde::{Deserialize, Serialize};

use crate::gate::{Access, Refused, Scope};
use crate::outbound::{HttpRequest, HttpResponse, exchange};
use crate::proxy::{Counts, Metered};

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
            // A server out of reach is a failure of the operation, not a denial.
            reason: r.is_denial().then_some(r.reason),
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
    let method: Method = request
        .method
        .to_ascii_uppercase()
        .parse()
        .map_err(|_| invalid(format!("{:?} is not an HTTP method", request.method)))?;
    let body = match &request.body_base64 {
        Some(b) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|_| invalid("bodyBase64 is not base64"))?,
        None => Vec::new(),
    };
    let outbound = HttpRequest {
        method,
        uri,
        headers: request.headers.clone().into_iter().collect(),
        body,
    };
    let target = outbound.target().map_err(|e| invalid(e.to_string()))?;
    let req = outbound.build().map_err(|e| invalid(e.to_string()))?;
    let access = Access {
        method: outbound.method.as_str(),
        host: &target.host,
        port: target.port,
        started,
    };
    let admitted = match scope.admit(&target.host, target.port).await {
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
    let cap = request.max_response_bytes;
    let exchange = async {
        let tls = match target.tls {
            true => Some((scope.run.tls_config()?, host.as_str())),
            false => None,
        };
        exchange(metered, tls, req, cap).await
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
            Ok(shown(response))
        }
        Err(message) => {
            let refused = if counts.limit_hit.load(std::sync::atomic::Ordering::Relaxed) {
                Refused::deny(
                    DenialReason::EgressLimit,
                    "the run's egress byte limit is spent",
                )
            } else {
                Refused::fail(message)
            };
            scope.refused(&access, &refused);
            Err(refused.into())
        }
    }
}

/// The response as the agent gets it: credential-bearing headers removed
/// (and named), the body in base64.
fn shown(response: HttpResponse) -> FetchResponse {
    let mut headers = Vec::new();
    let mut stripped: Vec<String> = Vec::new();
    for (name, value) in response.headers {
        if is_credential_header(&name) {
            if !stripped.contains(&name) {
                stripped.push(name);
            }
            continue;
        }
        headers.push((name, value));
    }
    FetchResponse {
        status: response.status,
        headers,
        body_base64: base64::engine::general_purpose::STANDARD.encode(&response.body),
        truncated: response.truncated,
        stripped_headers: stripped,
    }
}
