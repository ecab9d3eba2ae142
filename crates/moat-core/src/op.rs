//! The operation envelope an agent sends, the typed arguments of each
//! operation, and the result Moat answers with.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::denial::DenialReason;
use crate::mode::NetworkMode;

/// One operation request. Unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Envelope {
    pub id: String,
    pub run_id: String,
    pub correlation_id: String,
    pub op: String,
    /// The operation's arguments; their schema depends on `op`.
    pub args: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// A signed capability from the control plane (managed mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_decision_ref: Option<String>,
    /// The one-operation token for `args.toolToken`, added by the runner
    /// from the control plane's dispatch. Read, never written back out (not
    /// to the ledger, not to the capability's hash).
    #[serde(default, skip_serializing)]
    pub tool_token: Option<String>,
    /// The value of the org secret a `browser_step` `fill_secret` names,
    /// added by the runner from the control plane's dispatch. Read, never
    /// written back out, like `toolToken`.
    #[serde(default, skip_serializing)]
    pub secret_value: Option<String>,
    /// RFC 3339.
    pub created_at: String,
}

/// The operations Moat knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    ArtifactRead,
    ArtifactWrite,
    ArtifactList,
    ExecArgv,
    HttpRequest,
    BrowserStep,
}

impl OpKind {
    pub const ALL: &'static [OpKind] = &[
        OpKind::ArtifactRead,
        OpKind::ArtifactWrite,
        OpKind::ArtifactList,
        OpKind::ExecArgv,
        OpKind::HttpRequest,
        OpKind::BrowserStep,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::ArtifactRead => "artifact_read",
            OpKind::ArtifactWrite => "artifact_write",
            OpKind::ArtifactList => "artifact_list",
            OpKind::ExecArgv => "exec_argv",
            OpKind::HttpRequest => "http_request",
            OpKind::BrowserStep => "browser_step",
        }
    }

    pub fn parse(text: &str) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| k.as_str() == text)
    }
}

/// `artifact_read`: read a file under a workspace root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactReadArgs {
    /// Relative to the workspace, e.g. `input/data.csv` or `output/report.md`.
    pub path: String,
    /// Most bytes returned inline; the rest is reported as truncated.
    pub max_bytes: u64,
    #[serde(default)]
    pub offset: u64,
}

/// `artifact_write`: write a file under an output root, atomically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactWriteArgs {
    pub path: String,
    /// UTF-8 content (exactly one of `content` and `contentBase64`).
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub content_base64: Option<String>,
    /// Refuse content larger than this.
    pub max_bytes: u64,
    #[serde(default)]
    pub overwrite: bool,
}

/// `artifact_list`: list a directory under a workspace root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactListArgs {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default)]
    pub max_entries: Option<u64>,
}

/// `exec_argv`: run an allowed executable in the OS sandbox. No shell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecArgvArgs {
    pub argv: Vec<String>,
    /// Relative to the workspace.
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub network: Option<NetworkMode>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// Names from the manifest's pass-through list, with values.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Tools of the control plane's credential proxy the program may call
    /// itself: a managed runner hands it a token for them, valid for this
    /// operation only, as its stdin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_token: Vec<String>,
    /// With `network: ingress-only`: the TCP ports the program listens on
    /// while it runs, each one the manifest's `networkPolicy.expose` lists.
    /// A managed run's are reached through the control plane's
    /// `/v1/runs/{run}/ports/{port}/` route, with the org's token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose: Vec<u16>,
    /// In the `worker` class, the bindings of a queue's delivery: the
    /// message, the kv namespaces as they were, the queues it may send to.
    /// Only the control plane sets it (an agent's operation carrying it is
    /// refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerGrants>,
}

/// What a queue's delivery grants its worker beyond `inputs` and
/// `outputs` (the run's `input/` and `output/`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkerGrants {
    /// The queue that delivered the message.
    pub queue: String,
    pub message_id: String,
    /// The message: a JSON value.
    pub message: serde_json::Value,
    /// The granted namespaces as they were at delivery: namespace → key →
    /// value (base64). Each of them is granted, empty or not.
    #[serde(default)]
    pub kv: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    /// The queues its sends may go to.
    #[serde(default)]
    pub queues: Vec<String>,
}

/// `browser_step`: one step of a browser session (`action`), in a headless
/// Chromium inside the sandbox whose only way out is the egress proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(
    tag = "action",
    rename_all = "snake_case",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
pub enum BrowserStepArgs {
    /// Starts a session: a fresh browser with a profile of its own; with
    /// `trace`, it keeps a trace of its page (navigations, requests and
    /// their answers, console), saved as an artifact at `close`.
    Open {
        session_id: String,
        #[serde(default)]
        trace: bool,
    },
    /// Loads `url` in the session's page and waits for it (at most
    /// `timeoutMs`, default 15 s).
    Navigate {
        session_id: String,
        url: String,
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// Clicks the middle of the first element `selector` matches, as a
    /// mouse would, and waits for a page it loads.
    Click {
        session_id: String,
        selector: String,
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// Focuses the first element `selector` matches and types `text` into it.
    Type {
        session_id: String,
        selector: String,
        text: String,
    },
    /// Fills the text field `selector` matches with the value of the org
    /// secret `secret` (by name), which the control plane supplies: the
    /// value never reaches the agent, and is scrubbed from every result,
    /// event and text of the session from then on.
    FillSecret {
        session_id: String,
        selector: String,
        secret: String,
    },
    /// Chooses the option whose value (or, failing that, whose text) is
    /// `value` in the first `<select>` element `selector` matches.
    Select {
        session_id: String,
        selector: String,
        value: String,
    },
    /// Waits until an element matches `selector`, or the page's text holds
    /// `text` (one of them), at most `timeoutMs` (default 15 s).
    WaitFor {
        session_id: String,
        #[serde(default)]
        selector: Option<String>,
        #[serde(default)]
        text: Option<String>,
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// The visible text of the first element `selector` matches (default:
    /// the page's body), capped.
    Extract {
        session_id: String,
        #[serde(default)]
        selector: Option<String>,
    },
    /// A PNG of the page as it stands, saved as an artifact.
    Screenshot { session_id: String },
    /// Ends the session: the browser and its profile are gone.
    Close { session_id: String },
}

impl BrowserStepArgs {
    pub fn session_id(&self) -> &str {
        match self {
            BrowserStepArgs::Open { session_id, .. }
            | BrowserStepArgs::Navigate { session_id, .. }
            | BrowserStepArgs::Click { session_id, .. }
            | BrowserStepArgs::Type { session_id, .. }
            | BrowserStepArgs::FillSecret { session_id, .. }
            | BrowserStepArgs::Select { session_id, .. }
            | BrowserStepArgs::WaitFor { session_id, .. }
            | BrowserStepArgs::Extract { session_id, .. }
            | BrowserStepArgs::Screenshot { session_id }
            | BrowserStepArgs::Close { session_id } => session_id,
        }
    }

    pub fn action(&self) -> &'static str {
        match self {
            BrowserStepArgs::Open { .. } => "open",
            BrowserStepArgs::Navigate { .. } => "navigate",
            BrowserStepArgs::Click { .. } => "click",
            BrowserStepArgs::Type { .. } => "type",
            BrowserStepArgs::FillSecret { .. } => "fill_secret",
            BrowserStepArgs::Select { .. } => "select",
            BrowserStepArgs::WaitFor { .. } => "wait_for",
            BrowserStepArgs::Extract { .. } => "extract",
            BrowserStepArgs::Screenshot { .. } => "screenshot",
            BrowserStepArgs::Close { .. } => "close",
        }
    }
}

/// `http_request`: a named profile and a stored request (`{profile,
/// requestRef}`), or a direct request to a domain the manifest allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum HttpRequestArgs {
    Profile(ProfileRequestArgs),
    Direct(DirectRequestArgs),
}

/// A request to one of the manifest's `networkPolicy.profiles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileRequestArgs {
    pub profile: String,
    /// SHA-256 of an artifact (written earlier with `artifact_write` and
    /// stored, or produced by an operation) holding a [`StoredRequest`].
    pub request_ref: String,
}

/// The request an artifact named by `requestRef` holds; the URL is the
/// profile's `baseUrl` followed by `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoredRequest {
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub body_base64: Option<String>,
    #[serde(default)]
    pub max_response_bytes: Option<u64>,
}

/// A request by URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DirectRequestArgs {
    pub method: String,
    /// `http://` or `https://`; the host must be in the manifest's allowDomains.
    pub url: String,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// A UTF-8 body (or use `bodyBase64`).
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub body_base64: Option<String>,
    /// Cap on the response body kept (default and most: the manifest's maxOutputBytes).
    #[serde(default)]
    pub max_response_bytes: Option<u64>,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpStatus {
    Ok,
    Denied,
    Error,
    Timeout,
}

impl OpStatus {
    /// As on the wire: `ok`, `denied`, `error`, `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            OpStatus::Ok => "ok",
            OpStatus::Denied => "denied",
            OpStatus::Error => "error",
            OpStatus::Timeout => "timeout",
        }
    }
}

/// A reference to an artifact produced by an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactRef {
    pub sha256: String,
    pub size: u64,
    pub kind: String,
    pub label: String,
}

/// The answer to one envelope (one JSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpResult {
    /// The envelope's id (empty when the line could not be read as one).
    pub id: String,
    pub status: OpStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<DenialReason>,
    /// A human-readable explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The event recorded for this outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<ArtifactRef>,
}

impl OpResult {
    pub fn denied(id: &str, reason: DenialReason, message: impl Into<String>) -> Self {
        OpResult {
            id: id.to_owned(),
            status: OpStatus::Denied,
            result: None,
            reason: Some(reason),
            message: Some(message.into()),
            event_type: None,
            artifacts: Vec::new(),
        }
    }

    pub fn ok(id: &str, result: serde_json::Value) -> Self {
        OpResult {
            id: id.to_owned(),
            status: OpStatus::Ok,
            result: Some(result),
            reason: None,
            message: None,
            event_type: None,
            artifacts: Vec::new(),
        }
    }

    pub fn error(id: &str, message: impl Into<String>) -> Self {
        OpResult {
            id: id.to_owned(),
            status: OpStatus::Error,
            result: None,
            reason: None,
            message: Some(message.into()),
            event_type: None,
            artifacts: Vec::new(),
        }
    }
}

/// Run and operation ids in managed mode are of this form (see
/// [`crate::ids::RunId`]).
pub use crate::ids::is_plain_id;
