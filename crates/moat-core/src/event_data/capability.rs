//! Decisions on operations: by the control plane (policy, approvals) and
//! by the capability shell (manifest, capability), and what they produced.
//!
//! The same type comes from both: the control plane's carries its decision
//! record (`decision`, `policyHash`, `resource`, `policies`...), the
//! shell's the operation and its capability, plus the runner's identity
//! once relayed. Hence the many optional keys.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::denial::DenialReason;
use crate::mode::SandboxMode;

/// What the control plane's policy decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyDecision {
    Allow,
    Deny,
    RequireApproval,
}

/// An operation arrived: at the control plane (`op` only) or at the shell
/// (with its hashes and mode; `op` and `argsHash` are `null` when the line
/// was not an envelope).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityRequested {
    /// The operation's name as sent (it may be one Moat does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SandboxMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
}

/// The capability an operation carried, as the shell accepted it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantedCapability {
    /// Refused if seen again before `expiresAt`.
    pub nonce: String,
    /// RFC 3339.
    pub expires_at: String,
}

/// An operation may go ahead: the control plane's policy allowed it (at
/// once, or once approved: then with the approval's keys), or the shell
/// accepted it under its manifest (with the capability it carried).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityGranted {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<GrantedCapability>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<PolicyDecision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
    /// The Cedar resource, e.g. `Moat::Path::"input/a.txt"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
    /// The workload class the operation's program runs in (`exec_argv`;
    /// left out for other operations, and by a runner's shell when it is
    /// `namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<crate::mode::WorkloadClass>,
    /// The `@id`s of the policies that decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<String>>,
    /// The rule that asked for an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    /// Tool name to definition hash: what the operation's tool token is good for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_token: Option<BTreeMap<String, String>>,
    /// The definition hash of the tool called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_hash: Option<String>,
    /// An acting browser step let through to be decided again on the
    /// element it would act on, once the runner's browser has found it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element_check: Option<bool>,
    /// The element an acting browser step was decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<crate::element::ElementFacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// Who approved (a token's fingerprint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Where the approval came from: `api`, `inspector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// The approver's note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
}

/// An operation was refused: by the control plane's policy or an approver
/// (with the decision record or the approval), or by the shell (with the
/// operation). A write the shell could not publish carries `error` instead
/// of a reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityDenied {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<DenialReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why the policy could not decide, or the write could not be published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<PolicyDecision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
    /// The workload class the program would have run in, or that was
    /// asked for and could not be given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<crate::mode::WorkloadClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_hash: Option<String>,
    /// The element an acting browser step would have acted on: what the
    /// browser found (`element_unchecked`), or what the policy refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<crate::element::ElementFacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// Who denied (a token's fingerprint); `null` when it expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Where the refusal came from: `api`, `inspector`, `expiry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
}

/// The shell stored an artifact: a written file, a large output stream or
/// HTTP response body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactCreated {
    pub sha256: String,
    pub size: u64,
    /// `file`, `stdout`, `stderr` or `http_response`.
    pub kind: String,
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// A file a program wrote passed the export rules and became an artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactPromoted {
    /// Relative to the workspace.
    pub path: String,
    pub sha256: String,
    pub size: u64,
    /// The type it was validated as (`csv`, `json`...).
    pub exported_as: crate::exports::ExportType,
    /// The approval it waited for (`artifact.validated` came first), if
    /// the policy asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// A file a program wrote passed the export rules, and the policy asks a
/// person before it leaves: it is held (stored, not downloadable) until
/// the approval is settled (`artifact.promoted` or `artifact.rejected`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactValidated {
    /// Relative to the workspace.
    pub path: String,
    pub sha256: String,
    pub size: u64,
    pub exported_as: crate::exports::ExportType,
    pub approval_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// A file a program wrote failed the export rules: one reason per rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactRejected {
    /// Relative to the workspace.
    pub path: String,
    pub size: u64,
    /// Of the content judged; absent when it was refused unread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub reasons: Vec<crate::exports::Rejection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// The shell refused an operation for its path (absolute, outside its
/// root, through a symlink, a write outside the output roots); followed by
/// `capability.denied`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathDenied {
    pub reason: DenialReason,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}
