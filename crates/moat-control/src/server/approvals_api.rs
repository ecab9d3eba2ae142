//! Approval requests: listed by anyone of the org, approved or denied by
//! its admin only (an agent must not approve its own operations), expired
//! by the sweep. Approving queues the operation: the runner waiting on the
//! run is woken at once and gets it with a fresh capability.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use moat_api::org::{ApprovalList, ApprovalView, Resolution};
use moat_store::{ApprovalRow, ApprovalState, stamp};
use serde::Deserialize;

use super::AppState;
use super::approvals::resolve;
use super::auth;
use super::error::{ApiError, ApiResult};

pub fn approval_view(a: &ApprovalRow) -> ApprovalView {
    ApprovalView {
        id: a.id.clone(),
        run_id: a.run_id.clone(),
        op_id: a.op_id.clone(),
        state: a.state.as_str().to_owned(),
        rule: a.rule.clone(),
        risk: a.risk.clone(),
        summary: a.summary.clone(),
        requested_at: stamp(a.requested_ms),
        expires_at: stamp(a.expires_ms),
        resolved_at: a.resolved_ms.map(stamp),
        resolved_by: a.resolved_by.clone(),
        reason: a.reason.clone(),
    }
}

#[derive(Deserialize)]
pub struct ListQuery {
    state: Option<String>,
    limit: Option<i64>,
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<ApprovalList>> {
    let filter = match q.state.as_deref() {
        None | Some("all") => None,
        Some(text) => Some(ApprovalState::parse(text).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown approval state {text:?} (pending, approved, denied, expired, all)"
            ))
        })?),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = state.db(move |s| s.approvals(&org, filter, limit)).await?;
    Ok(Json(ApprovalList {
        approvals: rows.iter().map(approval_view).collect(),
    }))
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(id): Path<String>,
) -> ApiResult<Json<ApprovalView>> {
    let lookup = id.clone();
    let row = state
        .db(move |s| s.approval(&org, &lookup))
        .await?
        .ok_or_else(|| ApiError::not_found(format_args!("approval {id}")))?;
    Ok(Json(approval_view(&row)))
}

pub async fn approve(
    State(state): State<Arc<AppState>>,
    operator: auth::Operator,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<ApprovalView>> {
    by_api(&state, &operator, &id, body, true).await
}

pub async fn deny(
    State(state): State<Arc<AppState>>,
    operator: auth::Operator,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<ApprovalView>> {
    by_api(&state, &operator, &id, body, false).await
}

async fn by_api(
    state: &Arc<AppState>,
    operator: &auth::Operator,
    id: &str,
    body: Bytes,
    approve: bool,
) -> ApiResult<Json<ApprovalView>> {
    let reason = super::body::parse_optional::<Resolution>(&body)?.reason;
    let row = resolve(state, operator, id, approve, reason, "api").await?;
    Ok(Json(approval_view(&row)))
}
