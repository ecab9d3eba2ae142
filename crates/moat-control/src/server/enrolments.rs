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

/// Every enrolment's audience starts so; the rest is its id.
const AUDIENCE_PREFIX: &str = "moat-enrolment:";

/// A token naming more audiences of ours than this is not looked at further.
const MAX_AUDIENCES: usize = 4;

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
    let id = moat_core::random::new_id("enrol_");
    let row = EnrolmentRow {
        audience: format!("{AUDIENCE_PREFIX}{id}"),
        id,
        org_id: org,
        name,
        issuer: text("issuer", &body.issuer, 1024)?,
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
/// the token said of it. The token's audience names the enrolment (the
/// control plane made it, unguessable): a token for a standing enrolment
/// that does not verify is recorded there as `runner.rejected`
/// (`enrolment_refused`, with the reason; the caller is told only that it
/// was refused); one that names none is refused without a record, as an
/// unknown bootstrap token is. Nothing is verified for a token that names no
/// enrolment, so an anonymous caller costs one lookup.
pub async fn vouch(
    state: &Arc<AppState>,
    token: &str,
    reg: &Registration,
    now: i64,
) -> ApiResult<(String, EnrolledIdentity)> {
    let claimed = enrolment::claimed(token)
        .map_err(|e| ApiError::unauthorized(format!("enrolment token: {e}")))?;
    let ours: Vec<String> = claimed
        .audiences
        .iter()
        .filter(|a| a.starts_with(AUDIENCE_PREFIX))
        .take(MAX_AUDIENCES)
        .cloned()
        .collect();
    let row = state
        .db(move |s| {
            for audience in &ours {
                if let Some(row) = s.enrolment_for_audience(audience)? {
                    return Ok(Some(row));
                }
            }
            Ok(None)
        })
        .await?
        .ok_or_else(|| {
            ApiError::unauthorized("enrolment token: its audience names no standing enrolment")
        })?;
    let trust = trust(&row)?;
    let error = match enrolment::verify(token, &trust, now) {
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
        Err(error) => error,
    };
    // The reason goes to the org's ledger, not to whoever presented it.
    let answer = auth::reject(
        state,
        &row.org_id,
        RunnerRejection::EnrolmentRefused,
        format!("enrolment {:?}: {error}", row.name),
        auth::Rejected::registration(reg),
    )
    .await;
    if answer.status != StatusCode::FORBIDDEN {
        // Not recorded (the database failed): that error, not a refusal.
        return Err(answer);
    }
    Err(ApiError::forbidden(
        RunnerRejection::EnrolmentRefused.as_str(),
        "the enrolment token was refused; the org's events say why",
    ))
}
