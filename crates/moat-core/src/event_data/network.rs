//! Network events: from the egress proxy (a sandbox's connections, the
//! shell's `http_request`), the sandbox's seccomp layer (a connection past
//! the proxy), the shell (an operation asking for more network than its
//! manifest grants) and the control plane's tool proxy.
//!
//! The egress proxy and the sandbox say `detail`, the shell and the tool
//! proxy `message`: both keys are kept as they are today.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::denial::DenialReason;

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkDecision {
    /// It reached the server (it may have been cut later: `cut`).
    Allowed,
    /// The policy refused it (`reason`).
    Denied,
    /// It was allowed but the server could not be reached or the exchange broke off.
    Failed,
}

/// A request or connection was refused or cut, with the reason. Besides the
/// reason and its text, each source says what it knows: the egress proxy the
/// request (`host`, `port`, `method`; `dropped` once past its event cap),
/// seccomp the `address`, the tool proxy the `tool`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkDenied {
    /// Absent only when the egress proxy's records were lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<DenialReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// `ip:port` a program connected to directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `seccomp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    /// What the program got: `EACCES`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<String>,
    /// Events not kept past the proxy's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
    /// `control-plane-tool-proxy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// `tool-token`: a program's own call with its one-operation token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// One request, allowed or not: through the egress proxy, or a tool call
/// by the control plane. Never bodies, queries or credential headers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkRequest {
    /// The host name asked for (clipped to 256 bytes).
    pub host: String,
    pub method: String,
    pub port: u16,
    pub decision: NetworkDecision,
    /// The address connected to (allowed requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The server's HTTP status, when there was one to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_out: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_in: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Why it was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<DenialReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why an allowed connection was cut before its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<DenialReason>,
    /// `control-plane-tool-proxy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The URL path, without the query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `tool-token`: a program's own call with its one-operation token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

impl NetworkRequest {
    /// A request to `host:port` and what became of it; the rest unknown.
    pub fn new(host: String, port: u16, method: String, decision: NetworkDecision) -> Self {
        NetworkRequest {
            host,
            method,
            port,
            decision,
            address: None,
            status: None,
            bytes_out: None,
            bytes_in: None,
            duration_ms: None,
            reason: None,
            detail: None,
            message: None,
            cut: None,
            profile: None,
            tool: None,
            path: None,
            via: None,
            sandbox_run_id: None,
            runner_id: None,
            runner_hash: None,
            manifest_hash: None,
        }
    }
}

/// One connection from outside to a port an `ingress-only` sandbox exposes
/// (through `moat exec --expose`'s socket, or a managed run's
/// `/v1/runs/{run}/ports/{port}/` route, one request per connection). What is recorded comes from the
/// first bytes each way, read as HTTP when they are: the first request's
/// method and path (without the query) and the answer's status. Never
/// bodies, queries or headers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkIngress {
    /// The sandbox's port.
    pub port: u16,
    /// The first request's method, when the connection spoke HTTP/1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The first request's path, without the query (clipped to 256 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The first answer's HTTP status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Bytes from the runtime's side to the program.
    pub bytes_in: u64,
    /// Bytes from the program back.
    pub bytes_out: u64,
    pub duration_ms: u64,
    /// Why the connection did not reach the program (nothing listened on
    /// the port) or was cut, when it did not or was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// On the last record of a sandbox that had more connections than it
    /// records: how many more there were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unrecorded: Option<u64>,
    /// The sandbox, when a shell's operation ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    /// The runner that served it (added by the control plane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}
