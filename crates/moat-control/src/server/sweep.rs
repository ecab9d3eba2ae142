//! Background upkeep, on every replica (each step is one transaction, safe
//! to run concurrently): lost leases are expired (retry or dead-letter),
//! runs nothing has happened in for the idle timeout are finished,
//! runs past their manifest's expiry plus grace are dead-lettered, spent
//! request nonces are forgotten, approval requests past their time expire
//! (their operations fail closed).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use moat_core::SignedManifest;
use moat_store::{RunState, Store, StoreError};

use super::AppState;
use moat_core::lifecycle::Stop;

const EVERY: Duration = Duration::from_millis(250);

pub async fn run(state: Arc<AppState>) {
    // Runners could not renew while no control plane was up: give them one
    // lease to come back before leases count as lost.
    let started = state.now();
    let lease = i64::try_from(state.config.lease.as_millis()).unwrap_or(i64::MAX);
    loop {
        tokio::time::sleep(EVERY).await;
        let now = state.now();
        if now < started.saturating_add(lease) {
            continue;
        }
        let st = Arc::clone(&state.config.store);
        let idle = i64::try_from(state.config.run_idle_timeout.as_millis()).unwrap_or(i64::MAX);
        match tokio::task::spawn_blocking(move || once(&st, now, idle)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(_)) => state.notify(),
            Ok(Err(e)) => eprintln!("moat serve: sweep: {e}"),
            Err(e) => eprintln!("moat serve: sweep task: {e}"),
        }
        // Queue messages whose retry is due, and deliveries whose run was
        // lost.
        super::queues_api::deliver(&state).await;
    }
}

/// One pass at time `now`; how many runs it changed. Runs idle for
/// `idle_ms` are finished (`idle_timeout`).
pub fn once(store: &Store, now: i64, idle_ms: i64) -> Result<usize, StoreError> {
    let mut changed = store.expire_leases(now)?.len();
    changed += store.finish_idle_runs(now, idle_ms)?.len();
    // Runs share few manifests: each is read and parsed once per pass.
    let mut deadlines: HashMap<(String, String), Option<i64>> = HashMap::new();
    for run in store.live_runs()? {
        let Some(hash) = run.manifest_hash.clone() else {
            continue;
        };
        let key = (run.org_id.clone(), hash);
        let deadline = match deadlines.get(&key) {
            Some(known) => *known,
            None => {
                let found = store.manifest(&key.0, &key.1)?.map(|row| {
                    let grace = serde_json::from_str::<SignedManifest>(&row.signed)
                        .map(|m| i64::try_from(m.manifest.limits.timeout_ms).unwrap_or(i64::MAX))
                        .unwrap_or(0);
                    row.expires_ms.saturating_add(grace)
                });
                *deadlines.entry(key).or_insert(found)
            }
        };
        if deadline.is_some_and(|deadline| now > deadline)
            && store.force_end_run(
                &run.org_id,
                &run.id,
                RunState::DeadLettered,
                Stop::GraceExceeded.as_str(),
                now,
            )?
        {
            changed += 1;
        }
    }
    changed += super::approvals::expire_due(store, now)?;
    store.prune_nonces(now)?;
    Ok(changed)
}
