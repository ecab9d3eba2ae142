//! What a run was allowed and what it did, answered from its ledger events
//! alone: the sandbox it ran in and what each layer enforced, the
//! permission envelope (manifest, policy, sandbox mode, the rules that
//! granted), the filesystem roots, the network, and every time it went
//! beyond its default boundary.

use std::collections::BTreeSet;

use moat_core::EventType;
use moat_ledger::StoredEvent;
use serde::Serialize;
use serde_json::{Value, json};

/// The answers, as `moat audit --json` prints them.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Audit {
    pub run_id: String,
    /// `succeeded`, `failed`, `dead_lettered`, or the last state seen.
    pub outcome: String,
    pub events: usize,
    pub runners: BTreeSet<String>,
    pub runner_hashes: BTreeSet<String>,
    /// Manifests the run ran under (more than one: refreshed mid-run).
    pub manifest_hashes: BTreeSet<String>,
    pub policy_hashes: BTreeSet<String>,
    /// Sandbox modes operations ran in (`read-only`, `workspace-write`...).
    pub sandbox_modes: BTreeSet<String>,
    /// The workload classes its programs ran under (`sandboxClass`, all of
    /// them in one line) and, per layer, what the launcher last reported.
    pub sandbox_class: String,
    pub classes: BTreeSet<String>,
    pub enforcement: Value,
    /// Filesystem roots mounted into the sandboxes (`/workspace (ro)`...).
    pub roots: BTreeSet<String>,
    pub root_views: BTreeSet<String>,
    /// Network modes programs ran with, and the egress it used.
    pub network_modes: BTreeSet<String>,
    pub network_requests: usize,
    pub network_denied: usize,
    /// Connections the runtime made to ports programs exposed
    /// (`ingress-only`).
    pub network_ingress: usize,
    /// Policy rules that granted its operations.
    pub granted_by: BTreeSet<String>,
    /// Operations the agent asked for (by id).
    pub operations: BTreeSet<String>,
    pub denied: Vec<Value>,
    /// Beyond the default boundary.
    pub approvals: Vec<Value>,
    pub danger: Vec<Value>,
    pub manifest_refreshed: bool,
    pub beyond_default_boundary: bool,
    /// What the run used (`run.usage`, recorded when it ended; null before).
    pub usage: Value,
    /// The teardowns on runner hosts (`run.destroyed`): runner and outcome.
    pub teardowns: Vec<Value>,
    /// What the sandbox's layers refused, per operation and in all:
    /// `{opId, layer, access, object, count, message}` from each report.
    pub violations: Vec<Value>,
    /// Why a launcher could not observe every layer's refusals (the
    /// evidence layer not enforced), once per reason: `{detail, opIds}`.
    pub evidence_gaps: Vec<Value>,
    /// Files programs wrote that the export boundary promoted:
    /// `{opId, path, sha256, size, exportedAs}`.
    pub promoted: Vec<Value>,
    /// And those it rejected: `{opId, path, sha256, size, reasons}`.
    pub rejected: Vec<Value>,
    /// Those still waiting for the approval the policy asked for:
    /// `{opId, path, sha256, size, exportedAs, approvalId}`.
    pub awaiting_approval: Vec<Value>,
    /// What persisted: each attached volume, `{volume, path, readOnly,
    /// startSnapshot, endSnapshot, files, bytes, snapshots}` (the snapshot
    /// it started from and the last one the run recorded, by hash; its
    /// files and bytes as of that last one).
    pub persisted: Vec<Value>,
    /// Each take-over by another runner (`run.resumed`): `{attempt,
    /// runnerId, volumes}`.
    pub resumed: Vec<Value>,
}

/// The refusals one report lists; a report from before `violations` has
/// its seccomp refusals in `deniedSyscalls`.
fn collect_violations(a: &mut Audit, op: Option<&str>, report: &Value) {
    let listed: Vec<moat_core::Violation> = match report.get("violations") {
        Some(v) => serde_json::from_value(v.clone()).unwrap_or_default(),
        None => report["deniedSyscalls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| {
                Some(moat_core::Violation {
                    layer: "seccomp".into(),
                    access: "syscall".into(),
                    object: Some(text(&d["syscall"])?),
                    count: d["count"].as_u64().unwrap_or(1),
                })
            })
            .collect(),
    };
    for v in listed {
        a.violations.push(json!({
            "opId": op, "layer": v.layer, "access": v.access, "object": v.object,
            "count": v.count, "message": v.describe(),
        }));
    }
    let evidence = &report["enforcement"]["evidence"];
    if evidence.is_object() && evidence["status"] != "enforced" {
        let detail = evidence["detail"].clone();
        match a.evidence_gaps.iter_mut().find(|g| g["detail"] == detail) {
            Some(gap) => {
                if let Some(ops) = gap["opIds"].as_array_mut() {
                    ops.push(json!(op));
                }
            }
            None => a
                .evidence_gaps
                .push(json!({"detail": detail, "opIds": [op]})),
        }
    }
}

/// A held file's approval was settled: it is no longer awaited.
fn settled(awaiting: &mut Vec<Value>, d: &Value) {
    awaiting.retain(|w| !(w["path"] == d["path"] && w["sha256"] == d["sha256"]));
}

/// One line for the class a `sandbox.exec.finished` report names.
fn describe_class(report: &Value) -> String {
    match report["class"].as_str() {
        Some("microvm") => {
            let vm = &report["vm"];
            let accelerator = vm["accelerator"].as_str().unwrap_or("unknown");
            let degraded = text(&vm["degraded"])
                .map(|why| format!(", degraded: {why}"))
                .unwrap_or_default();
            format!(
                "microvm: a QEMU microvm guest of its own (accelerator {accelerator}{degraded}), \
                 its emulator jailed in moat-sandbox"
            )
        }
        _ => "namespace: moat-sandbox: Linux namespaces, pivot_root, Landlock, seccomp, \
              cgroups, rlimits"
            .into(),
    }
}

fn text(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

pub fn audit(run_id: &str, events: &[StoredEvent]) -> Audit {
    let mut a = Audit {
        run_id: run_id.to_owned(),
        events: events.len(),
        sandbox_class: "none (no program ran)".into(),
        enforcement: Value::Null,
        ..Audit::default()
    };
    // Manifests the runner reported working under: more than one is a
    // refresh mid-run (decisions before the claim name the environment's
    // current manifest, which says nothing about the runner).
    let mut runner_manifests = BTreeSet::new();
    for stored in events {
        let e = &stored.event;
        let d = &e.data;
        if let Some(h) = text(&d["manifestHash"]) {
            if d["runnerId"].is_string() {
                runner_manifests.insert(h.clone());
            }
            a.manifest_hashes.insert(h);
        }
        if let Some(h) = text(&d["policyHash"]) {
            a.policy_hashes.insert(h);
        }
        if let Some(r) = text(&d["runnerId"]) {
            a.runners.insert(r);
        }
        if let Some(h) = text(&d["runnerHash"]) {
            a.runner_hashes.insert(h);
        }
        match e.event_type {
            EventType::RunCreated => {
                a.outcome = "queued".into();
                for v in d["volumes"].as_array().into_iter().flatten() {
                    a.persisted.push(json!({
                        "volume": v["volume"], "path": v["path"], "readOnly": v["readOnly"],
                        "startSnapshot": v["snapshot"], "endSnapshot": v["snapshot"],
                        "files": null, "bytes": null, "snapshots": 0,
                    }));
                }
            }
            EventType::VolumeSnapshotted => {
                if let Some(p) = a.persisted.iter_mut().find(|p| p["volume"] == d["volume"]) {
                    p["endSnapshot"] = d["snapshot"].clone();
                    p["files"] = d["files"].clone();
                    p["bytes"] = d["bytes"].clone();
                    p["snapshots"] = json!(p["snapshots"].as_u64().unwrap_or(0) + 1);
                }
            }
            EventType::RunResumed => a.resumed.push(json!({
                "attempt": d["attempt"], "runnerId": d["runnerId"], "volumes": d["volumes"],
            })),
            EventType::RunClaimed => a.outcome = "running".into(),
            EventType::RunFinished => {
                a.outcome = text(&d["state"]).unwrap_or_else(|| "finished".into());
            }
            EventType::RunDeadLettered => a.outcome = "dead_lettered".into(),
            EventType::CapabilityRequested => {
                if let Some(op) = &e.op_id {
                    a.operations.insert(op.clone());
                }
            }
            EventType::CapabilityGranted => {
                if let Some(s) = text(&d["sandbox"]) {
                    a.sandbox_modes.insert(s);
                }
                for p in d["policies"].as_array().into_iter().flatten() {
                    if let Some(p) = text(p) {
                        a.granted_by.insert(p);
                    }
                }
            }
            EventType::CapabilityDenied => a.denied.push(json!({
                "opId": e.op_id, "reason": d["reason"], "message": d["message"],
            })),
            EventType::ApprovalGranted => a.approvals.push(json!({
                "opId": e.op_id, "rule": d["rule"], "risk": d["risk"], "by": d["by"],
                "via": d["via"], "reason": d["reason"], "at": e.at,
            })),
            EventType::SandboxExecStarted => {
                if let Some(m) = text(&d["mode"]) {
                    if m == "danger-full-access" {
                        a.danger
                            .push(json!({"opId": e.op_id, "what": "danger-full-access"}));
                    }
                    a.sandbox_modes.insert(m);
                }
                if let Some(n) = text(&d["network"]) {
                    if n == "full" {
                        a.danger
                            .push(json!({"opId": e.op_id, "what": "network full"}));
                    }
                    a.network_modes.insert(n);
                }
                if let Some(v) = text(&d["rootView"]) {
                    a.root_views.insert(v);
                }
                for root in d["roots"].as_array().into_iter().flatten() {
                    if let Some(inside) = text(&root["inside"]) {
                        let rw = if root["writable"] == true { "rw" } else { "ro" };
                        a.roots.insert(format!("{inside} ({rw})"));
                    }
                }
            }
            EventType::SandboxExecFinished => {
                // Each class the run's programs ran under, as their reports
                // say (a report without one is the namespace class's).
                a.classes.insert(describe_class(d));
                a.sandbox_class = a.classes.iter().cloned().collect::<Vec<_>>().join("; ");
                a.enforcement = d["enforcement"].clone();
                collect_violations(&mut a, e.op_id.as_deref(), d);
                // Old reports have no launchPolicy; "not recorded" is no override.
                let policy = &d["enforcement"]["launchPolicy"];
                if policy["status"] == "not_enforced"
                    && text(&policy["detail"]).is_some_and(|t| t.starts_with("overridden"))
                {
                    a.danger.push(json!({
                        "opId": e.op_id, "what": "launch policy overridden",
                    }));
                }
            }
            EventType::RunUsage => a.usage = d.clone(),
            EventType::RunDestroyed => a.teardowns.push(json!({
                "runnerId": d["runnerId"], "ok": d["ok"], "checks": d["checks"],
            })),
            EventType::ArtifactValidated => a.awaiting_approval.push(json!({
                "opId": e.op_id, "path": d["path"], "sha256": d["sha256"],
                "size": d["size"], "exportedAs": d["exportedAs"], "approvalId": d["approvalId"],
            })),
            EventType::ArtifactPromoted => {
                settled(&mut a.awaiting_approval, d);
                a.promoted.push(json!({
                    "opId": e.op_id, "path": d["path"], "sha256": d["sha256"],
                    "size": d["size"], "exportedAs": d["exportedAs"],
                    "approvalId": d["approvalId"],
                }));
            }
            EventType::ArtifactRejected => {
                settled(&mut a.awaiting_approval, d);
                a.rejected.push(json!({
                    "opId": e.op_id, "path": d["path"], "sha256": d["sha256"],
                    "size": d["size"], "reasons": d["reasons"],
                }));
            }
            EventType::NetworkRequest => a.network_requests += 1,
            EventType::NetworkDenied => a.network_denied += 1,
            EventType::NetworkIngress => a.network_ingress += 1,
            _ => {}
        }
    }
    a.manifest_refreshed = runner_manifests.len() > 1;
    a.beyond_default_boundary =
        !a.approvals.is_empty() || !a.danger.is_empty() || a.manifest_refreshed;
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use moat_core::Event;

    fn finished(data: Value) -> StoredEvent {
        StoredEvent {
            seq: 1,
            prev_hash: String::new(),
            hash: String::new(),
            event: Event {
                event_type: EventType::SandboxExecFinished,
                at: "2026-12-03T00:00:00Z".into(),
                run_id: "run-1".into(),
                op_id: Some("op-1".into()),
                correlation_id: None,
                data,
            },
        }
    }

    #[test]
    fn the_class_each_program_ran_under_is_told_with_its_accelerator() {
        let events = [
            finished(json!({"enforcement": {}})),
            finished(json!({"class": "microvm", "enforcement": {},
                "vm": {"accelerator": "tcg", "degraded": "/dev/kvm: Permission denied"}})),
        ];
        let a = audit("run-1", &events);
        assert_eq!(a.classes.len(), 2, "{:?}", a.classes);
        assert!(
            a.sandbox_class.contains("namespace: moat-sandbox"),
            "{}",
            a.sandbox_class
        );
        assert!(
            a.sandbox_class.contains(
                "microvm: a QEMU microvm guest of its own (accelerator tcg, degraded: \
                 /dev/kvm: Permission denied)"
            ),
            "{}",
            a.sandbox_class
        );
        assert_eq!(audit("run-1", &[]).sandbox_class, "none (no program ran)");
    }
}
