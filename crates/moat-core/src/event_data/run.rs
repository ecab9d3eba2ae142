//! The control plane's record of runs, operations, manifests, approvals
//! and the requests it refused.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::denial::DenialReason;
use crate::mode::NetworkMode;
use crate::op::OpStatus;

/// One input of a run, stored with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunInput {
    /// Relative to the workspace.
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// A run was queued.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunCreated {
    pub environment: String,
    pub inputs: Vec<RunInput>,
    pub max_attempts: i64,
    /// The workload classes a runner must offer to claim it (left out:
    /// any runner of the environment).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_classes: Vec<crate::mode::WorkloadClass>,
    /// The volumes it attached, each with the snapshot it starts from
    /// (what replay and audit start from; left out: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeAttached>,
}

/// A volume a new run attached, and the snapshot it starts from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeAttached {
    pub volume: String,
    pub path: String,
    pub read_only: bool,
    /// Absent: the volume was empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// Reserved: nothing emits `run.started` (a claimed run is running).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunStarted {}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinalRunState {
    Succeeded,
    Failed,
    DeadLettered,
    /// An agent of its org or an org admin cancelled it.
    Cancelled,
}

/// A run ended, succeeded or failed (by its runner, an operator, or idle).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunFinished {
    pub state: FinalRunState,
    /// Why (`idle_timeout`, a runner's error...); `null` when none was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `null` when no runner ever claimed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    pub attempts: i64,
}

/// A run ended without success and needs an operator (its last lease
/// expired with no attempt left).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunDeadLettered {
    /// `dead_lettered`.
    pub state: FinalRunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    pub attempts: i64,
}

/// A runner claimed the run under a lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunClaimed {
    pub runner_id: String,
    pub manifest_hash: String,
    /// 1 for the first claim.
    pub attempt: i64,
    /// RFC 3339.
    pub lease_until: String,
}

/// The runner holding the run stopped renewing its lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunLeaseExpired {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    pub attempt: i64,
    pub max_attempts: i64,
}

/// The run was queued again after a lost lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRetried {
    /// The attempt it is queued for.
    pub attempt: i64,
}

/// A runner took over a run that another runner lost: what it restored
/// before the run's next operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunResumed {
    /// The attempt resuming.
    pub attempt: i64,
    /// Each persistent area, as restored.
    pub volumes: Vec<VolumeRestored>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// One persistent area a runner restored: the snapshot (its hash checked,
/// and every chunk's) and what it wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeRestored {
    pub volume: String,
    /// Where in the workspace.
    pub path: String,
    /// Absent: the volume was empty (no snapshot yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    pub read_only: bool,
    pub files: u64,
    pub bytes: u64,
}

/// An operation changed a persistent area: its new snapshot is durable
/// and is now the volume's head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeSnapshotted {
    pub volume: String,
    pub path: String,
    pub snapshot: String,
    /// The head it replaced (absent: the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub files: u64,
    pub bytes: u64,
}

/// A runner asked for work and the placement policy refused it this run
/// (a dedicated host, a tenant it may not share a host with, a label it
/// lacks): the run stays queued for another runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunPlacementDenied {
    /// The runner whose claim was refused.
    pub runner_id: String,
    /// Its host, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// Why, as the run's waiting reason shows it.
    pub reason: String,
    /// The placement policies that refused (their `@id`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
}

/// The runner holding the run gave it back unfinished, at an operation
/// boundary, because it is stopping (SIGTERM: a rollout, a drain): the run
/// is queued again and the claim does not count as an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunReleased {
    pub runner_id: String,
    /// The attempts counted after the release (the released one is not).
    pub attempts: i64,
}

/// What a run used, summed when it ended from what its runners reported:
/// its operations by final state, and over the programs it ran (each op's
/// `sandbox.exec.finished` report) and its egress (`network.request`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunUsage {
    /// Operations by their final state (`succeeded`, `failed`, `denied`...).
    pub ops: std::collections::BTreeMap<String, u64>,
    /// Programs run in a sandbox.
    pub programs: u64,
    /// User + system CPU time of every program's whole tree.
    pub cpu_ms: u64,
    /// Wall-clock time of the programs, summed.
    pub program_wall_ms: u64,
    /// The largest peak memory of one program's tree.
    pub peak_memory_bytes: u64,
    /// Requests through the egress proxy (allowed or not).
    pub egress_requests: u64,
    pub egress_bytes_out: u64,
    pub egress_bytes_in: u64,
    /// Accesses the sandbox refused (every layer, counted in the reports'
    /// `violations`). Absent when none were (and from usage recorded before
    /// they were counted).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub violations: u64,
    /// The most processes one program's tree had at once (where the
    /// kernel keeps count).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub peak_pids: u64,
    /// Bytes programs wrote into writable roots under a storage budget
    /// (`limits.maxWriteBytes`; without one, writes are not counted).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_written: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An operator published a signed manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestPublished {
    pub manifest_hash: String,
    pub environment: String,
    /// RFC 3339.
    pub expires_at: String,
}

/// An operator revoked a manifest (`manifestHash`) or a signing key
/// (`signingKey`, base64): one of the two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestRevoked {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_key: Option<String>,
}

/// An operation's result came back: from a runner (with its artifacts) or
/// from the control plane's own tool call (`profile`, `message`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpFinished {
    pub status: OpStatus,
    pub runner_id: String,
    /// The denial reason; `null` unless denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<DenialReason>,
    /// SHA-256 of each artifact the result names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Vec<String>>,
    /// `control-plane-tool-proxy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Why a tool call did not succeed; `null` when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What an approver is shown of the operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalSummary {
    pub op: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// The operation's arguments, secrets scrubbed: open, as each
    /// operation's arguments have a schema of their own.
    pub args: serde_json::Value,
    /// For an acting browser step: the element it would act on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<crate::element::ElementFacts>,
}

/// A policy rule asked for a person to approve the operation first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalRequested {
    pub approval_id: String,
    pub rule: String,
    /// `low`, `medium`, `high` or `critical`.
    pub risk: String,
    /// RFC 3339: it fails closed then.
    pub expires_at: String,
    pub summary: ApprovalSummary,
    pub policy_hash: String,
    pub manifest_hash: String,
}

/// An approver allowed the operation; `capability.granted` follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalGranted {
    pub approval_id: String,
    pub rule: String,
    pub risk: String,
    /// `api` or `inspector`.
    pub via: String,
    /// Who (a token's fingerprint).
    pub by: String,
    /// The approver's note; `null` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An approver refused the operation; `capability.denied` follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalDenied {
    pub approval_id: String,
    pub rule: String,
    pub risk: String,
    /// `api` or `inspector`.
    pub via: String,
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Nobody approved in time (then `capability.denied` follows), or the run
/// ended first (`via`: `run_end`, `reason`: `the run ended`; the operation
/// failed with its run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalExpired {
    pub approval_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    /// `expiry`, `run_end`, or where a late answer came from (`api`,
    /// `inspector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Why the control plane refused a request it keeps a record of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// A new run's id, environment or inputs carry one of the org's secrets.
    SecretInInput,
    /// An Inspector form posted from another site.
    CrossSiteRequest,
    /// A new run of an org over a quota whose setting refuses rather than
    /// queues (`message` names the quota, its limit and the use).
    QuotaExceeded,
    /// A runner asked for a volume's chunk or snapshot its org does not
    /// hold, for a volume not attached to the run, or for a run it does
    /// not hold.
    VolumeNotHeld,
}

/// The control plane refused a request: a run whose inputs carry a secret
/// (`secret`, `field`), a cross-site Inspector form (`method`, `by`,
/// `origin`, `referer`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestRefused {
    pub reason: RefusalReason,
    pub message: String,
    /// The request's path.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub referer: Option<String>,
    /// The secret's name (never its value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Where it was found, e.g. `inputs[0]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// What happened to a queue message (`queue.message`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum QueueMessageState {
    /// Accepted into its queue.
    Received,
    /// Sent again with an idempotency key already taken: not queued again.
    Duplicate,
    /// Handed to a run of its queue's worker.
    Delivered,
    /// Its invocation succeeded: its kv writes and sends were made.
    Acknowledged,
    /// Its invocation failed; it is tried again after `retryAt`.
    Retrying,
    /// Its invocation failed with no attempt left: it waits for a redrive.
    DeadLettered,
    /// Taken out of the dead letters and queued again, attempts reset.
    Redriven,
}

/// A step of a queue message's life. Never its body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueMessage {
    pub queue: String,
    pub message_id: String,
    pub state: QueueMessageState,
    /// Attempts made so far (the one delivered, for `delivered`).
    pub attempt: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Why its invocation failed (`retrying`, `deadLettered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// RFC 3339: when it is tried again (`retrying`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    /// Keys written and messages sent (`acknowledged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_writes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sends: Option<u64>,
}
