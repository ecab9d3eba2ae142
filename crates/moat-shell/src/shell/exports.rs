//! The export boundary inside the shell: what an `exec_argv` wrote under
//! the writable roots is judged against the manifest's `exports` by the
//! sandboxed verifier. A file that passes becomes an artifact
//! (`artifact.created`, `artifact.promoted`); one that fails stays behind in
//! the workspace, quarantined, never an artifact (`artifact.rejected`, one
//! reason per broken rule). The shell holds no org secrets: its scan looks
//! for credential shapes only.

use std::path::PathBuf;
use std::time::Duration;

use moat_core::EventData;
use moat_core::event_data::{ArtifactPromoted, ArtifactRejected};
use moat_core::exports::{ExportRules, RejectRule, Rejection};
use moat_core::op::ArtifactRef;
use moat_export::Verdict;
use serde_json::{Value, json};

use super::{Op, Shell};
use crate::collect::Snapshot;
use crate::verifier::{self, VerifierRun};

/// Most `artifact.rejected` events one op records (the result lists
/// every rejection).
pub const MAX_REJECTION_EVENTS: usize = 256;

/// How the program's own sandbox was degraded, for the verifier's.
#[derive(Clone, Copy)]
pub(super) struct Degrade {
    pub allow_degraded: bool,
    pub without_cgroup: bool,
}

impl Shell {
    /// Where export candidates come from: the writable roots a program
    /// writes (not the artifact-only ones).
    pub(super) fn export_roots(&self) -> Vec<PathBuf> {
        let (_, write) = self.workspace.roots();
        let filesystem = &self.config.manifest.filesystem;
        write
            .into_iter()
            .filter(|r| !filesystem.is_artifact_only(r))
            .collect()
    }

    /// Judges what changed since `before`; returns the op result's
    /// `exports` and adds promoted files to `artifacts`.
    pub(super) fn collect_exports(
        &mut self,
        op: &mut Op,
        rules: &ExportRules,
        before: &Snapshot,
        degrade: Degrade,
        artifacts: &mut Vec<ArtifactRef>,
    ) -> Value {
        let roots = self.export_roots();
        let after = Snapshot::take(&self.workspace.path, &roots);
        let changed = before.changes(&after, &roots);
        // Past the snapshot's bounds, a written file may go unseen: it is
        // not judged, and not exported either. The result says so.
        let incomplete = before.incomplete || after.incomplete;
        if changed.is_empty() {
            return json!({"promoted": [], "rejected": [], "incomplete": incomplete});
        }
        let host = match moat_export::Verifier::new(rules, &[]) {
            Ok(host) => host,
            Err(e) => return json!({"promoted": [], "rejected": [], "error": e.to_string()}),
        };
        let limits = &self.config.manifest.limits;
        let judged = std::env::current_exe()
            .map_err(|e| e.to_string())
            .and_then(|exe| {
                verifier::verify(VerifierRun {
                    exe: &exe,
                    rules,
                    from: &self.workspace.path,
                    only: Some(changed.clone()),
                    secrets: Vec::new(),
                    memory_bytes: limits.memory_bytes,
                    timeout: Duration::from_millis(limits.timeout_ms),
                    allow_degraded: degrade.allow_degraded,
                    without_cgroup: degrade.without_cgroup,
                    id_range: self.config.id_range,
                    launch_policy: self.config.launch_policy.clone(),
                    read_as_owner: true,
                })
                .map_err(|e| e.to_string())
            });
        let report = match judged {
            Ok(report) => report,
            Err(why) => {
                // Closed: nothing of this op's writes leaves.
                let mut rejected = Vec::new();
                for path in changed {
                    let reasons = vec![Rejection {
                        rule: RejectRule::VerifierFailed,
                        detail: why.clone(),
                    }];
                    rejected.push(json!({"path": path, "reasons": reasons}));
                    op.event(EventData::ArtifactRejected(rejection(
                        path, 0, None, reasons,
                    )));
                }
                return json!({"promoted": [], "rejected": rejected, "error": why,
                    "incomplete": incomplete});
            }
        };
        let mut promoted = Vec::new();
        let mut rejected = Vec::new();
        for file in report.files {
            let mut reasons = file.reasons;
            if let (Verdict::Promoted, Some(sha256), Some(ty)) =
                (file.verdict, &file.sha256, file.exported_as)
            {
                // Read again as it was judged, checked again by the host
                // (the verifier's sandbox may have been subverted).
                let stored =
                    moat_export::read_verified(&self.workspace.path, &file.path, sha256, file.size)
                        .map_err(|e| e.to_string())
                        .and_then(|bytes| {
                            host.recheck(&file.path, &bytes, ty)?;
                            self.artifact(op, "export", &file.path, &bytes)
                        });
                match stored {
                    Ok(reference) => {
                        op.event(EventData::ArtifactPromoted(ArtifactPromoted {
                            path: file.path.clone(),
                            sha256: reference.sha256.clone(),
                            size: reference.size,
                            exported_as: ty,
                            approval_id: None,
                            runner_id: None,
                            runner_hash: None,
                            manifest_hash: None,
                        }));
                        promoted.push(json!({
                            "path": file.path, "sha256": reference.sha256, "type": ty,
                        }));
                        artifacts.push(reference);
                        continue;
                    }
                    Err(e) => reasons.push(Rejection {
                        rule: RejectRule::Unreadable,
                        detail: e,
                    }),
                }
            }
            rejected.push(json!({"path": file.path, "reasons": reasons}));
            // Past a bound, rejections are listed in the result only: a
            // program that writes thousands of files must not make the
            // op's report too large to record, its evidence with it.
            if rejected.len() <= MAX_REJECTION_EVENTS {
                op.event(EventData::ArtifactRejected(rejection(
                    file.path,
                    file.size,
                    file.sha256,
                    reasons,
                )));
            }
        }
        let unrecorded = rejected.len().saturating_sub(MAX_REJECTION_EVENTS);
        json!({"promoted": promoted, "rejected": rejected, "incomplete": incomplete,
               "rejectionsWithoutEvent": unrecorded})
    }
}

fn rejection(
    path: String,
    size: u64,
    sha256: Option<String>,
    reasons: Vec<Rejection>,
) -> ArtifactRejected {
    ArtifactRejected {
        path,
        size,
        sha256,
        reasons,
        runner_id: None,
        runner_hash: None,
        manifest_hash: None,
    }
}
