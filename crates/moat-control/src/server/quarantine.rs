//! The export boundary's last check, on the control plane: a runner's shell
//! holds none of the org's secrets, so its scan looks for credential shapes
//! only. Here, where the secrets are, a file the shell promoted that holds
//! one of them (in any encoding the scrubber knows) is turned back into a
//! rejection before anything is stored: its bytes are dropped, its
//! `artifact.promoted` becomes `artifact.rejected` (rule `secret`), and the
//! op result says so. Scrubbing it and keeping the rest, as is done for
//! stdout and tool responses, would promote a file its author never wrote.

use moat_core::event_data::ArtifactRejected;
use moat_core::exports::{RejectRule, Rejection};
use moat_core::{Event, EventData, EventType};
use moat_store::NewArtifact;
use serde_json::{Value, json};

use crate::tools::Scrubber;

/// The kind of artifact the shell makes of a promoted file.
const EXPORT_KIND: &str = "export";

/// What a rejection for an org secret says: never which secret.
const SECRET_DETAIL: &str = "holds one of the org's stored secrets";

/// Rejects every promoted file among `blobs` that holds one of the org's
/// secrets, rewriting `result` (the op result as JSON) and `events` to
/// match. Returns how many were rejected.
pub fn reject_exports_holding_secrets(
    scrubber: &Scrubber,
    result: &mut Value,
    events: &mut Vec<Event>,
    blobs: &mut Vec<NewArtifact>,
) -> usize {
    if scrubber.is_empty() {
        return 0;
    }
    let mut rejected_shas = Vec::new();
    blobs.retain(|blob| {
        let holds_secret = blob.kind == EXPORT_KIND && scrubber.bytes(&blob.data).is_some();
        if holds_secret {
            rejected_shas.push(blob.sha256.clone());
        }
        !holds_secret
    });
    if rejected_shas.is_empty() {
        return 0;
    }
    let is_rejected = |v: &Value| {
        v["sha256"]
            .as_str()
            .is_some_and(|s| rejected_shas.iter().any(|r| r == s))
    };
    if let Some(refs) = result["artifacts"].as_array_mut() {
        refs.retain(|r| !(r["kind"] == EXPORT_KIND && is_rejected(r)));
    }
    let reasons = vec![Rejection {
        rule: RejectRule::Secret,
        detail: SECRET_DETAIL.to_owned(),
    }];
    if let Some(exports) = result.pointer_mut("/result/exports") {
        let mut moved = Vec::new();
        if let Some(promoted) = exports["promoted"].as_array_mut() {
            promoted.retain(|p| {
                let keep = !is_rejected(p);
                if !keep {
                    moved.push(json!({"path": p["path"], "reasons": reasons}));
                }
                keep
            });
        }
        if let Some(rejected) = exports["rejected"].as_array_mut() {
            rejected.extend(moved);
        }
    }
    events.retain(|e| {
        !(e.event_type == EventType::ArtifactCreated
            && e.data["kind"] == EXPORT_KIND
            && is_rejected(&e.data))
    });
    for e in events.iter_mut() {
        if e.event_type != EventType::ArtifactPromoted || !is_rejected(&e.data) {
            continue;
        }
        let text = |key: &str| e.data[key].as_str().map(str::to_owned);
        let rejected = ArtifactRejected {
            path: text("path").unwrap_or_default(),
            size: e.data["size"].as_u64().unwrap_or(0),
            sha256: text("sha256"),
            reasons: reasons.clone(),
            runner_id: text("runnerId"),
            runner_hash: text("runnerHash"),
            manifest_hash: text("manifestHash"),
        };
        let data = EventData::ArtifactRejected(rejected);
        e.event_type = data.event_type();
        e.data = data.into_data();
    }
    rejected_shas.len()
}
