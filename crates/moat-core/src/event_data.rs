//! The payload of every event type, typed: one shape per type (issue 15).
//!
//! [`Event::data`](crate::Event) stays a JSON object on the wire and in the
//! ledgers; [`EventData`] (declared with [`crate::EventType`], from the
//! same list) is what that object must be for its `type`.
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
    ArtifactCreated, ArtifactPromoted, ArtifactRejected, ArtifactValidated, CapabilityDenied,
    CapabilityGranted, CapabilityRequested, GrantedCapability, PathDenied, PolicyDecision,
};
pub use network::{NetworkDecision, NetworkDenied, NetworkIngress, NetworkRequest};
pub use run::{
    ApprovalDenied, ApprovalExpired, ApprovalGranted, ApprovalRequested, ApprovalSummary,
    FinalRunState, ManifestPublished, ManifestRevoked, OpFinished, QueueMessage, QueueMessageState,
    RefusalReason, RequestRefused, RunClaimed, RunCreated, RunDeadLettered, RunFinished, RunInput,
    RunLeaseExpired, RunPlacementDenied, RunReleased, RunResumed, RunRetried, RunStarted, RunUsage,
    VolumeAttached, VolumeRestored, VolumeSnapshotted,
};
pub use runner::{
    EnrolledIdentity, RunDestroyed, RunnerJanitor, RunnerManifestLoaded,
    RunnerManifestRefreshFailed, RunnerManifestRefreshed, RunnerPolicyLoaded, RunnerRegistered,
    RunnerRejected, RunnerRejection, RunnerSelected, RunnerStarted, TeardownCheck,
};
pub use sandbox::{
    ProcessTimeout, SandboxDangerFullAccess, SandboxExecDenied, SandboxExecFinished,
    SandboxExecStarted, SandboxRoot, SandboxSyscallDenied, SandboxViolation, WorkerBinding,
};

#[cfg(test)]
use crate::event::EventType;
use crate::event::{Event, EventData};

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
