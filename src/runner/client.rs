//! The runner's side of the control plane's API: plain calls and requests
//! signed with the per-boot key.

use std::time::{Duration, SystemTime};

use anyhow::Context;
use moat_core::request_sig;
use moat_core::sign::PrivateKey;
use serde_json::Value;

/// An HTTP answer: status and JSON body (`Null` when empty).
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

pub struct Client {
    base: String,
    agent: ureq::Agent,
    pub runner_id: String,
    pub key: PrivateKey,
}

pub fn random_hex(n: usize) -> String {
    moat_core::random::hex(n)
}

fn now_ms() -> i64 {
    moat_core::time::ms(SystemTime::now())
}

pub use moat_core::time::stamp;

impl Client {
    pub fn new(base: &str, key: PrivateKey) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(90)))
            .build()
            .into();
        Client {
            base: base.trim_end_matches('/').to_owned(),
            agent,
            runner_id: String::new(),
            key,
        }
    }

    /// `POST /v1/runner/register` with the bootstrap token.
    pub fn register(&self, token: &str, registration: &Value) -> anyhow::Result<Answer> {
        let response = self
            .agent
            .post(&format!("{}/v1/runner/register", self.base))
            .header("authorization", &format!("Bearer {token}"))
            .header("content-type", "application/json")
            .send(registration.to_string().as_bytes());
        Self::answer(response)
    }

    fn answer(
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<Answer> {
        let mut response = response.context("reaching the control plane")?;
        let status = response.status().as_u16();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_vec()
            .context("reading the control plane's answer")?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        Ok(Answer { status, body })
    }

    /// A request signed with the per-boot key.
    pub fn signed(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Answer> {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let ts = now_ms();
        let nonce = random_hex(16);
        let signature = request_sig::Signed {
            runner: &self.runner_id,
            method,
            path_and_query: path,
            timestamp_ms: ts,
            nonce: &nonce,
            body: &bytes,
        }
        .sign(&self.key);
        let url = format!("{}{}", self.base, path);
        let headers = [
            (request_sig::RUNNER, self.runner_id.clone()),
            (request_sig::TIMESTAMP, ts.to_string()),
            (request_sig::NONCE, nonce),
            (request_sig::SIGNATURE, signature),
        ];
        let response = if method == "GET" {
            let mut req = self.agent.get(&url);
            for (k, v) in &headers {
                req = req.header(*k, v);
            }
            req.call()
        } else {
            let mut req = self
                .agent
                .post(&url)
                .header("content-type", "application/json");
            for (k, v) in &headers {
                req = req.header(*k, v);
            }
            req.send(&bytes[..])
        };
        Self::answer(response)
    }

    /// `signed`, retried while the control plane cannot be reached or is
    /// unavailable (a restart): the runner reconnects and goes on.
    pub fn signed_retrying(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Answer> {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.signed(method, path, body) {
                Ok(a) if a.status != 502 && a.status != 503 && a.status != 504 => return Ok(a),
                Ok(a) => eprintln!(
                    "moat runner: control plane answered {} ({}); retrying",
                    a.status, a.body
                ),
                Err(e) => eprintln!("moat runner: {e:#}; retrying in {delay:?}"),
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }
}

pub fn error_text(a: &Answer) -> String {
    format!(
        "{} {}: {}",
        a.status,
        a.body["error"]["reason"].as_str().unwrap_or("?"),
        a.body["error"]["message"].as_str().unwrap_or("")
    )
}
