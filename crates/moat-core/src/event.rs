//! Events: the record of every decision. The names are the protocol's
//! (docs/architecture.md, "Protocol and events"; schema in docs/schema/).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::event_data;

// One list drives both enums (the type's name, its payload) and the
// functions between them, so they cannot drift apart. Each variant's
// payload is the `event_data` struct of the same name.
macro_rules! event_types {
    ($($(#[$meta:meta])* $variant:ident => $text:literal),+ $(,)?) => {
        /// Every event type Moat emits.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
        pub enum EventType {
            $($(#[$meta])* #[serde(rename = $text)] $variant),+
        }

        impl EventType {
            pub const ALL: &'static [EventType] = &[$(EventType::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $(EventType::$variant => $text),+ }
            }
        }

        /// An event's type with its payload: serialised as
        /// `{"type": "<name>", "data": {...}}`, the two keys of [`Event`]
        /// they stand for.
        // The largest payload is a whole sandbox report (about 600 bytes);
        // an event is built and moved a handful of times per operation,
        // so boxing it would buy nothing measurable.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "type", content = "data", deny_unknown_fields)]
        pub enum EventData {
            $(#[serde(rename = $text)] $variant(event_data::$variant)),+
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
                    $(EventType::$variant => {
                        event_data::$variant::deserialize(data).map(EventData::$variant)
                    }),+
                }
            }
        }
    };
}

event_types! {
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
    /// The sandbox was set up and the program is about to start.
    SandboxExecStarted => "sandbox.exec.started",
    /// The sandbox refused to start: a protection could not be applied.
    SandboxExecDenied => "sandbox.exec.denied",
    /// The program ended; carries the full report.
    SandboxExecFinished => "sandbox.exec.finished",
    /// The seccomp layer refused a syscall (one event per syscall name, counted).
    SandboxSyscallDenied => "sandbox.syscall.denied",
    /// A Landlock rule refused an access inside the sandbox, as the kernel's
    /// audit log told the launcher (one event per access and object, counted
    /// in the report's `violations`).
    SandboxViolation => "sandbox.violation",
    /// A run used `danger-full-access`. Emitted every time.
    SandboxDangerFullAccess => "sandbox.danger_full_access",
    /// A worker called one of Moat's bindings (served or refused).
    WorkerBinding => "worker.binding",
    ArtifactCreated => "artifact.created",
    /// A file a program wrote passed the manifest's export rules and was
    /// stored as an artifact (`artifact.created` names it too).
    ArtifactPromoted => "artifact.promoted",
    /// A file a program wrote passed the export rules and waits for the
    /// approval the policy asks for: held, not yet downloadable.
    ArtifactValidated => "artifact.validated",
    /// A file a program wrote failed the export rules: it stays behind,
    /// quarantined in the run's workspace, and is never an artifact.
    ArtifactRejected => "artifact.rejected",
    ProcessTimeout => "process.timeout",
    /// The egress proxy refused a request or cut a connection; carries the reason.
    NetworkDenied => "network.denied",
    /// One request through the egress proxy, allowed or not: host, port, method,
    /// bytes each way, decision. Never bodies or credential headers.
    NetworkRequest => "network.request",
    /// One connection the runtime made to a port an `ingress-only` sandbox
    /// exposes: port, the first request's method, path and status, bytes
    /// each way. Never bodies, queries or headers.
    NetworkIngress => "network.ingress",
    PathDenied => "path.denied",
    RunCreated => "run.created",
    RunStarted => "run.started",
    /// A run ended (succeeded or failed); `data.state` says which.
    RunFinished => "run.finished",
    /// A runner claimed the run under a lease.
    RunClaimed => "run.claimed",
    /// The runner holding the run stopped renewing its lease.
    RunLeaseExpired => "run.lease_expired",
    /// The run was queued again after a lost lease.
    RunRetried => "run.retried",
    /// A runner took over a run another runner lost and restored its
    /// persistent areas from their last snapshots (hashes verified).
    RunResumed => "run.resumed",
    /// An operation changed a persistent area and its snapshot became the
    /// volume's head, in the transaction that recorded the result.
    VolumeSnapshotted => "volume.snapshotted",
    /// A runner's claim of the queued run was refused by the placement
    /// policy (recorded once per runner and reason): it stays queued.
    RunPlacementDenied => "run.placement_denied",
    /// Its runner gave the run back unfinished (it is stopping); queued
    /// again without counting an attempt.
    RunReleased => "run.released",
    /// What the run used, summed when it ended: ops by state, CPU, memory,
    /// program time, egress.
    RunUsage => "run.usage",
    /// Its runner tore the run down: what was killed and removed, and the
    /// checks that nothing of it is left on the host.
    RunDestroyed => "run.destroyed",
    /// The run ended without success and needs an operator (retries spent,
    /// manifest expired past its grace).
    RunDeadLettered => "run.dead_lettered",
    /// A queue message's step: received (or refused as a duplicate of one
    /// by its idempotency key), delivered to a run of its queue's worker,
    /// acknowledged, retried, dead-lettered, redriven; `data.state`.
    QueueMessage => "queue.message",
    /// A runner registered with the control plane.
    RunnerRegistered => "runner.registered",
    /// A runner that started tore down the leftovers of runs it no longer holds.
    RunnerJanitor => "runner.janitor",
    /// A signed manifest was published to the control plane.
    ManifestPublished => "manifest.published",
    /// A manifest or its signing key was revoked.
    ManifestRevoked => "manifest.revoked",
    /// An operation's result came back from the runner.
    OpFinished => "op.finished",
    ApprovalRequested => "approval.requested",
    ApprovalGranted => "approval.granted",
    ApprovalDenied => "approval.denied",
    ApprovalExpired => "approval.expired",
    /// The control plane refused a request it keeps a record of (a run whose
    /// inputs carry a secret, a cross-site Inspector form); `data.reason`.
    RequestRefused => "request.refused",
}

/// One event. `data` holds the type-specific payload: ids, hashes, decisions,
/// denial reasons, enforcement reports — never secrets or large output. Its
/// shape for each type is [`crate::EventData`]'s (built with [`Event::of`]);
/// it stays JSON here so a stored event keeps the bytes it was chained with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// RFC 3339 UTC timestamp.
    pub at: String,
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    pub data: serde_json::Value,
}

/// Where a layer sends its events (a JSON-lines file, the ledger, a test vector).
pub trait EventSink {
    fn emit(&mut self, event: Event);
}

impl EventSink for Vec<Event> {
    fn emit(&mut self, event: Event) {
        self.push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_the_protocols() {
        let names: Vec<_> = EventType::ALL.iter().map(|t| t.as_str()).collect();
        for name in [
            "runner.manifest.refresh_failed",
            "capability.denied",
            "sandbox.exec.finished",
            "process.timeout",
            "path.denied",
        ] {
            assert!(names.contains(&name), "{name}");
        }
        let json = serde_json::to_string(&EventType::SandboxExecStarted).unwrap_or_default();
        assert_eq!(json, "\"sandbox.exec.started\"");
    }
}
