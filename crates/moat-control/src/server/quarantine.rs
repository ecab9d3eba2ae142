//! The export boundary's last checks, on the control plane, over the files
//! a runner's shell promoted, before anything of them is stored:
//!
//! 1. The shell holds none of the org's secrets, so its scan looks for
//!    credential shapes only. Here, where the secrets are, a file holding
//!    one of them, or named with one, is rejected whole (rule `secret`),
//!    found by the same scanner `moat export --secrets` uses (as is,
//!    percent-encoded, JSON-escaped, base64 at any alignment, wrapped or
//!    not; inside a gzip or zip, decompressed with the verifier's code, too:
//!    one that does not unpack within bounds is rejected). Scrubbing it and keeping the
//!    rest, as is done for stdout and tool responses, would promote a file
//!    its author never wrote.
//! 2. The policy decides whether each file may leave (action `export`):
//!    no permit rejects it (rule `policy`); a permit marked
//!    `@approval("required")` holds it for a person (`artifact.validated`,
//!    `approval.requested`): its bytes are stored, but it is no artifact
//!    until the approval promotes it.
//!
//! Each changes the op result (`exports.promoted`, `.rejected`, `.pending`,
//! `artifacts`) and the runner's events to match.

use moat_core::event_data::{
    ApprovalRequested, ApprovalSummary, ArtifactRejected, ArtifactValidated,
};
use moat_core::exports::{ExportType, RejectRule, Rejection};
use moat_core::{Event, EventData, EventType};
use moat_store::{HeldExport, NewArtifact, RunnerRow, stamp, typed_event};
use serde_json::{Value, json};

use crate::policy::{Decision, ExportRequest, ORG_STORE, PolicyEngine};
use crate::vault::Secret;
use moat_export::secrets::Finding;

/// The kind of artifact the shell makes of a promoted file.
const EXPORT_KIND: &str = "export";

/// What a rejection for an org secret says: never which secret.
const SECRET_DETAIL: &str = "holds one of the org's stored secrets";
/// What it says of a compressed file the control plane could not look into.
const UNSCANNED_DETAIL: &str =
    "compressed content the control plane could not unpack to look for the org's secrets";

/// The most a promoted gzip or zip may hold, decompressed, for the control
/// plane to look into it for the org's secrets (past it, the file is
/// rejected as holding one: it cannot be shown not to).
const MAX_UNPACKED: u64 = 256 << 20;

/// The most of a text file the approver is shown.
pub const PREVIEW_BYTES: usize = 4096;

/// One op's report, as the control plane rewrites it.
pub struct Report<'a> {
    pub result: &'a mut Value,
    pub events: &'a mut Vec<Event>,
    pub blobs: &'a mut Vec<NewArtifact>,
}

/// What the policy's decisions need besides the report.
pub struct Deciding<'a> {
    pub policy: &'a PolicyEngine,
    /// The org's name: policies name orgs by it (`Moat::Org::"acme"`).
    pub org_name: &'a str,
    pub runner: &'a RunnerRow,
    pub run: &'a str,
    pub op: &'a str,
    pub now: i64,
    pub approval_ttl_ms: i64,
}

/// A file the shell promoted, as its `artifact.promoted` names it.
struct Promoted {
    path: String,
    sha256: String,
    size: u64,
    exported_as: ExportType,
}

fn promoted(events: &[Event]) -> Vec<Promoted> {
    events
        .iter()
        .filter(|e| e.event_type == EventType::ArtifactPromoted)
        .filter_map(|e| {
            Some(Promoted {
                path: e.data["path"].as_str()?.to_owned(),
                sha256: e.data["sha256"].as_str()?.to_owned(),
                size: e.data["size"].as_u64()?,
                exported_as: serde_json::from_value(e.data["exportedAs"].clone()).ok()?,
            })
        })
        .collect()
}

/// What becomes of one promoted file.
enum Fate {
    Reject(Vec<Rejection>),
    Hold(Box<HeldExport>),
}

impl Report<'_> {
    /// The bytes the runner sent for the file at `path`, taken out of
    /// what will be stored as artifacts.
    fn take_blob(&mut self, file: &Promoted) -> Option<NewArtifact> {
        let at = self.blobs.iter().position(|b| {
            b.kind == EXPORT_KIND && b.label == file.path && b.sha256 == file.sha256
        })?;
        Some(self.blobs.remove(at))
    }

    fn blob(&self, file: &Promoted) -> Option<&NewArtifact> {
        self.blobs
            .iter()
            .find(|b| b.kind == EXPORT_KIND && b.label == file.path && b.sha256 == file.sha256)
    }

    /// Rewrites the result and events for `file`'s fate.
    fn apply(&mut self, file: &Promoted, fate: &Fate) {
        let named = |v: &Value| v["sha256"] == file.sha256.as_str();
        if let Some(refs) = self.result["artifacts"].as_array_mut() {
            refs.retain(|r| {
                !(r["kind"] == EXPORT_KIND && r["label"] == file.path.as_str() && named(r))
            });
        }
        if let Some(exports) = self.result.pointer_mut("/result/exports")
            && let Some(map) = exports.as_object_mut()
        {
            if let Some(list) = map.get_mut("promoted").and_then(Value::as_array_mut) {
                list.retain(|p| !(p["path"] == file.path.as_str() && named(p)));
            }
            let (key, entry) = match fate {
                Fate::Reject(reasons) => {
                    ("rejected", json!({"path": file.path, "reasons": reasons}))
                }
                Fate::Hold(held) => (
                    "pending",
                    json!({"path": file.path, "sha256": file.sha256,
                           "type": file.exported_as, "approvalId": held.approval_id}),
                ),
            };
            if let Some(list) = map
                .entry(key)
                .or_insert_with(|| Value::Array(Vec::new()))
                .as_array_mut()
            {
                list.push(entry);
            }
        }
        self.events.retain(|e| {
            !(e.event_type == EventType::ArtifactCreated
                && e.data["kind"] == EXPORT_KIND
                && e.data["label"] == file.path.as_str()
                && named(&e.data))
        });
        for e in self.events.iter_mut() {
            if e.event_type != EventType::ArtifactPromoted
                || e.data["path"] != file.path.as_str()
                || !named(&e.data)
            {
                continue;
            }
            let text = |key: &str| e.data[key].as_str().map(str::to_owned);
            let data = match fate {
                Fate::Reject(reasons) => EventData::ArtifactRejected(ArtifactRejected {
                    path: file.path.clone(),
                    size: file.size,
                    sha256: Some(file.sha256.clone()),
                    reasons: reasons.clone(),
                    runner_id: text("runnerId"),
                    runner_hash: text("runnerHash"),
                    manifest_hash: text("manifestHash"),
                }),
                Fate::Hold(held) => EventData::ArtifactValidated(ArtifactValidated {
                    path: file.path.clone(),
                    sha256: file.sha256.clone(),
                    size: file.size,
                    exported_as: file.exported_as,
                    approval_id: held.approval_id.clone(),
                    runner_id: text("runnerId"),
                    runner_hash: text("runnerHash"),
                    manifest_hash: text("manifestHash"),
                }),
            };
            e.event_type = data.event_type();
            e.data = data.into_data();
        }
    }
}

/// Rejects every promoted file that holds one of the org's secrets (or
/// whose path does). Returns how many were rejected; a scanner that cannot
/// be built rejects them all.
pub fn reject_secrets(secrets: &[(String, Secret)], report: &mut Report<'_>) -> usize {
    if secrets.is_empty() {
        return 0;
    }
    let values: Vec<(String, Vec<u8>)> = secrets
        .iter()
        .map(|(name, value)| (name.clone(), value.as_bytes().to_vec()))
        .collect();
    let scanner = moat_export::secrets::Scanner::new(&values);
    let holds_secret = |bytes: &[u8]| match &scanner {
        Ok(scanner) => scanner
            .scan(bytes)
            .iter()
            .any(|f| matches!(f, Finding::Secret { .. })),
        Err(_) => true,
    };
    // A compressed file is looked into as well: what a gzip or a zip holds,
    // decompressed with the verifier's own code and bounds; one that does
    // not unpack here is not let out unscanned.
    let inside = |file: &Promoted, bytes: &[u8]| match file.exported_as {
        ExportType::Gzip | ExportType::Zip => {
            match moat_export::validate::unpack(file.exported_as, bytes, MAX_UNPACKED) {
                Ok(inside) => holds_secret(&inside).then_some(SECRET_DETAIL),
                Err(_) => Some(UNSCANNED_DETAIL),
            }
        }
        _ => None,
    };
    let mut rejected = 0;
    for file in promoted(report.events) {
        let detail = match report.blob(&file) {
            _ if holds_secret(file.path.as_bytes()) => Some(SECRET_DETAIL),
            Some(b) if holds_secret(&b.data) => Some(SECRET_DETAIL),
            Some(b) => inside(&file, &b.data),
            None => None,
        };
        if let Some(detail) = detail {
            report.take_blob(&file);
            let fate = Fate::Reject(vec![Rejection {
                rule: RejectRule::Secret,
                detail: detail.to_owned(),
            }]);
            report.apply(&file, &fate);
            rejected += 1;
        }
    }
    rejected
}

/// Asks the policy about every file still promoted: rejects what it does
/// not permit, holds what needs an approval (returned, to be stored with
/// the op; its `approval.requested` is added to the events).
pub fn decide(deciding: &Deciding<'_>, report: &mut Report<'_>) -> Vec<HeldExport> {
    // Only what the boundary promoted leaves as an export: bytes of that
    // kind that no `artifact.promoted` names are dropped, not stored.
    let named: Vec<(String, String)> = promoted(report.events)
        .into_iter()
        .map(|f| (f.path, f.sha256))
        .collect();
    let is_named = |label: &str, sha: &str| named.iter().any(|(p, s)| p == label && s == sha);
    report
        .blobs
        .retain(|b| b.kind != EXPORT_KIND || is_named(&b.label, &b.sha256));
    if let Some(refs) = report.result["artifacts"].as_array_mut() {
        refs.retain(|r| {
            r["kind"] != EXPORT_KIND
                || is_named(
                    r["label"].as_str().unwrap_or_default(),
                    r["sha256"].as_str().unwrap_or_default(),
                )
        });
    }
    let mut held = Vec::new();
    let mut allowed: Vec<(String, String)> = Vec::new();
    for file in promoted(report.events) {
        let sent = report.blob(&file).map(|b| b.data.len() as u64);
        if sent != Some(file.size) {
            // A promotion the runner sent no bytes for, or other bytes
            // than it judged, is no artifact: refused like any other report
            // that does not add up.
            let fate = Fate::Reject(vec![Rejection {
                rule: RejectRule::Unreadable,
                detail: "the runner sent no content of its judged size for it".into(),
            }]);
            report.take_blob(&file);
            report.apply(&file, &fate);
            continue;
        }
        let request = ExportRequest {
            org: deciding.org_name,
            runner: &deciding.runner.id,
            path: &file.path,
            exported_as: file.exported_as.as_str(),
            size: file.size,
            destination: ORG_STORE,
        };
        let fate = match deciding.policy.decide_export(&request) {
            Ok(Decision::Allow { .. }) => {
                allowed.push((file.path.clone(), file.sha256.clone()));
                continue;
            }
            Ok(Decision::Deny { policies }) => Fate::Reject(vec![Rejection {
                rule: RejectRule::Policy,
                detail: if policies.is_empty() {
                    "no policy permits exporting it".into()
                } else {
                    format!("forbidden by {}", policies.join(", "))
                },
            }]),
            Err(e) => Fate::Reject(vec![Rejection {
                rule: RejectRule::Policy,
                detail: format!("the policy could not decide: {e}"),
            }]),
            Ok(Decision::RequireApproval { rule, risk }) => {
                let Some(blob) = report.take_blob(&file) else {
                    continue;
                };
                let hold = hold(deciding, &file, blob, rule, risk);
                report.events.push(requested(deciding, &hold));
                let fate = Fate::Hold(Box::new(hold));
                report.apply(&file, &fate);
                if let Fate::Hold(h) = fate {
                    held.push(*h);
                }
                continue;
            }
        };
        report.take_blob(&file);
        report.apply(&file, &fate);
    }
    // What is stored as an export is what the policy let out, and nothing
    // else (a second copy of a held or refused file included).
    report.blobs.retain(|b| {
        b.kind != EXPORT_KIND || allowed.iter().any(|(p, s)| *p == b.label && *s == b.sha256)
    });
    held
}

fn hold(
    deciding: &Deciding<'_>,
    file: &Promoted,
    blob: NewArtifact,
    rule: String,
    risk: String,
) -> HeldExport {
    let summary = ApprovalSummary {
        op: crate::policy::EXPORT_ACTION.to_owned(),
        resource: Some(format!("Moat::Path::{:?}", file.path)),
        size: Some(file.size),
        network: None,
        args: json!({
            "path": file.path,
            "sha256": file.sha256,
            "size": file.size,
            "type": file.exported_as,
            "destination": ORG_STORE,
            "checks": [
                format!(
                    "validated as {} by the runner's sandboxed verifier",
                    file.exported_as.as_str()
                ),
                "no executable, link, device or set-id bits, within its rule's size (runner)".to_owned(),
                "no credential-shaped strings (runner)".to_owned(),
                "none of the org's secrets (control plane)".to_owned(),
            ],
        }),
        element: None,
    };
    HeldExport {
        path: file.path.clone(),
        sha256: file.sha256.clone(),
        exported_as: file.exported_as.as_str().to_owned(),
        data: blob.data,
        approval_id: moat_core::random::new_id("apr_"),
        rule,
        risk,
        summary: serde_json::to_value(&summary).unwrap_or(Value::Null),
        expires_ms: deciding.now.saturating_add(deciding.approval_ttl_ms),
    }
}

/// The start of a text file, cut at a character boundary, and whether it
/// was cut; nothing for other types (the approver is never shown raw
/// binary). Read from the held bytes when the page is shown, never kept
/// in the approval or the ledger.
pub fn preview(ty: ExportType, data: &[u8], total: u64) -> Option<(String, bool)> {
    if !ty.is_text() {
        return None;
    }
    let head = &data[..data.len().min(PREVIEW_BYTES)];
    // Cut where the first 4 KiB end mid-character; anything else not
    // UTF-8 is shown replaced (the verifier passed it as text).
    let end = match std::str::from_utf8(head) {
        Ok(_) => head.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => head.len(),
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    Some((text, total > end as u64))
}

fn requested(deciding: &Deciding<'_>, held: &HeldExport) -> Event {
    let summary = serde_json::from_value(held.summary.clone()).unwrap_or(ApprovalSummary {
        op: crate::policy::EXPORT_ACTION.to_owned(),
        resource: None,
        size: None,
        network: None,
        args: Value::Null,
        element: None,
    });
    let mut e = typed_event(
        EventData::ApprovalRequested(ApprovalRequested {
            approval_id: held.approval_id.clone(),
            rule: held.rule.clone(),
            risk: held.risk.clone(),
            expires_at: stamp(held.expires_ms),
            summary,
            policy_hash: deciding.policy.hash().to_owned(),
            manifest_hash: deciding.runner.manifest_hash.clone(),
        }),
        deciding.run,
        deciding.now,
    );
    e.op_id = Some(deciding.op.to_owned());
    e
}
