//! Capacity, quotas and drains: what hosts and runners have and hold, what
//! each org may use, and telling a runner to claim nothing new.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use moat_api::org::{Capacity, Drained, HostCapacity, OrgLoad, QuotaView, RunnerCapacity};
use moat_core::EventData;
use moat_core::event_data::{RefusalReason, RequestRefused};
use moat_core::quota::{OverQuota, Quota};
use moat_store::{RunnerRow, stamp, typed_event};

use super::AppState;
use super::auth;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};

/// Whose view a request gets: the deployment's admin sees every org; an
/// org's admin, its own.
pub enum Scope {
    All,
    Org(String),
}

impl FromRequestParts<Arc<AppState>> for Scope {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> ApiResult<Scope> {
        if auth::admin(state, &parts.headers).is_ok() {
            return Ok(Scope::All);
        }
        auth::org_admin(state, &parts.headers).await.map(Scope::Org)
    }
}

impl Scope {
    fn sees(&self, org: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Org(mine) => mine == org,
        }
    }
}

/// The org named (or with id) `name`, as `(id, name)`, if `scope` sees it:
/// an org's admin asking of another org learns nothing of it.
async fn org_in_scope(
    state: &Arc<AppState>,
    scope: &Scope,
    name: String,
) -> ApiResult<(String, String)> {
    let shown = name.clone();
    let found = state
        .db(move |s| {
            let Some(id) = s.org_id(&name)? else {
                return Ok(None);
            };
            Ok(s.org_name(&id)?.map(|n| (id, n)))
        })
        .await?;
    match found {
        Some((id, name)) if scope.sees(&id) => Ok((id, name)),
        _ => Err(ApiError::not_found(format!("org {shown}"))),
    }
}

async fn quota_view(state: &Arc<AppState>, id: String, name: String) -> ApiResult<QuotaView> {
    let now = state.now();
    let (quota, used) = state.db(move |s| s.quota(&id, now)).await?;
    let exceeded = quota
        .as_ref()
        .and_then(|q| q.exceeded(&used))
        .map(|e| e.to_string());
    Ok(QuotaView {
        org: name,
        quota,
        used,
        exceeded,
    })
}

pub async fn get_quota(
    State(state): State<Arc<AppState>>,
    scope: Scope,
    Path(org): Path<String>,
) -> ApiResult<Json<QuotaView>> {
    let (id, name) = org_in_scope(&state, &scope, org).await?;
    Ok(Json(quota_view(&state, id, name).await?))
}

/// Sets an org's quotas (the deployment's admin only: an org must not
/// raise its own). `{}` removes them.
pub async fn put_quota(
    State(state): State<Arc<AppState>>,
    _: auth::Admin,
    Path(org): Path<String>,
    JsonObject(quota): JsonObject<Quota>,
) -> ApiResult<Json<QuotaView>> {
    let (id, name) = org_in_scope(&state, &Scope::All, org).await?;
    let (i, now) = (id.clone(), state.now());
    state.db(move |s| s.set_quota(&i, &quota, now)).await?;
    // A raised quota may let waiting runs go.
    state.notify();
    Ok(Json(quota_view(&state, id, name).await?))
}

/// Refuses a new run of an org over a quota set to refuse (recorded as
/// `request.refused`, reason `quota_exceeded`); over a quota set to wait,
/// the run is created and waits. `reached`: the org's quota state, as
/// `Store::quota_reached` read it at `now`.
pub async fn refuse_if_over(
    state: &Arc<AppState>,
    org: &str,
    reached: Option<(moat_core::quota::Exceeded, OverQuota)>,
    now: i64,
) -> ApiResult<()> {
    let Some((exceeded, OverQuota::Refuse)) = reached else {
        return Ok(());
    };
    let message = format!("{exceeded}: the org's quota refuses new runs until it is under it");
    let data = EventData::RequestRefused(RequestRefused {
        reason: RefusalReason::QuotaExceeded,
        message: message.clone(),
        path: "/v1/runs".into(),
        method: None,
        by: None,
        origin: None,
        referer: None,
        secret: None,
        field: None,
    });
    let o = org.to_owned();
    state
        .db(move |s| s.append_events(&o, &[typed_event(data, "", now)]))
        .await?;
    Err(ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "quota_exceeded",
        message,
    ))
}

/// Tells a runner to drain: it claims nothing new, finishes the runs it
/// holds, then stops.
pub async fn drain(
    State(state): State<Arc<AppState>>,
    scope: Scope,
    Path(runner): Path<String>,
) -> ApiResult<Json<Drained>> {
    let id = runner.clone();
    let found = state
        .db(move |s| s.runner(&id))
        .await?
        .filter(|w| scope.sees(&w.org_id))
        .ok_or_else(|| ApiError::not_found(format!("runner {runner}")))?;
    let (org, id) = (found.org_id.clone(), found.id.clone());
    state.db(move |s| s.drain_runner(&org, &id)).await?;
    // Its waiting claim, if any, answers now.
    state.notify();
    Ok(Json(Drained {
        runner_id: found.id,
        draining: true,
        runs_held: found.slots_used,
    }))
}

fn runner_capacity(w: &RunnerRow, org: &str) -> RunnerCapacity {
    let host: Option<moat_core::host::HostFeatures> = w
        .host_features
        .as_deref()
        .and_then(|h| serde_json::from_str(h).ok());
    RunnerCapacity {
        id: w.id.clone(),
        org: org.to_owned(),
        environment: w.environment.clone(),
        version: w.version.clone(),
        kernel: host.map(|h| h.kernel),
        last_seen_at: stamp(w.seen_ms),
        slots: w.slots,
        slots_used: w.slots_used,
        cpu_millis: w.cpu_millis,
        cpu_reserved: w.cpu_reserved,
        memory_bytes: w.memory_bytes,
        memory_reserved: w.memory_reserved,
        workload_classes: moat_core::WorkloadClass::from_mask(w.classes),
        labels: w
            .labels
            .as_deref()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_default(),
        draining: w.draining,
    }
}

/// The host a runner counts under: its id, or `unnamed` for all runners
/// that named none (placement counts them as one host too).
fn host_of(w: &RunnerRow) -> String {
    w.host_id.clone().unwrap_or_else(|| "unnamed".to_owned())
}

/// What every host has and holds, as `scope` may see it.
pub async fn capacity_of(state: &Arc<AppState>, scope: &Scope) -> ApiResult<Capacity> {
    let now = state.now();
    let only = match scope {
        Scope::All => None,
        Scope::Org(org) => Some(org.clone()),
    };
    let (runners, held, orgs, quotas) = state
        .db(move |s| {
            let orgs = s.orgs()?;
            let mut quotas = BTreeMap::new();
            for (id, _) in &orgs {
                if only.as_ref().is_some_and(|o| o != id) {
                    continue;
                }
                if let (Some(q), _) = s.quota(id, now)? {
                    quotas.insert(id.clone(), q);
                }
            }
            Ok((s.all_runners()?, s.held_runs()?, orgs, quotas))
        })
        .await?;
    let names: BTreeMap<String, String> = orgs.into_iter().collect();
    let name_of = |id: &str| names.get(id).cloned().unwrap_or_else(|| id.to_owned());
    let runner_host: BTreeMap<&str, String> = runners
        .iter()
        .map(|w| (w.id.as_str(), host_of(w)))
        .collect();
    // Orgs present on each host, and runs held per org.
    let mut present: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut held_by: BTreeMap<String, u64> = BTreeMap::new();
    for (runner, org) in &held {
        if let Some(host) = runner_host.get(runner.as_str()) {
            present.entry(host.clone()).or_default().insert(org.clone());
        }
        *held_by.entry(org.clone()).or_default() += 1;
    }
    let mut hosts: BTreeMap<String, HostCapacity> = BTreeMap::new();
    for w in runners.iter().filter(|w| scope.sees(&w.org_id)) {
        let host = host_of(w);
        let entry = hosts.entry(host.clone()).or_insert_with(|| {
            let orgs = present.get(&host).cloned().unwrap_or_default();
            let (tenants, other_tenants) = match scope {
                Scope::All => (orgs.iter().map(|o| name_of(o)).collect(), None),
                Scope::Org(mine) => (
                    orgs.iter()
                        .filter(|o| *o == mine)
                        .map(|o| name_of(o))
                        .collect(),
                    Some(orgs.iter().filter(|o| *o != mine).count()),
                ),
            };
            HostCapacity {
                host_id: host.clone(),
                slots: 0,
                slots_used: 0,
                cpu_millis: 0,
                cpu_reserved: 0,
                memory_bytes: 0,
                memory_reserved: 0,
                tenants,
                other_tenants,
                runners: Vec::new(),
            }
        });
        entry.slots = entry.slots.saturating_add(w.slots);
        entry.slots_used = entry.slots_used.saturating_add(w.slots_used);
        entry.cpu_millis = entry.cpu_millis.saturating_add(w.cpu_millis);
        entry.cpu_reserved = entry.cpu_reserved.saturating_add(w.cpu_reserved);
        entry.memory_bytes = entry.memory_bytes.saturating_add(w.memory_bytes);
        entry.memory_reserved = entry.memory_reserved.saturating_add(w.memory_reserved);
        entry.runners.push(runner_capacity(w, &name_of(&w.org_id)));
    }
    let orgs = names
        .keys()
        .filter(|id| scope.sees(id))
        .filter(|id| held_by.contains_key(*id) || quotas.contains_key(*id))
        .map(|id| OrgLoad {
            org: name_of(id),
            runs_held: held_by.get(id).copied().unwrap_or(0),
            concurrent_runs_quota: quotas.get(id).and_then(|q| q.concurrent_runs),
        })
        .collect();
    Ok(Capacity {
        hosts: hosts.into_values().collect(),
        orgs,
    })
}

pub async fn capacity(
    State(state): State<Arc<AppState>>,
    scope: Scope,
) -> ApiResult<Json<Capacity>> {
    Ok(Json(capacity_of(&state, &scope).await?))
}
