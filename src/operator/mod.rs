//! Commands an operator runs against a control plane: `moat approvals` and
//! `moat audit`. They take the control plane's address and the org's admin
//! token from flags or the environment (`moat up` prints both), never the
//! token itself on the command line.

pub mod approvals;
pub mod audit;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
pub use moat_core::url::encode_component as segment;
use serde_json::Value;

use crate::runner::client::{Answer, error_text};

/// Where the control plane is and how to sign in.
#[derive(Args, Clone)]
pub struct Target {
    /// The control plane's address.
    #[arg(
        long,
        value_name = "URL",
        env = "MOAT_CONTROL_PLANE",
        default_value = "http://127.0.0.1:7700"
    )]
    pub control_plane: String,
    /// File holding the org's admin token (or set MOAT_TOKEN).
    #[arg(long, value_name = "FILE", env = "MOAT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

/// An authenticated HTTP client for one control plane.
pub struct Api {
    base: String,
    token: String,
    agent: ureq::Agent,
}

impl Api {
    pub fn new(target: &Target) -> anyhow::Result<Api> {
        let token = match (&target.token_file, std::env::var("MOAT_TOKEN")) {
            (Some(path), _) => std::fs::read_to_string(path)
                .with_context(|| format!("--token-file {}", path.display()))?,
            (None, Ok(token)) => token,
            (None, Err(_)) => bail!(
                "no token: give --token-file FILE or set MOAT_TOKEN (the org's admin token; `moat up` prints where it is)"
            ),
        };
        let token = token.trim().to_owned();
        if token.is_empty() {
            bail!("the token is empty");
        }
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        Ok(Api {
            base: target.control_plane.trim_end_matches('/').to_owned(),
            token,
            agent,
        })
    }

    fn answer(
        &self,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<Value> {
        let mut response =
            response.with_context(|| format!("reaching the control plane at {}", self.base))?;
        let status = response.status().as_u16();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .context("reading the control plane's answer")?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let answer = Answer { status, body };
        if !(200..300).contains(&status) {
            bail!("the control plane refused: {}", error_text(&answer));
        }
        Ok(answer.body)
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        let response = self
            .agent
            .get(&format!("{}{path}", self.base))
            .header("authorization", &format!("Bearer {}", self.token))
            .call();
        self.answer(response)
    }

    pub fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let response = self
            .agent
            .post(&format!("{}{path}", self.base))
            .header("authorization", &format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes());
        self.answer(response)
    }
}
