//! Runner enrolments: an org enrols an identity provider once
//! (`POST /v1/runner-enrolments`), and its runners register with the
//! provider's tokens (`crate::enrolment` verifies them) at every start, on
//! every node, with nothing spent. Revoking the enrolment refuses its
//! runners from their next request and their next registration.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use moat_api::org::{NewRunnerEnrolment, RunnerEnrolment, RunnerEnrolments};
use moat_api::runner::Registration;
use moat_core::event_data::{EnrolledIdentity, RunnerRejection};
use moat_store::{EnrolmentRow, stamp};
use serde_json::Value;

use super::AppState;
use super::auth;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use crate::enrolment::{self, Jwks, Trust};

/// A JWKS larger than this is refused (a cluster publishes a few keys).
const MAX_JWKS_BYTES: usize = 64 * 1024;

fn key_ids(jwks: &str) -> Vec<String> {
    serde_json::from_str::<Value>(jwks)
        .ok()
        .and_then(|v| v.get("keys").and_then(Value::as_array).cloned())
        .unwrap_or_default()
        .iter()
        .map(|k| {
            k.get("kid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

fn view(row: &EnrolmentRow) -> RunnerEnrolment {
    RunnerEnrolment {
        id: row.id.clone(),
        name: row.name.clone(),
        issuer: row.issuer.clone(),
        audience: row.audience.clone(),
        subject: row.subject.clone(),
        key_ids: key_ids(&row.jwks),
        created_at: stamp(row.created_ms),
        revoked_at: row.revoked_ms.map(stamp),
    }
}

fn trust(row: &EnrolmentRow) -> ApiResult<Trust> {
    let jwks = serde_json::from_str::<Value>(&row.jwks)
        .ok()
        .and_then(|v| Jwks::parse(&v).ok())
        .ok_or_else(|| {
            ApiError::internal(format!("enrolment {}: stored JWKS unreadable", row.id))
        })?;
    Ok(Trust {
        issuer: row.issuer.clone(),
        audience: row.audience.clone(),
        subject: row.subject.clone(),
        jwks,
    })
}

fn text(field: &str, value: &str, max: usize) -> ApiResult<String> {
    let value = value.trim();
    if value.is_empty() || value.len() > max || value.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "{field}: 1 to {max} characters, no control characters"
        )));
    }
    Ok(value.to_owned())
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    JsonObject(body): JsonObject<NewRunnerEnrolment>,
) -> ApiResult<(StatusCode, Json<RunnerEnrolment>)> {
    let name = text("name", &body.name, 100)?;
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(ApiError::bad_request(
            "name: letters, digits, '-', '_' and '.'",
        ));
    }
    let jwks = body.jwks.to_string();
    if jwks.len() > MAX_JWKS_BYTES {
        return Err(ApiError::bad_request(format!(
            "jwks: at most {MAX_JWKS_BYTES} bytes"
        )));
    }
    Jwks::parse(&body.jwks).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let row = EnrolmentRow {
        id: moat_core::random::new_id("enrol_"),
        org_id: org,
        name,
        issuer: text("issuer", &body.issuer, 1024)?,
        audience: text("audience", &body.audience, 256)?,
        subject: text("subject", &body.subject, 1024)?,
        jwks,
        created_ms: state.now(),
        revoked_ms: None,
    };
    let stored = row.clone();
    state.db(move |s| s.add_enrolment(&stored)).await?;
    Ok((StatusCode::CREATED, Json(view(&row))))
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
) -> ApiResult<Json<RunnerEnrolments>> {
    let rows = state.db(move |s| s.enrolments(&org)).await?;
    Ok(Json(RunnerEnrolments {
        runner_enrolments: rows.iter().map(view).collect(),
    }))
}

pub async fn revoke(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    Path(id): Path<String>,
) -> ApiResult<Json<RunnerEnrolment>> {
    let now = state.now();
    let lookup = id.clone();
    let row = state
        .db(move |s| s.revoke_enrolment(&org, &lookup, now))
        .await?
        .ok_or_else(|| ApiError::not_found(format_args!("runner enrolment {id}")))?;
    // Waiting runner requests return and meet the revocation at once.
    state.notify();
    Ok(Json(view(&row)))
}

/// The org a registration's enrolment token admits the runner to, and what
/// the token said of it. A token that names an enrolled issuer and was
/// meant for an enrolment (its audience and subject) but does not verify is
/// recorded there as `runner.rejected` (`enrolment_refused`); one that
/// names no enrolment is refused without a record, as an unknown bootstrap
/// token is.
pub async fn vouch(
    state: &Arc<AppState>,
    token: &str,
    reg: &Registration,
    now: i64,
) -> ApiResult<(String, EnrolledIdentity)> {
    let claimed = enrolment::claimed(token)
        .map_err(|e| ApiError::unauthorized(format!("enrolment token: {e}")))?;
    let issuer = claimed.issuer.clone();
    let rows = state.db(move |s| s.enrolments_for_issuer(&issuer)).await?;
    let mut refusals = Vec::new();
    for row in &rows {
        let trust = trust(row)?;
        match enrolment::verify(token, &trust, now) {
            Ok(verified) => {
                return Ok((
                    row.org_id.clone(),
                    EnrolledIdentity {
                        enrolment_id: row.id.clone(),
                        subject: verified.subject,
                        token_expires_at: stamp(verified.expires_ms),
                        token_id: verified.token_id,
                        namespace: verified.namespace,
                        pod: verified.pod,
                        pod_uid: verified.pod_uid,
                        node: verified.node,
                    },
                ));
            }
            Err(e) if claimed.aimed_at(&trust) => refusals.push((row, e)),
            Err(_) => {}
        }
    }
    let Some((row, error)) = refusals.into_iter().next() else {
        return Err(ApiError::unauthorized(format!(
            "enrolment token: no standing enrolment for issuer {:?}, audience {:?} and subject {:?}",
            claimed.issuer, claimed.audiences, claimed.subject
        )));
    };
    let who = auth::Rejected::registration(reg);
    Err(auth::reject(
        state,
        &row.org_id,
        RunnerRejection::EnrolmentRefused,
        format!("enrolment {:?}: {error}", row.name),
        who,
    )
    .await)
}
