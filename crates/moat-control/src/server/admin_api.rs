//! Orgs, bootstrap tokens, the runner-build allowlist, manifests and the
//! runner registry.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use moat_api::org::{
    IssuedToken, LedgerCheck, ManifestPublished, NewBootstrapToken, NewOrg, NewRunnerBuild,
    OrgCreated, RevokeKey, Revoked, RunnerBuild, RunnerBuilds, RunnerView, Runners,
};
use moat_core::event_data::{ManifestPublished as ManifestPublishedEvent, ManifestRevoked};
use moat_core::hash::sha256_hex;
use moat_core::{EventData, SignedManifest};
use moat_store::{ManifestRow, RunnerRow, TokenKind, stamp, typed_event};
use serde::Deserialize;

use super::AppState;
use super::auth::{self, new_token};
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use super::manifests::{check_manifest, manifest_expiry};
use super::views::manifest_view;

pub async fn create_org(
    State(state): State<Arc<AppState>>,
    _: auth::Admin,
    JsonObject(body): JsonObject<NewOrg>,
) -> ApiResult<(StatusCode, Json<OrgCreated>)> {
    let name = body.name.trim().to_owned();
    if name.is_empty()
        || name.len() > 100
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ApiError::bad_request(
            "an org name is 1 to 100 of [A-Za-z0-9_-]",
        ));
    }
    let token = new_token();
    let hash = sha256_hex(token.as_bytes());
    let now = state.now();
    let (id, name) = state
        .db(move |s| s.create_org(&name, &hash, now).map(|id| (id, name)))
        .await?;
    Ok((StatusCode::CREATED, Json(OrgCreated { id, name, token })))
}

/// A bootstrap token lives this long unless asked otherwise.
const DEFAULT_BOOTSTRAP_TTL: u64 = 600;

/// A bootstrap token lives at most this long.
const MAX_BOOTSTRAP_TTL: u64 = 3600;

pub async fn create_bootstrap_token(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    JsonObject(body): JsonObject<NewBootstrapToken>,
) -> ApiResult<(StatusCode, Json<IssuedToken>)> {
    let ttl_seconds = body.ttl_seconds.unwrap_or(DEFAULT_BOOTSTRAP_TTL);
    if ttl_seconds == 0 || ttl_seconds > MAX_BOOTSTRAP_TTL {
        return Err(ApiError::bad_request(format!(
            "ttlSeconds: 1 to {MAX_BOOTSTRAP_TTL}"
        )));
    }
    let token = new_token();
    let hash = sha256_hex(token.as_bytes());
    let expires = state.now() + i64::try_from(ttl_seconds * 1000).unwrap_or(0);
    state
        .db(move |s| s.add_token(&org, &hash, TokenKind::Bootstrap, expires))
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(IssuedToken {
            token,
            expires_at: Some(stamp(expires)),
        }),
    ))
}

/// A token for an agent of the org: runs, operations, events, artifacts.
pub async fn create_agent_token(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
) -> ApiResult<(StatusCode, Json<IssuedToken>)> {
    let token = new_token();
    let hash = sha256_hex(token.as_bytes());
    state
        .db(move |s| s.add_token(&org, &hash, TokenKind::Agent, 0))
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(IssuedToken {
            token,
            expires_at: None,
        }),
    ))
}

pub async fn list_builds(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
) -> ApiResult<Json<RunnerBuilds>> {
    let builds = state.db(move |s| s.runner_builds(&org)).await?;
    let runner_builds = builds
        .into_iter()
        .map(|(sha256, label, revoked)| RunnerBuild {
            sha256,
            label,
            revoked,
        })
        .collect();
    Ok(Json(RunnerBuilds { runner_builds }))
}

pub async fn allow_build(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    JsonObject(body): JsonObject<NewRunnerBuild>,
) -> ApiResult<(StatusCode, Json<RunnerBuild>)> {
    let now = state.now();
    let (sha, label) = (body.sha256.to_string(), body.label.clone());
    state
        .db(move |s| s.allow_runner_build(&org, &sha, &label, now))
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(RunnerBuild {
            sha256: body.sha256.into_string(),
            label: body.label,
            revoked: false,
        }),
    ))
}

pub async fn revoke_build(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    Path(sha): Path<String>,
) -> ApiResult<Json<Revoked>> {
    let lookup = sha.clone();
    if !state
        .db(move |s| s.revoke_runner_build(&org, &lookup))
        .await?
    {
        return Err(ApiError::not_found(format_args!("runner build {sha}")));
    }
    state.notify();
    Ok(Json(Revoked {
        sha256: Some(sha),
        manifest_hash: None,
        public_key: None,
        revoked: true,
    }))
}

pub async fn publish_manifest(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    JsonObject(signed): JsonObject<SignedManifest>,
) -> ApiResult<(StatusCode, Json<ManifestPublished>)> {
    check_manifest(&state, &signed).map_err(|(reason, message)| {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, reason.as_str(), message)
    })?;
    if signed.manifest.policy_hash != state.config.policy.hash() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "stale_policy",
            "the manifest names another policy than this control plane's",
        ));
    }
    let now = state.now();
    let expires = manifest_expiry(&signed)?;
    if expires <= now {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "manifest_expired",
            "the manifest has expired",
        ));
    }
    let row = ManifestRow {
        hash: signed.manifest_hash.clone(),
        environment: signed.manifest.environment.clone(),
        signed: serde_json::to_string(&signed).map_err(|e| ApiError::internal(e.to_string()))?,
        signed_by: signed.signed_by.clone(),
        expires_ms: expires,
        published_ms: now,
        revoked: false,
    };
    let data = EventData::ManifestPublished(ManifestPublishedEvent {
        manifest_hash: row.hash.clone(),
        environment: row.environment.clone(),
        expires_at: signed.manifest.expires_at.clone(),
    });
    let hash = row.hash.clone();
    state
        .db(move |s| {
            s.publish_manifest(&org, &row)?;
            s.append_events(&org, &[typed_event(data, "", now)])
        })
        .await?;
    state.notify();
    Ok((
        StatusCode::CREATED,
        Json(ManifestPublished {
            manifest_hash: hash,
        }),
    ))
}

#[derive(Deserialize)]
pub struct EnvQuery {
    environment: Option<String>,
}

pub async fn current_manifest(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    Query(q): Query<EnvQuery>,
) -> ApiResult<Json<moat_api::ManifestView>> {
    let env = q
        .environment
        .unwrap_or_else(|| state.config.environment.clone());
    let label = env.clone();
    let row = state
        .db(move |s| s.current_manifest(&org, &env))
        .await?
        .ok_or_else(|| ApiError::not_found(format_args!("published manifest for {label:?}")))?;
    Ok(Json(manifest_view(&row)?))
}

pub async fn revoke_manifest(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    Path(hash): Path<String>,
) -> ApiResult<Json<Revoked>> {
    let now = state.now();
    let h = hash.clone();
    let found = state
        .db(move |s| {
            let found = s.revoke_manifest(&org, &h)?;
            if found {
                let revoked = ManifestRevoked {
                    manifest_hash: Some(h.clone()),
                    signing_key: None,
                };
                s.append_events(
                    &org,
                    &[typed_event(EventData::ManifestRevoked(revoked), "", now)],
                )?;
            }
            Ok(found)
        })
        .await?;
    if !found {
        return Err(ApiError::not_found(format_args!("manifest {hash}")));
    }
    state.notify();
    Ok(Json(Revoked {
        sha256: None,
        manifest_hash: Some(hash),
        public_key: None,
        revoked: true,
    }))
}

pub async fn revoke_key(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    JsonObject(body): JsonObject<RevokeKey>,
) -> ApiResult<Json<Revoked>> {
    let now = state.now();
    let key = body.public_key.clone();
    state
        .db(move |s| {
            s.revoke_signing_key(&org, &key)?;
            let revoked = ManifestRevoked {
                manifest_hash: None,
                signing_key: Some(key.clone()),
            };
            s.append_events(
                &org,
                &[typed_event(EventData::ManifestRevoked(revoked), "", now)],
            )
        })
        .await?;
    state.notify();
    Ok(Json(Revoked {
        sha256: None,
        manifest_hash: None,
        public_key: Some(body.public_key),
        revoked: true,
    }))
}

pub fn runner_view(r: &RunnerRow) -> RunnerView {
    RunnerView {
        id: r.id.clone(),
        runner_hash: r.runner_hash.clone(),
        manifest_hash: r.manifest_hash.clone(),
        policy_hash: r.policy_hash.clone(),
        version: r.version.clone(),
        environment: r.environment.clone(),
        ops: r.ops.clone(),
        sandbox_mode: r.sandbox_mode.clone(),
        boot_time: r.boot_time.clone(),
        registered_at: stamp(r.registered_ms),
        last_seen_at: stamp(r.seen_ms),
        slots: r.slots,
        slots_used: r.slots_used,
        slots_free: (r.slots - r.slots_used).max(0),
        enrolment_id: r.enrolment_id.clone(),
        workload_classes: moat_core::WorkloadClass::from_mask(r.classes),
        host: r
            .host_features
            .as_deref()
            .and_then(|h| serde_json::from_str(h).ok()),
        host_id: r.host_id.clone(),
        labels: r
            .labels
            .as_deref()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_default(),
        cpu_millis: r.cpu_millis,
        cpu_reserved: r.cpu_reserved,
        memory_bytes: r.memory_bytes,
        memory_reserved: r.memory_reserved,
        draining: r.draining,
    }
}

pub async fn list_runners(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
) -> ApiResult<Json<Runners>> {
    let runners = state.db(move |s| s.runners(&org)).await?;
    Ok(Json(Runners {
        runners: runners.iter().map(runner_view).collect(),
    }))
}

pub async fn verify_ledger(
    State(state): State<Arc<AppState>>,
    _: auth::Admin,
) -> ApiResult<Json<LedgerCheck>> {
    Ok(Json(match state.db(|s| s.verify_ledger()).await? {
        Ok(v) => LedgerCheck {
            ok: true,
            events: Some(v.events),
            head: Some(v.head),
            error: None,
        },
        Err(broken) => LedgerCheck {
            ok: false,
            events: None,
            head: None,
            error: Some(broken.to_string()),
        },
    }))
}
