//! What a proxy serves: the rules of one sandbox (or one `http_request`),
//! and the limits and resolver settings of the whole run.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::addr::{AddressPolicy, Cidr, CidrError};
use crate::rules::{RuleError, RuleSet, normalize_host};

/// Domain rules and address exceptions, as given (see [`crate::rules`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressPolicy {
    /// `api.example.com`, `*.example.com`, optionally with `:port`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Same syntax; wins over `allow`.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Non-public ranges that may still be dialled (`10.0.0.0/8`, `127.0.0.1`).
    #[serde(default)]
    pub allow_addresses: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Rule(#[from] RuleError),
    #[error(transparent)]
    Address(#[from] CidrError),
    #[error("resolve entry {0:?}: give NAME=ADDRESS[,ADDRESS...]")]
    Resolve(String),
}

/// An [`EgressPolicy`], parsed.
#[derive(Debug, Clone, Default)]
pub struct CompiledPolicy {
    pub rules: RuleSet,
    pub addresses: AddressPolicy,
}

impl EgressPolicy {
    pub fn compile(&self) -> Result<CompiledPolicy, PolicyError> {
        Ok(CompiledPolicy {
            rules: RuleSet::parse(&self.allow, &self.deny)?,
            addresses: AddressPolicy {
                allowed: self
                    .allow_addresses
                    .iter()
                    .map(|c| c.parse::<Cidr>())
                    .collect::<Result<_, _>>()?,
            },
        })
    }
}

/// Per-run ceilings, shared by every sandbox and request of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressLimits {
    /// Requests (CONNECT tunnels and forwarded requests), allowed or not.
    pub max_requests: u64,
    /// Bytes to and from upstream servers, both directions together.
    pub max_bytes: u64,
    /// Tunnels and forwarded requests open at once.
    pub max_connections: u64,
}

impl Default for EgressLimits {
    fn default() -> Self {
        EgressLimits {
            max_requests: 10_000,
            max_bytes: 1 << 30,
            max_connections: 256,
        }
    }
}

/// Settings of one proxy process (one run).
#[derive(Debug, Clone, Default)]
pub struct EgressConfig {
    pub run_id: String,
    pub limits: EgressLimits,
    /// Fixed answers for the proxy's resolver (like curl's `--resolve`),
    /// consulted before the system resolver.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Extra trusted roots (PEM) for `http_request` over HTTPS, besides the
    /// bundled Mozilla roots.
    pub extra_roots_pem: Option<Vec<u8>>,
    /// Run even if the proxy cannot confine itself with Landlock.
    pub allow_degraded: bool,
}

/// Parses `NAME=ADDRESS[,ADDRESS...]` into a hosts entry.
pub fn parse_resolve(entry: &str) -> Result<(String, Vec<IpAddr>), PolicyError> {
    let bad = || PolicyError::Resolve(entry.to_owned());
    let (name, addrs) = entry.split_once('=').ok_or_else(bad)?;
    let name = normalize_host(name.trim()).ok_or_else(bad)?;
    let addrs: Vec<IpAddr> = addrs
        .split(',')
        .map(|a| a.trim().parse())
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    if addrs.is_empty() {
        return Err(bad());
    }
    Ok((name, addrs))
}
