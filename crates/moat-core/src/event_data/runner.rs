//! Runner provenance and the control plane's view of runners.
//!
//! A runner reports the first five types itself (`runner.selected` to
//! `runner.manifest.refresh_failed`); the control plane then stamps its own
//! record of the runner on them (`runnerId`, `runnerHash`, `manifestHash`),
//! which is why those keys are optional there.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mode::SandboxMode;
use crate::op::OpKind;

/// The runner started from this sealed binary (reported once per boot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerSelected {
    /// SHA-256 of the sealed runner binary.
    pub runner_hash: String,
    /// Path of the binary on the runner's host.
    pub binary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// The runner booted (reported once per boot, after registering).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerStarted {
    /// RFC 3339.
    pub boot_time: String,
    pub version: String,
    /// The sealed manifest's first sandbox mode.
    pub sandbox_mode: SandboxMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// The policy the sealed manifest names (reported once per boot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerPolicyLoaded {
    pub policy_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// The sealed manifest the runner booted with (reported once per boot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerManifestLoaded {
    pub manifest_hash: String,
    /// RFC 3339.
    pub expires_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
}

/// The control plane accepted a runner's swap to a refreshed manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerManifestRefreshed {
    pub runner_id: String,
    /// The manifest hash the runner ran under until now.
    pub from: String,
    pub manifest_hash: String,
    /// RFC 3339: when the new manifest expires.
    pub expires_at: String,
}

/// A runner could not fetch a newer manifest (reported by the runner, best
/// effort: the control plane may be why it failed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerManifestRefreshFailed {
    /// Failures in a row.
    pub failures: u32,
    /// RFC 3339: the next attempt.
    pub retry_at: String,
    pub reason: String,
    /// RFC 3339: when the manifest in use expires.
    pub expires_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
}

/// Why the control plane turned a runner away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunnerRejection {
    /// The build, the manifest or its signing key was revoked.
    Revoked,
    UnknownRunnerHash,
    WrongEnvironment,
    WrongVersion,
    ManifestExpired,
    ManifestExpiredWithGraceExceeded,
    /// The manifest's signature, expiry or the runner's key is unreadable or wrong.
    BadSignature,
    StalePolicy,
    StaleManifest,
    OpsBeyondManifest,
    BadRequest,
    BadRequestSignature,
    StaleRequest,
    ReplayedRequest,
    /// An enrolment token (workload identity) that does not verify against
    /// the enrolment its issuer names, or a runner whose enrolment was
    /// revoked.
    EnrolmentRefused,
    /// Its host is below the kernel or Landlock ABI the operator requires.
    HostBelowMinimum,
}

impl RunnerRejection {
    /// The reason as the API answers it (and as it is recorded).
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerRejection::Revoked => "revoked",
            RunnerRejection::UnknownRunnerHash => "unknown_runner_hash",
            RunnerRejection::WrongEnvironment => "wrong_environment",
            RunnerRejection::WrongVersion => "wrong_version",
            RunnerRejection::ManifestExpired => "manifest_expired",
            RunnerRejection::ManifestExpiredWithGraceExceeded => {
                "manifest_expired_with_grace_exceeded"
            }
            RunnerRejection::BadSignature => "bad_signature",
            RunnerRejection::StalePolicy => "stale_policy",
            RunnerRejection::StaleManifest => "stale_manifest",
            RunnerRejection::OpsBeyondManifest => "ops_beyond_manifest",
            RunnerRejection::BadRequest => "bad_request",
            RunnerRejection::BadRequestSignature => "bad_request_signature",
            RunnerRejection::StaleRequest => "stale_request",
            RunnerRejection::ReplayedRequest => "replayed_request",
            RunnerRejection::EnrolmentRefused => "enrolment_refused",
            RunnerRejection::HostBelowMinimum => "host_below_minimum",
        }
    }
}

impl From<crate::lifecycle::Stop> for RunnerRejection {
    fn from(stop: crate::lifecycle::Stop) -> Self {
        match stop {
            crate::lifecycle::Stop::ManifestExpired => RunnerRejection::ManifestExpired,
            crate::lifecycle::Stop::GraceExceeded => {
                RunnerRejection::ManifestExpiredWithGraceExceeded
            }
            crate::lifecycle::Stop::Revoked => RunnerRejection::Revoked,
        }
    }
}

/// The control plane refused a runner's registration, claim or signed
/// request. At registration there is no runner id yet, but what the runner
/// claimed to be (`policyHash`, `environment`, `version`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerRejected {
    pub reason: RunnerRejection,
    pub message: String,
    pub runner_hash: String,
    pub manifest_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Who vouched for a runner that registered through an enrolment: the
/// enrolment, and what the identity provider's token said of the holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrolledIdentity {
    pub enrolment_id: String,
    pub subject: String,
    /// RFC 3339: when the token that registered it expires.
    pub token_expires_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// Kubernetes' `kubernetes.io` claims, where the token had them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A runner registered with the control plane (with a bootstrap token, or
/// an enrolment's token: then `enrolment` says whose).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerRegistered {
    pub runner_id: String,
    pub runner_hash: String,
    pub manifest_hash: String,
    pub policy_hash: String,
    pub environment: String,
    pub version: String,
    pub ops: Vec<OpKind>,
    pub sandbox_mode: SandboxMode,
    /// RFC 3339.
    pub boot_time: String,
    /// Runs it serves at once.
    pub slots: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrolment: Option<EnrolledIdentity>,
    /// The workload classes it offers (left out: `namespace` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_classes: Vec<crate::mode::WorkloadClass>,
    /// What its host can give (left out by runners older than classes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::host::HostFeatures>,
    /// The host it runs on (`/etc/machine-id`, or what the operator named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// The operator's labels (`zone=a`, `dedicated=acme`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// CPU (millicores) it may hand out to runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
    /// Memory (bytes) it may hand out to runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

#[cfg(test)]
mod rejection_tests {
    use super::*;

    #[test]
    fn a_rejection_answers_with_the_name_it_is_recorded_under() {
        for reason in [
            RunnerRejection::Revoked,
            RunnerRejection::UnknownRunnerHash,
            RunnerRejection::WrongEnvironment,
            RunnerRejection::WrongVersion,
            RunnerRejection::ManifestExpired,
            RunnerRejection::ManifestExpiredWithGraceExceeded,
            RunnerRejection::BadSignature,
            RunnerRejection::StalePolicy,
            RunnerRejection::StaleManifest,
            RunnerRejection::OpsBeyondManifest,
            RunnerRejection::BadRequest,
            RunnerRejection::BadRequestSignature,
            RunnerRejection::StaleRequest,
            RunnerRejection::ReplayedRequest,
            RunnerRejection::EnrolmentRefused,
            RunnerRejection::HostBelowMinimum,
        ] {
            assert_eq!(
                serde_json::to_value(reason).ok(),
                Some(serde_json::Value::from(reason.as_str()))
            );
        }
        for stop in [
            crate::lifecycle::Stop::ManifestExpired,
            crate::lifecycle::Stop::GraceExceeded,
            crate::lifecycle::Stop::Revoked,
        ] {
            assert_eq!(RunnerRejection::from(stop).as_str(), stop.as_str());
        }
    }
}

/// One check of a teardown: what was verified, and how it came out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TeardownCheck {
    /// `processes`, `mounts`, `files` or `cgroups`.
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

/// The runner tore a run down once it stopped serving it (finished,
/// failed, ended by the control plane, given back): it killed what was
/// left, removed the run's workspace, and checked that nothing of the run
/// is left on its host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunDestroyed {
    pub runner_id: String,
    /// Every check passed.
    pub ok: bool,
    pub checks: Vec<TeardownCheck>,
}

/// A runner that started found what runs it no longer holds left on its
/// host (after a kill -9 or a reboot) and tore each down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerJanitor {
    pub runner_id: String,
    /// The runs whose leftovers were found.
    pub runs: Vec<String>,
    /// Every check passed.
    pub ok: bool,
    pub checks: Vec<TeardownCheck>,
}
