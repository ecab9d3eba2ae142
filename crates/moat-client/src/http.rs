//! One HTTP connection pool to one control plane, and its answers.

use std::time::Duration;

use moat_api::ErrorBody;
use serde::de::DeserializeOwned;

use crate::ClientError;

/// The largest answer read (a claim carries the run's inputs).
const BODY_LIMIT: u64 = 256 << 20;

pub(crate) struct Http {
    base: String,
    agent: ureq::Agent,
}

/// An answer: its status and body bytes.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as `T` if the status is a success; the refusal otherwise.
    pub fn json<T: DeserializeOwned>(&self, what: &str) -> Result<T, ClientError> {
        if !(200..300).contains(&self.status) {
            return Err(self.refusal(what));
        }
        serde_json::from_slice(&self.body).map_err(|e| ClientError::Malformed {
            what: what.to_owned(),
            status: self.status,
            message: e.to_string(),
        })
    }

    /// This answer as a [`ClientError::Refused`] (the body's reason and
    /// message; a body that is not an error body is quoted as the message).
    pub fn refusal(&self, what: &str) -> ClientError {
        match serde_json::from_slice::<ErrorBody>(&self.body) {
            Ok(body) => ClientError::Refused {
                what: what.to_owned(),
                status: self.status,
                reason: body.error.reason,
                message: body.error.message,
            },
            Err(_) => ClientError::Refused {
                what: what.to_owned(),
                status: self.status,
                reason: "unknown".to_owned(),
                message: String::from_utf8_lossy(&self.body)
                    .chars()
                    .take(512)
                    .collect(),
            },
        }
    }
}

impl Http {
    /// `roots`: trust only these CAs for `https://` (default: Mozilla's).
    pub fn with_roots(base: &str, timeout: Duration, roots: Option<&crate::CaRoots>) -> Http {
        // Each phase bounded, not the call as a whole: with a bound on the
        // whole call, ureq resolves the host on a thread of its own at
        // every request (so that it can stop waiting for it), which was a
        // thread started and ended per request, three per operation on a
        // runner. A lookup is bounded by the system resolver's own timeouts.
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(timeout))
            .timeout_send_request(Some(timeout))
            .timeout_send_body(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .timeout_recv_body(Some(timeout));
        if let Some(roots) = roots {
            config = config.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(roots.root_certs())
                    .build(),
            );
        }
        Http {
            base: base.trim_end_matches('/').to_owned(),
            agent: config.build().into(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET` (no body), `PUT` or `POST` (with `body`, JSON; `POST` without
    /// one is empty) of `path_and_query`.
    pub fn send(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &[(&str, String)],
        body: Option<&[u8]>,
    ) -> Result<Answer, ClientError> {
        let url = format!("{}{}", self.base, path_and_query);
        let response = match method {
            "GET" => {
                let mut request = self.agent.get(&url);
                for (name, value) in headers {
                    request = request.header(*name, value);
                }
                request.call()
            }
            _ => {
                let request = if method == "PUT" {
                    self.agent.put(&url)
                } else {
                    self.agent.post(&url)
                };
                let mut request = request.header("content-type", "application/json");
                for (name, value) in headers {
                    request = request.header(*name, value);
                }
                request.send(body.unwrap_or_default())
            }
        };
        let unreachable = |e: ureq::Error| ClientError::Unreachable {
            base: self.base.clone(),
            message: e.to_string(),
        };
        let mut response = response.map_err(unreachable)?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(BODY_LIMIT)
            .read_to_vec()
            .map_err(unreachable)?;
        Ok(Answer { status, body })
    }
}
