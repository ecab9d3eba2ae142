//! Commands an operator runs against a control plane: `moat approvals`,
//! `moat runs`, `moat audit`, `moat orgs`, `moat volumes` and `moat runner drain`. They take the control plane's address and the org's admin
//! token from flags or the environment (`moat up` prints both), never the
//! token itself on the command line.

pub mod approvals;
pub mod audit;
pub mod orgs;
pub mod runs;
pub mod volumes;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
pub use moat_core::url::encode_component as segment;
use serde_json::Value;

use moat_client::OrgClient;

/// Where the control plane is and how to sign in.
#[derive(Args, Clone)]
pub struct Target {
    /// The control plane's address.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "MOAT_CONTROL_PLANE",
        default_value = "http://127.0.0.1:7700"
    )]
    pub control_plane: String,
    /// File holding the org's admin token (or set MOAT_TOKEN).
    #[arg(long, global = true, value_name = "FILE", env = "MOAT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Trust only the certificate authorities in this PEM file for an
    /// https:// control plane (a private CA; default: the public roots).
    #[arg(long, global = true, value_name = "FILE", env = "MOAT_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

/// The token in `file`, else in `$MOAT_TOKEN`, trimmed; `what` says which
/// token is wanted when there is none.
pub fn read_token(file: Option<&std::path::Path>, what: &str) -> anyhow::Result<String> {
    let token = match (file, std::env::var("MOAT_TOKEN")) {
        (Some(path), _) => std::fs::read_to_string(path)
            .with_context(|| format!("--token-file {}", path.display()))?,
        (None, Ok(token)) => token,
        (None, Err(_)) => bail!("no token: give --token-file FILE or set MOAT_TOKEN ({what})"),
    };
    let token = token.trim().to_owned();
    if token.is_empty() {
        bail!("the token is empty");
    }
    Ok(token)
}

/// An authenticated HTTP client for one control plane.
pub struct Api {
    client: OrgClient,
}

impl Api {
    pub fn new(target: &Target) -> anyhow::Result<Api> {
        let token = read_token(
            target.token_file.as_deref(),
            "the org's admin token; `moat up` prints where it is",
        )?;
        let roots = target
            .ca_file
            .as_deref()
            .map(|path| moat_client::CaRoots::for_control_plane(path, &target.control_plane))
            .transpose()?;
        Ok(Api {
            client: OrgClient::with_roots(
                &target.control_plane,
                &token,
                Duration::from_secs(30),
                roots.as_ref(),
            ),
        })
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        Ok(self.client.get(path)?)
    }

    pub fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        Ok(self.client.post(path, body)?)
    }

    pub fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        Ok(self
            .client
            .put_answer(path, body)?
            .json(&format!("PUT {path}"))?)
    }
}
