//! Stored rows as the API shows them (`moat_api` types where the protocol
//! has them), shared by the handler files so none imports another.

use base64::Engine as _;
use moat_api::org::{ArtifactView, OpView};
use moat_api::{ManifestView, RunInput, RunView};
use moat_store::{ArtifactRow, ManifestRow, OpRow, RunRow, RunnerPresence, stamp};

use super::error::{ApiError, ApiResult};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A run's recorded inputs (path, sha256, size).
pub fn run_inputs(r: &RunRow) -> ApiResult<Vec<RunInput>> {
    serde_json::from_value(r.inputs.clone())
        .map_err(|e| ApiError::internal(format!("run {}: stored inputs: {e}", r.id)))
}

pub fn run_view(r: &RunRow) -> ApiResult<RunView> {
    Ok(RunView {
        id: r.id.clone(),
        state: r.state.as_str().to_owned(),
        environment: r.environment.clone(),
        runner_id: r.runner_id.clone(),
        manifest_hash: r.manifest_hash.clone(),
        attempts: r.attempts,
        max_attempts: r.max_attempts,
        finish_requested: r.finish_wanted,
        inputs: run_inputs(r)?,
        error: r.error.clone(),
        created_at: stamp(r.created_ms),
        updated_at: stamp(r.updated_ms),
        lease_until: (r.lease_until_ms > 0).then(|| stamp(r.lease_until_ms)),
        workload_classes: moat_core::WorkloadClass::from_mask(r.needs_classes),
        waiting: None,
        volumes: r
            .volumes
            .iter()
            .map(|v| moat_api::views::AttachedVolume {
                volume: v.volume.clone(),
                path: v.path.clone(),
                read_only: v.read_only,
                start_snapshot: v.start_snapshot.clone(),
                snapshot: v.snapshot.clone(),
            })
            .collect(),
    })
}

/// Runners seen this recently count as able to claim (a serving runner asks
/// for work at least every `MAX_WAIT`).
const RUNNER_ALIVE_MS: i64 = 120_000;

/// Why a queued run is not claimed, when something stands in its way: the
/// org over a quota (`quota`, as [`moat_core::quota::Exceeded`] shows it),
/// no live runner of its environment, none that offers every class it
/// needs, every such runner draining, or the placement policy refusing the
/// last runner that asked.
pub fn waiting_reason(
    run: &RunRow,
    runners: &[RunnerPresence],
    quota: Option<&str>,
    now: i64,
) -> Option<String> {
    if run.state != moat_store::RunState::Queued {
        return None;
    }
    if let Some(quota) = quota {
        return Some(quota.to_owned());
    }
    let live: Vec<&RunnerPresence> = runners
        .iter()
        .filter(|w| w.environment == run.environment && now - w.seen_ms <= RUNNER_ALIVE_MS)
        .collect();
    if live.is_empty() {
        return Some(format!(
            "placement_waiting: no runner of environment {:?} has been seen in the last {} s",
            run.environment,
            RUNNER_ALIVE_MS / 1000
        ));
    }
    let able: Vec<&&RunnerPresence> = live
        .iter()
        .filter(|w| w.classes & run.needs_classes == run.needs_classes)
        .collect();
    if !able.is_empty() {
        if able.iter().all(|w| w.draining) {
            return Some(format!(
                "placement_waiting: every runner of environment {:?} that could take it is \
                 draining",
                run.environment
            ));
        }
        return run.placement_waiting();
    }
    let names =
        |mask: i64| moat_core::WorkloadClass::names(&moat_core::WorkloadClass::from_mask(mask));
    let offers: Vec<String> = live
        .iter()
        .map(|w| format!("{} offers {}", w.id, names(w.classes)))
        .collect();
    let missing = run.needs_classes & !live.iter().fold(0, |all, w| all | w.classes);
    Some(if missing != 0 {
        format!(
            "placement_waiting: needs workload class {}: no runner of environment {:?} offers \
             it ({})",
            names(missing),
            run.environment,
            offers.join("; ")
        )
    } else {
        format!(
            "placement_waiting: needs workload classes {}: no runner of environment {:?} \
             offers them all ({})",
            names(run.needs_classes),
            run.environment,
            offers.join("; ")
        )
    })
}

pub fn op_view(o: &OpRow) -> OpView {
    OpView {
        id: o.id.clone(),
        run_id: o.run_id.clone(),
        n: o.n,
        op: o.op.clone(),
        state: o.state.as_str().to_owned(),
        decision: o.decision.clone(),
        result: o.result.clone(),
        created_at: stamp(o.created_ms),
        updated_at: stamp(o.updated_ms),
        approval: None,
    }
}

pub fn artifact_view(a: &ArtifactRow) -> ArtifactView {
    ArtifactView {
        run_id: a.run_id.clone(),
        op_id: a.op_id.clone(),
        sha256: a.sha256.clone(),
        size: a.size,
        kind: a.kind.clone(),
        label: a.label.clone(),
        created_at: stamp(a.created_ms),
    }
}

pub fn manifest_view(row: &ManifestRow) -> ApiResult<ManifestView> {
    Ok(ManifestView {
        manifest_hash: row.hash.clone(),
        environment: row.environment.clone(),
        expires_at: stamp(row.expires_ms),
        published_at: stamp(row.published_ms),
        revoked: row.revoked,
        signed: serde_json::from_str(&row.signed)
            .map_err(|e| ApiError::internal(format!("stored manifest {}: {e}", row.hash)))?,
    })
}

/// The run's inputs with their bytes (what a runner gets with its claim).
pub fn inputs_with_content(
    run: &RunRow,
    load: impl Fn(&str) -> Option<Vec<u8>>,
) -> ApiResult<Vec<RunInput>> {
    let mut inputs = run_inputs(run)?;
    for input in &mut inputs {
        input.content_base64 = load(&input.sha256).map(|bytes| B64.encode(bytes));
    }
    Ok(inputs)
}
