//! The runner's endpoints (`/v1/runner/...`): registration with a
//! bootstrap token, then requests signed with the per-boot key.

use moat_core::{Envelope, Event, OpKind, OpResult, SignedManifest};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::views::{RunInput, RunView};

/// The `profile` of an `http_request` that is a call to one of the org's
/// tools: the control plane makes it (it holds the credential), the runner
/// only asks for it.
pub const TOOL_PROFILE: &str = "control-plane-tool-proxy";

/// `POST /v1/runner/register` (bearer: a single-use bootstrap token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Registration {
    /// SHA-256 of the sealed runner binary.
    pub runner_hash: String,
    pub signed_manifest: SignedManifest,
    pub version: String,
    pub environment: String,
    pub ops: Vec<OpKind>,
    pub sandbox_mode: String,
    pub boot_time: String,
    /// The per-boot Ed25519 key every later request is signed with (base64).
    pub public_key: String,
    /// How many runs it serves at once (older runners do not say: one).
    #[serde(default = "one_slot")]
    pub slots: i64,
    /// The workload classes it offers, each listed by its manifest (older
    /// runners do not say: `namespace`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_classes: Vec<moat_core::WorkloadClass>,
    /// What its host can give (kernel, Landlock ABI, cgroup version,
    /// hardware virtualization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<moat_core::host::HostFeatures>,
    /// The host it runs on: stable across restarts (`/etc/machine-id` by
    /// default), so that runs and capacity can be told by host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// The operator's labels (`zone=a`, `dedicated=acme`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// CPU it may hand out to runs, in millicores (older runners do not
    /// say: nothing is reserved against them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
    /// Memory it may hand out to runs, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

fn one_slot() -> i64 {
    1
}

/// The answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Registered {
    pub runner_id: String,
    /// How long a claim lives without a renewal.
    pub lease_ms: u64,
    /// The longest `?wait_ms=` the control plane honours.
    pub max_wait_ms: u64,
    /// A run's finish may carry its teardown ([`FinishBody::teardown`]):
    /// one request where a run that started nothing took two. Older
    /// control planes do not say so (false): the runner reports the
    /// teardown on its own.
    #[serde(default)]
    pub finish_takes_teardown: bool,
    /// A run's last report (its finish with its teardown, or its teardown
    /// report) may claim the slot's next run ([`FinishBody::then_claim_ms`],
    /// [`TornDown::then_claim_ms`]): one request where there were two.
    /// Older control planes do not say so (false): the runner claims on
    /// its own.
    #[serde(default)]
    pub last_report_takes_claim: bool,
}

/// `POST /v1/runner/events`: the runner's own provenance events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsBody {
    pub events: Vec<Event>,
}

/// How many events were recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EventsRecorded {
    pub recorded: u64,
}

/// `POST /v1/runner/claim`: a run, its inputs with their bytes, and the
/// latest time it may finish on the runner's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub run: RunView,
    pub inputs: Vec<RunInput>,
    pub finish_by: String,
    /// The run's first step, when the claim already knows it: `finish`
    /// for a run the agent asked to finish while it was queued, with no
    /// operation open. The runner then takes it without asking `next`
    /// (one request fewer); absent, it asks. Older control planes never
    /// say, older runners ignore it and ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Next>,
}

/// `POST /v1/runner/runs/{run}/next`: what to do next in a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(
    tag = "action",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum Next {
    /// Run this operation (its capability inside the envelope).
    Op {
        envelope: Box<Envelope>,
        /// A one-operation token for the org's tools, handed to the
        /// program on its stdin by the shell.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_token: Option<String>,
        /// The value of the org secret a `browser_step` `fill_secret` names,
        /// handed to the shell beside the envelope (absent: the org has no
        /// such secret, and the step fails).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "Option<String>")]
        secret_value: Option<zeroize::Zeroizing<String>>,
    },
    /// The agent asked to finish and nothing is left: report the end.
    Finish,
    /// The run ended elsewhere (cancelled, dead-lettered): stop serving it.
    Ended,
}

/// `POST /v1/runner/runs/{run}/heartbeat`: the renewed lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub lease_until: String,
}

/// An artifact a result names, with its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReportedArtifact {
    pub sha256: String,
    pub kind: String,
    pub label: String,
    pub content_base64: String,
}

/// `POST /v1/runner/runs/{run}/ops/{op}/result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultBody {
    pub result: OpResult,
    /// The events the shell recorded for this operation.
    #[serde(default)]
    pub events: Vec<Event>,
    #[serde(default)]
    pub artifacts: Vec<ReportedArtifact>,
    /// The new snapshot of each read-write volume the operation changed,
    /// already stored (`PUT .../snapshots/{id}`): recorded as the volume's
    /// head with the result, or not at all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeHead>,
}

/// `POST /v1/runner/runs/{run}/ops/{op}/element`: what an acting browser
/// step would act on, as the runner's browser found it (the shell's
/// `element_unchecked` answer), to be decided on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ElementBody {
    pub element: moat_core::element::ElementFacts,
    /// The events the shell recorded for the step so far.
    #[serde(default)]
    pub events: Vec<Event>,
}

/// The decision on an acting step's element.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(
    tag = "decision",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum ElementDecision {
    /// Take the step: its capability now binds the element.
    Act {
        envelope: Box<Envelope>,
        /// As [`Next::Op`]'s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "Option<String>")]
        secret_value: Option<zeroize::Zeroizing<String>>,
    },
    /// Not now: the step waits for a person (`pending_approval`) or was
    /// refused (`denied`); either way the runner asks for its next step.
    Held { state: String },
}

/// A volume's new head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VolumeHead {
    pub volume: moat_core::ids::VolumeName,
    pub snapshot: moat_core::ids::Sha256,
    pub files: u64,
    pub bytes: u64,
}

/// A chunk of a volume, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ChunkName {
    pub sha256: moat_core::ids::Sha256,
    pub len: u32,
}

/// `POST /v1/runner/runs/{run}/volumes/{volume}/missing`: which of these
/// chunks the org's store lacks (asked and answered in batches).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ChunkNames {
    pub chunks: Vec<ChunkName>,
}

/// Whether a result or an end was recorded (`false`: it already was, or
/// the run is no longer this runner's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Recorded {
    pub recorded: bool,
}

/// `POST /v1/runner/runs/{run}/release`: the run is queued again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Released {
    /// The attempts it has had, the released claim not counted.
    pub attempts: i64,
}

/// How a runner ends a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunEnd {
    Succeeded,
    Failed,
}

/// `POST /v1/runner/runs/{run}/finish`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishBody {
    pub state: RunEnd,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the shell recorded as the run ended (the browser sessions it
    /// left open, closed then): shell events, as with a result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<moat_core::Event>,
    /// The run's teardown, done before its finish (a run that started
    /// nothing on the runner): recorded after its end, in the same
    /// transaction, as `POST .../destroyed` would record it. Only to a
    /// control plane that says it takes one
    /// ([`Registered::finish_takes_teardown`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teardown: Option<Teardown>,
    /// Then claim the runner's next run, waiting up to this many
    /// milliseconds, as `POST /v1/runner/claim?wait_ms=` would: the run
    /// comes with the answer ([`Reported::claim`]), whether or not this
    /// finish took effect. Only to a control plane that says it takes one
    /// ([`Registered::last_report_takes_claim`]).
    #[serde(
        default,
        rename = "thenClaimMs",
        skip_serializing_if = "Option::is_none"
    )]
    pub then_claim_ms: Option<u64>,
}

/// The answer to a run's last report (its finish, its teardown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reported {
    /// Whether it was recorded (a finish: `false` when the end already
    /// was, or the run is no longer this runner's).
    pub recorded: bool,
    /// The run its `thenClaimMs` claimed; absent when none came in time or
    /// none was asked for (or the runner may claim nothing now: draining,
    /// its manifest expired; its own claim says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Box<Claim>>,
}

/// `POST /v1/runner/runs/{run}/shell-ended`: what a run's shell recorded
/// as it ended between operations (a refreshed manifest, a drain), closing
/// the browser sessions it held: shell events, as with a finish.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellEnded {
    pub events: Vec<moat_core::Event>,
}

/// A run's teardown, as a finish carries it ([`FinishBody::teardown`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Teardown {
    pub checks: Vec<moat_core::event_data::TeardownCheck>,
}

/// `POST /v1/runner/runs/{run}/destroyed`: the runner tore the run down
/// (recorded as `run.destroyed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TornDown {
    pub checks: Vec<moat_core::event_data::TeardownCheck>,
    /// As [`FinishBody::then_claim_ms`]: the run's last report, it claims
    /// the slot's next run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then_claim_ms: Option<u64>,
}

/// `POST /v1/runner/janitor`: leftovers of runs this runner no longer
/// holds, torn down at its start (recorded as `runner.janitor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Janitor {
    pub runs: Vec<String>,
    pub checks: Vec<moat_core::event_data::TeardownCheck>,
}

/// `POST /v1/runner/manifest`: the runner swapped to this manifest; the
/// answer echoes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ManifestRefreshed {
    pub manifest_hash: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_tagged_by_action() -> Result<(), serde_json::Error> {
        assert_eq!(
            serde_json::to_value(Next::Finish)?,
            serde_json::json!({"action": "finish"})
        );
        let ended: Next = serde_json::from_str(r#"{"action":"ended"}"#)?;
        assert_eq!(ended, Next::Ended);
        assert!(serde_json::from_str::<Next>(r#"{"action":"reboot"}"#).is_err());
        Ok(())
    }

    #[test]
    fn requests_refuse_unknown_fields_and_bad_states() {
        assert!(serde_json::from_str::<FinishBody>(r#"{"state":"succeeded","x":1}"#).is_err());
        assert!(serde_json::from_str::<FinishBody>(r#"{"state":"paused"}"#).is_err());
        assert!(serde_json::from_str::<FinishBody>(r#"{"state":"failed"}"#).is_ok());
    }

    #[test]
    fn answers_tolerate_new_fields() -> Result<(), serde_json::Error> {
        let r: Registered = serde_json::from_str(
            r#"{"runnerId":"r","leaseMs":30000,"maxWaitMs":25000,"later":true}"#,
        )?;
        assert_eq!(r.lease_ms, 30_000);
        assert!(serde_json::from_str::<Registered>(r#"{"runnerId":"r"}"#).is_err());
        assert!(
            !r.last_report_takes_claim,
            "an older control plane takes no claim with a report"
        );
        Ok(())
    }

    #[test]
    fn an_older_control_planes_answer_to_a_last_report_reads_as_one_with_no_claim()
    -> Result<(), serde_json::Error> {
        let finished: Reported = serde_json::from_str(r#"{"recorded":true}"#)?;
        assert_eq!(
            finished,
            Reported {
                recorded: true,
                claim: None
            }
        );
        let asking: FinishBody =
            serde_json::from_str(r#"{"state":"succeeded","thenClaimMs":5000}"#)?;
        assert_eq!(asking.then_claim_ms, Some(5000));
        // And a finish that asks for no claim is what older runners sent.
        let body = FinishBody {
            state: RunEnd::Succeeded,
            error: None,
            events: Vec::new(),
            teardown: None,
            then_claim_ms: None,
        };
        assert_eq!(
            serde_json::to_value(&body)?,
            serde_json::json!({"state": "succeeded"})
        );
        let torn_down = TornDown {
            checks: Vec::new(),
            then_claim_ms: None,
        };
        assert_eq!(
            serde_json::to_value(&torn_down)?,
            serde_json::json!({"checks": []})
        );
        Ok(())
    }
}

/// `GET /v1/runner/runs/{run}/ingress`: connections waiting for the
/// runner, each to be carried through a tunnel of its own
/// (`POST /v1/runner/runs/{run}/ingress/{conn}`, upgraded) to the port's
/// socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IngressDials {
    pub dials: Vec<IngressDial>,
}

/// One connection from the runtime to a port of the run's operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IngressDial {
    /// Names the tunnel to open for it (random, single-use).
    pub conn: String,
    /// The sandbox's port.
    pub port: u16,
    /// The control plane replica to open the tunnel to (its advertised
    /// URL), when it is not the one asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}
