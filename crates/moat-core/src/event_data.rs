//! The payload of every event type, typed: one shape per type (issue 15).
//!
//! [`Event::data`](crate::Event) stays a JSON object on the wire and in the
//! ledgers; [`EventData`] is what that object must be for its `type`.
//! Keys are today's keys; a key that only some emitters write is an
//! `Option`, and a key written as `null` reads as `None`. Every struct
//! refuses keys it does not know, so a new key is a schema change here, not
//! a surprise in a ledger.
//!
//! Two kinds of keys are added after an event is made, and are optional on
//! the types they reach: `sandboxRunId` (the capability shell relabels the
//! sandbox's and the egress proxy's events with the agent's run, keeping the
//! sandbox's own id there) and `runnerId`/`runnerHash`/`manifestHash` (the
//! control plane stamps them on everything a runner reports).

mod capability;
mod network;
mod run;
mod runner;
mod sandbox;
#[cfg(test)]
mod tests;

pub use capability::{
    ArtifactCreated, CapabilityDenied, CapabilityGranted, CapabilityRequested, GrantedCapability,
    PathDenied, PolicyDecision,
};
pub use network::{NetworkDecision, NetworkDenied, NetworkRequest};
pub use run::{
    ApprovalDenied, ApprovalExpired, ApprovalGranted, ApprovalRequested, ApprovalSummary,
    FinalRunState, ManifestPublished, ManifestRevoked, OpFinished, RefusalReason, RequestRefused,
    RunClaimed, RunCreated, RunDeadLettered, RunFinished, RunInput, RunLeaseExpired, RunRetried,
    RunStarted,
};
pub use runner::{
    RunnerManifestLoaded, RunnerManifestRefreshFailed, RunnerManifestRefreshed, RunnerPolicyLoaded,
    RunnerRegistered, RunnerRejected, RunnerRejection, RunnerSelected, RunnerStarted,
};
pub use sandbox::{
    ProcessTimeout, SandboxDangerFullAccess, SandboxExecDenied, SandboxExecFinished,
    SandboxExecStarted, SandboxRoot, SandboxSyscallDenied,
};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::event::{Event, EventType};

// One list drives the enum, `event_type` and `parse`, so the three cannot
// drift apart; the names must be `EventType`'s (a test holds them to it).
macro_rules! event_data {
    ($($variant:ident => $name:literal),+ $(,)?) => {
        /// An event's type with its payload: serialised as
        /// `{"type": "<name>", "data": {...}}`, the two keys of [`Event`]
        /// they stand for.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "type", content = "data", deny_unknown_fields)]
        pub enum EventData {
            $(#[serde(rename = $name)] $variant($variant)),+
        }

        impl EventData {
            pub fn event_type(&self) -> EventType {
                match self {
                    $(EventData::$variant(_) => EventType::$variant),+
                }
            }

            /// The `data` object alone.
            pub fn into_data(self) -> serde_json::Value {
                // These types serialise to JSON without fail: string keys
                // only, no floats, no fallible `Serialize` of their own.
                match self {
                    $(EventData::$variant(d) => serde_json::to_value(d).unwrap_or_default()),+
                }
            }

            /// `data` read as the payload of `event_type`; an unknown key, a
            /// missing one or a wrong type is an error.
            pub fn parse(
                event_type: EventType,
                data: &serde_json::Value,
            ) -> Result<EventData, serde_json::Error> {
                match event_type {
                    $(EventType::$variant => $variant::deserialize(data).map(EventData::$variant)),+
                }
            }
        }
    };
}

event_data! {
    RunnerSelected => "runner.selected",
    RunnerStarted => "runner.started",
    RunnerPolicyLoaded => "runner.policy.loaded",
    RunnerManifestLoaded => "runner.manifest.loaded",
    RunnerManifestRefreshed => "runner.manifest.refreshed",
    RunnerManifestRefreshFailed => "runner.manifest.refresh_failed",
    RunnerRejected => "runner.rejected",
    CapabilityRequested => "capability.requested",
    CapabilityGranted => "capability.granted",
    CapabilityDenied => "capability.denied",
    SandboxExecStarted => "sandbox.exec.started",
    SandboxExecDenied => "sandbox.exec.denied",
    SandboxExecFinished => "sandbox.exec.finished",
    SandboxSyscallDenied => "sandbox.syscall.denied",
    SandboxDangerFullAccess => "sandbox.danger_full_access",
    ArtifactCreated => "artifact.created",
    ProcessTimeout => "process.timeout",
    NetworkDenied => "network.denied",
    NetworkRequest => "network.request",
    PathDenied => "path.denied",
    RunCreated => "run.created",
    RunStarted => "run.started",
    RunFinished => "run.finished",
    RunClaimed => "run.claimed",
    RunLeaseExpired => "run.lease_expired",
    RunRetried => "run.retried",
    RunDeadLettered => "run.dead_lettered",
    RunnerRegistered => "runner.registered",
    ManifestPublished => "manifest.published",
    ManifestRevoked => "manifest.revoked",
    OpFinished => "op.finished",
    ApprovalRequested => "approval.requested",
    ApprovalGranted => "approval.granted",
    ApprovalDenied => "approval.denied",
    ApprovalExpired => "approval.expired",
    RequestRefused => "request.refused",
}

impl Event {
    /// An event of `data`'s type; the caller sets `op_id` and
    /// `correlation_id` where the event has them.
    pub fn of(data: EventData, at: String, run_id: String) -> Event {
        Event {
            event_type: data.event_type(),
            at,
            run_id,
            op_id: None,
            correlation_id: None,
            data: data.into_data(),
        }
    }
}
