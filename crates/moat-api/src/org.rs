//! The org-facing API: what an operator (org admin) and an agent send and
//! get back. The control plane's admin endpoints (orgs, the ledger check)
//! are here too.

use moat_core::OpResult;
use moat_core::ids::{OpId, RelPath, RunId, Sha256, VolumeName};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ErrorDetail;
use crate::views::RunView;

/// `POST /v1/orgs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewOrg {
    /// 1 to 100 of `[A-Za-z0-9_-]`.
    pub name: String,
}

/// A new org and its admin token (shown once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OrgCreated {
    pub id: String,
    pub name: String,
    pub token: String,
}

/// `POST /v1/bootstrap-tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewBootstrapToken {
    /// 1 to 3600; 600 when left out.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

/// A token, shown once (bootstrap tokens expire; agent tokens do not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuedToken {
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// One entry of the runner-build allowlist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRunnerBuild {
    /// SHA-256 of the sealed runner (`moat runner inspect`).
    pub sha256: Sha256,
    #[serde(default)]
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunnerBuild {
    pub sha256: String,
    pub label: String,
    pub revoked: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerBuilds {
    pub runner_builds: Vec<RunnerBuild>,
}

/// What a revocation revoked: one of the three keys is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revoked {
    /// A runner build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
    /// A manifest-signing key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    pub revoked: bool,
}

/// `POST /v1/signing-keys/revoke`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevokeKey {
    pub public_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManifestPublished {
    pub manifest_hash: String,
}

/// A registered runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerView {
    pub id: String,
    pub runner_hash: String,
    pub manifest_hash: String,
    pub policy_hash: String,
    pub version: String,
    pub environment: String,
    /// The operations it serves.
    #[schemars(with = "Vec<String>")]
    pub ops: Value,
    pub sandbox_mode: String,
    pub boot_time: String,
    pub registered_at: String,
    pub last_seen_at: String,
    pub slots: i64,
    pub slots_used: i64,
    pub slots_free: i64,
    /// The enrolment it registered through (none: a bootstrap token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrolment_id: Option<String>,
    /// The workload classes it offers.
    pub workload_classes: Vec<moat_core::WorkloadClass>,
    /// What its host can give, as it said at registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<moat_core::host::HostFeatures>,
    /// The host it runs on, as it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// The operator's labels.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// CPU (millicores) and memory (bytes) it may hand out to runs (0: it
    /// did not say, and nothing is reserved against it), and what the runs
    /// it holds reserve of them.
    pub cpu_millis: i64,
    pub cpu_reserved: i64,
    pub memory_bytes: i64,
    pub memory_reserved: i64,
    /// Told to drain (`moat runner drain`): it claims nothing new.
    pub draining: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Runners {
    pub runners: Vec<RunnerView>,
}

/// The hash chain recomputed: `ok` with its length and head, or the first
/// break.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LedgerCheck {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One input of a new run: its workspace-relative path and its bytes, as
/// text or base64 (exactly one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewInput {
    pub path: RelPath,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
}

/// `POST /v1/runs`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewRun {
    /// Made up when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<RunId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    #[serde(default)]
    pub inputs: Vec<NewInput>,
    /// 1 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i64>,
    /// Pin the run to a published manifest: only runners under it claim it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
    /// Workload classes the run will need, beyond those the control plane
    /// finds itself (the class the policy gives each program the manifest
    /// allows): only a runner that offers them all claims the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_classes: Vec<moat_core::WorkloadClass>,
    /// The org's volumes to attach, each at a persistent root of the
    /// manifest: read-write by one run at a time, read-only by any number.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeAttachment>,
    /// Continue a previous run of the org (a session): its volumes are
    /// attached as it had them, unless `volumes` attaches the same path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<RunId>,
}

/// One volume a new run attaches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VolumeAttachment {
    pub volume: VolumeName,
    /// A persistent root of the manifest (`filesystem.persistentRoots`).
    pub path: RelPath,
    /// Any number of runs may read a volume; one at a time writes it.
    /// What a run changes in a read-only attachment is never kept.
    #[serde(default)]
    pub read_only: bool,
}

/// `POST /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewVolume {
    pub name: VolumeName,
}

/// A volume: an org's persistent work area, kept as content-addressed
/// snapshots by the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeView {
    pub name: String,
    /// The newest snapshot (`null`: nothing was written yet).
    pub head: Option<String>,
    pub files: u64,
    pub bytes: u64,
    /// The live run attached read-write, if any.
    pub writer: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct VolumeList {
    pub volumes: Vec<VolumeView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunList {
    pub runs: Vec<RunView>,
}

/// An operation as an agent submits it: the envelope without what the
/// control plane fills in (`runId`, `correlationId` and `createdAt` may be
/// given; a capability or a tool token may not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OpSubmission {
    pub id: OpId,
    /// `artifact_read`, `artifact_write`, `artifact_list`, `exec_argv`,
    /// `http_request`, `browser_step`.
    pub op: String,
    /// The operation's arguments (docs/schema/args-*.schema.json).
    pub args: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<moat_core::NetworkMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_decision_ref: Option<String>,
}

/// The approval an operation waits for (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingApproval {
    pub id: String,
    pub expires_at: String,
}

/// An operation with its decision and, once final, its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpView {
    pub id: String,
    pub run_id: String,
    /// Its place in the run (1, 2, ...).
    pub n: i64,
    pub op: String,
    /// `pending_approval`, `queued`, `dispatched`, `succeeded`, `failed`,
    /// `denied`.
    pub state: String,
    /// The policy's decision record (policy and manifest hashes, rules,
    /// resource, sandbox).
    pub decision: Value,
    /// As the runner reported it, the denial, or why it never ran.
    #[schemars(with = "Option<OpOutcome>")]
    pub result: Option<Value>,
    pub created_at: String,
    pub updated_at: String,
    /// Only in the 202 answer to a submission that waits for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<PendingApproval>,
}

/// What an operation's `result` holds: its result, or (an operation that
/// never finished: its run ended, its runner's lease ran out) why not.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum OpOutcome {
    Result(OpResult),
    Stopped(OpStopped),
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct OpStopped {
    /// `error`.
    status: String,
    /// `reason`: `run_ended`, or `interrupted` (its runner was lost while
    /// it ran; the run resumes elsewhere and it may be submitted again).
    error: ErrorDetail,
}

/// The 403 answer to a denied submission: the denial, and the operation
/// as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpRefused {
    pub error: ErrorDetail,
    pub op: OpView,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpList {
    pub ops: Vec<OpView>,
}

/// One recorded event with its place in the hash chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    #[serde(flatten)]
    pub event: moat_core::Event,
    pub seq: i64,
    pub prev_hash: String,
    pub hash: String,
}

/// How [`EventView`] is documented: `type` with its `data` of one shape
/// per type ([`moat_core::EventData`]), where the stored event keeps the
/// bytes it was chained with.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct EventViewShape {
    #[serde(flatten)]
    body: moat_core::EventData,
    /// RFC 3339 UTC.
    at: String,
    /// Empty for an event about no run (a runner's, a manifest's).
    run_id: String,
    #[serde(default)]
    op_id: Option<String>,
    #[serde(default)]
    correlation_id: Option<String>,
    seq: i64,
    prev_hash: String,
    hash: String,
}

impl JsonSchema for EventView {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventView".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        EventViewShape::json_schema(generator)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventPage {
    pub events: Vec<EventView>,
    /// The `seq` of the last event on this page (the `after` asked for
    /// when it is empty); pass it as `?after=` for the next.
    pub last: i64,
}

/// An artifact of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactView {
    pub run_id: String,
    /// The operation that made it (empty for a run's inputs).
    pub op_id: String,
    pub sha256: String,
    pub size: i64,
    /// `input`, `output`, `stdout`, `stderr`, `request`...
    pub kind: String,
    pub label: String,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ArtifactList {
    pub artifacts: Vec<ArtifactView>,
}

/// An artifact's stored bytes, hashed again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ArtifactCheck {
    pub sha256: String,
    pub size: u64,
    pub computed: String,
    pub ok: bool,
}

/// An approval request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalView {
    pub id: String,
    pub run_id: String,
    pub op_id: String,
    /// `pending`, `approved`, `denied`, `expired`.
    pub state: String,
    /// The policy rule that asked for a person.
    pub rule: String,
    pub risk: String,
    /// What the operation does: op, resource, size, network, args.
    pub summary: Value,
    pub requested_at: String,
    pub expires_at: String,
    pub resolved_at: Option<String>,
    pub resolved_by: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalList {
    pub approvals: Vec<ApprovalView>,
}

/// The optional body of approve and deny (a denial needs the reason).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resolution {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `PUT /v1/secrets/{name}`: the value, 8 bytes to 64 KiB. Wiped from
/// memory when dropped.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSecret {
    #[schemars(with = "String")]
    pub value: zeroize::Zeroizing<String>,
}

/// A secret's name and when it was set; never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretView {
    pub name: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretList {
    pub secrets: Vec<SecretView>,
}

/// `POST /v1/tool-tokens/call`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenCall {
    pub tool: String,
    #[serde(default)]
    pub params: serde_json::Map<String, Value>,
}

/// A tool's answer, redacted and scrubbed: the upstream status and body,
/// or why there was none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The recorded result of a runner's tool-proxy operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolResult {
    pub result: OpResult,
}

/// `POST /v1/runner-enrolments`: an identity provider whose tokens register
/// the org's runners (on Kubernetes: the cluster's service-account issuer).
/// The control plane makes the audience the tokens must carry
/// ([`RunnerEnrolment::audience`]): unguessable, so no other org can claim
/// it first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRunnerEnrolment {
    /// 1 to 100 of `[A-Za-z0-9_.-]`, unique in the org.
    pub name: String,
    /// The tokens' `iss`, exactly (`kubectl get --raw
    /// /.well-known/openid-configuration` shows the cluster's).
    pub issuer: String,
    /// The tokens' `sub`, exactly: on Kubernetes
    /// `system:serviceaccount:NAMESPACE:SERVICEACCOUNT`.
    pub subject: String,
    /// The provider's public keys, a JWKS (`kubectl get --raw
    /// /openid/v1/jwks`): RSA (RS256, at least 2048 bits) and P-256
    /// (ES256) signing keys.
    pub jwks: Value,
}

/// An enrolment as the org sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerEnrolment {
    pub id: String,
    pub name: String,
    pub issuer: String,
    /// `moat-enrolment:<id>`, made by the control plane: the audience the
    /// runners' tokens must be issued for (the DaemonSet's projected token,
    /// `audience:`). It names this enrolment, and so the org.
    pub audience: String,
    pub subject: String,
    /// The `kid` of each key it accepts (keys without one are counted as "").
    pub key_ids: Vec<String>,
    /// RFC 3339.
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerEnrolments {
    pub runner_enrolments: Vec<RunnerEnrolment>,
}

/// `GET`/`PUT /v1/orgs/{org}/quota`: an org's quotas and its use in the
/// current period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaView {
    /// The org's name.
    pub org: String,
    /// Its quotas (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<moat_core::quota::Quota>,
    /// Its use: runs held now, and over the quota's period (the UTC day by
    /// default) what runs that ended used.
    pub used: moat_core::quota::QuotaUse,
    /// The quota reached, as a queued run's waiting reason shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exceeded: Option<String>,
}

/// `GET /v1/capacity`: every host with runners, what they have and hold.
/// The deployment's admin sees every org's runners and every tenant; an
/// org's admin sees its own runners, and only how many other orgs share a
/// host with them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    pub hosts: Vec<HostCapacity>,
    /// Per org: runs held, against the concurrent-run quota.
    pub orgs: Vec<OrgLoad>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostCapacity {
    /// The host's id (`unnamed`: runners that gave none).
    pub host_id: String,
    /// Summed over its runners.
    pub slots: i64,
    pub slots_used: i64,
    pub cpu_millis: i64,
    pub cpu_reserved: i64,
    pub memory_bytes: i64,
    pub memory_reserved: i64,
    /// The orgs with runs held here now (names; for an org's admin, only
    /// its own).
    pub tenants: Vec<String>,
    /// For an org's admin: how many other orgs have runs here now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_tenants: Option<usize>,
    pub runners: Vec<RunnerCapacity>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerCapacity {
    pub id: String,
    /// The org it serves (name).
    pub org: String,
    pub environment: String,
    pub version: String,
    /// `uname -r` of its host, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    pub last_seen_at: String,
    pub slots: i64,
    pub slots_used: i64,
    pub cpu_millis: i64,
    pub cpu_reserved: i64,
    pub memory_bytes: i64,
    pub memory_reserved: i64,
    pub workload_classes: Vec<moat_core::WorkloadClass>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    pub draining: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrgLoad {
    pub org: String,
    pub runs_held: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_runs_quota: Option<u64>,
}

/// `POST /v1/runners/{id}/drain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Drained {
    pub runner_id: String,
    pub draining: bool,
    /// Runs it still holds (it finishes them, then stops).
    pub runs_held: i64,
}
