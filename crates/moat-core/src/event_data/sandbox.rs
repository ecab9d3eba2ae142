//! The sandbox launcher's events (`moat exec`, and every `exec_argv` of
//! the capability shell, which adds `sandboxRunId` and, relayed by a
//! runner, the runner's identity).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::Limits;
use crate::mode::{NetworkMode, RootView, SandboxMode, WorkloadClass};
use crate::report::SandboxReport;

/// A declared root as the program sees it (never the host path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxRoot {
    /// Absolute path inside the sandbox.
    pub inside: String,
    pub writable: bool,
}

/// The sandbox is being set up and the program is about to start. The
/// arguments are not recorded: they may carry what the caller holds secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxExecStarted {
    pub program: String,
    /// Number of arguments, the program included.
    pub argc: u64,
    pub mode: SandboxMode,
    pub network: NetworkMode,
    pub root_view: RootView,
    pub roots: Vec<SandboxRoot>,
    pub limits: Limits,
    /// The workload class the program runs under (absent: `namespace`, as
    /// in every record made before classes existed).
    #[serde(default, skip_serializing_if = "WorkloadClass::is_namespace")]
    pub class: WorkloadClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// The sandbox refused to start: a protection could not be applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxExecDenied {
    /// The setup error, naming the layer (free text, not a denial reason).
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// The program ended (or never started): the full report, its keys at the
/// top of `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxExecFinished {
    #[serde(flatten)]
    pub report: SandboxReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// The seccomp layer refused a syscall (once per syscall name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxSyscallDenied {
    pub syscall: String,
    /// The audit architecture, hex (`0xc000003e`).
    pub arch: String,
    pub nr: i32,
    /// `seccomp`.
    pub layer: String,
    /// What the program got: `EPERM`.
    pub errno: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// A Landlock rule refused an access (once per access and object; the
/// report's `violations` count them all).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxViolation {
    /// `landlock`.
    pub layer: String,
    /// Landlock's blocker: `fs.read_file`, `net.connect_tcp`, `scope.signal`, ...
    pub access: String,
    /// The path, port or target the access was for, when the kernel said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// What the program got: `EACCES` (`EPERM` for scopes).
    pub errno: String,
    /// One line for people: `tried to read /root/.aws/credentials: denied
    /// (landlock fs.read_file)`.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// A run used `danger-full-access` (`mode`) or the host's network
/// (`network`); one event for each, every time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxDangerFullAccess {
    pub warning: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SandboxMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// The wall-clock limit passed and the process tree was killed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessTimeout {
    pub timeout_ms: u64,
    /// What was killed: `process tree`.
    pub killed: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// A worker called one of Moat's bindings (`inputs`, `outputs`): once per
/// call, whether it was served or refused. Never the data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerBinding {
    /// `inputs`, `outputs`.
    pub binding: String,
    /// `names`, `read`, `write`.
    pub call: String,
    /// The file's name under the binding's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Bytes read or written (names listed, for `names`).
    pub bytes: u64,
    /// `ok`, or why not: `not-granted`, `not-found`, `invalid-name`,
    /// `too-large`, `failed`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}
