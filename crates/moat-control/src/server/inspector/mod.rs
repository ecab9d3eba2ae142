//! The Inspector: the operator's web UI, served under `/ui` by `moat serve`.
//! Pages are rendered here (no build step, no CDN: the stylesheet and the
//! one small script are compiled into the binary).
//!
//! An operator signs in with the org's admin token; it is kept in an
//! HttpOnly, SameSite=Strict cookie scoped to `/ui` and checked on every
//! request like a bearer token (so revoking the token signs them out), and
//! everything shown is the token's org's. Every answer carries security
//! headers, and anything that changes something must come from these pages
//! (see [`guard`]).

// Page handlers answer errors as ready pages (a redirect to the login, an
// error page): axum's `Response` is the error type here, large or not.
#![allow(clippy::result_large_err)]

mod guard;
mod pages;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{any, get, post};
use serde::Deserialize;

use super::AppState;
use super::auth::{self, Operator};
use super::error::ApiError;

const COOKIE: &str = "moat_inspector";
const STYLE: &str = include_str!("style.css");
const SCRIPT: &str = include_str!("live.js");

pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/runs") }))
        .route("/ui/", get(|| async { Redirect::to("/ui/runs") }))
        .route("/ui/assets/style.css", get(style))
        .route("/ui/assets/live.js", get(script))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/runs", get(runs))
        .route("/ui/runs/{run}", get(run))
        .route("/ui/runs/{run}/events", get(run_events))
        .route("/ui/runs/{run}/cancel", post(cancel_run))
        .route("/ui/artifacts/{sha256}", get(artifact))
        .route("/ui/screenshots/{sha256}", get(screenshot))
        .route("/ui/approvals", get(approvals))
        .route("/ui/approvals/{id}/{verdict}", post(resolve))
        .route("/ui/runners", get(runners))
        .route("/ui/usage", get(usage))
        .route("/ui/capacity", get(capacity))
        .route("/ui/ledger", get(ledger))
        .route("/ui/{*rest}", any(no_page))
        .layer(axum::middleware::from_fn_with_state(state, guard::guard))
}

async fn no_page() -> Response {
    failure(ApiError::not_found("such page"))
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

/// What a page handler answers: a page, or a way back to the login.
type Page = Result<Response, Response>;

fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

/// The signed-in operator, or a redirect to the login page.
async fn operator(state: &Arc<AppState>, headers: &HeaderMap) -> Result<Operator, Response> {
    let Some(token) = cookie_token(headers) else {
        return Err(Redirect::to("/ui/login").into_response());
    };
    auth::operator_of(state, token)
        .await
        .map_err(|_| Redirect::to("/ui/login").into_response())
}

fn failure(e: ApiError) -> Response {
    (e.status, Html(pages::error(&e.message))).into_response()
}

async fn login_page() -> Html<String> {
    Html(pages::login(None))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(state): State<Arc<AppState>>, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    let cookie_safe = !token.is_empty()
        && token.len() <= 256
        && token.bytes().all(|b| b.is_ascii_graphic() && b != b';');
    if !cookie_safe {
        return (
            StatusCode::UNAUTHORIZED,
            Html(pages::login(Some("not a token"))),
        )
            .into_response();
    }
    match auth::operator_of(&state, token).await {
        Ok(_) => {
            let cookie = format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict");
            let mut response = Redirect::to("/ui/runs").into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Err(e) => (
            StatusCode::UNAUTHORIZED,
            Html(pages::login(Some(&format!(
                "{} (the Inspector takes the org's admin token)",
                e.message
            )))),
        )
            .into_response(),
    }
}

async fn logout() -> Response {
    let mut response = Redirect::to("/ui/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("moat_inspector=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    response
}

#[derive(Deserialize)]
struct RunsQuery {
    state: Option<String>,
}

async fn runs(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<RunsQuery>,
) -> Page {
    let op = operator(&state, &headers).await?;
    let filter = match q.state.as_deref().filter(|s| !s.is_empty() && *s != "all") {
        None => None,
        Some(text) => Some(moat_store::RunState::parse(text).ok_or_else(|| {
            failure(ApiError::bad_request(format!("unknown run state {text:?}")))
        })?),
    };
    let org = op.org.clone();
    let rows = state
        .db(move |s| s.runs(&org, filter, 200))
        .await
        .map_err(failure)?;
    Ok(Html(pages::runs(&rows, filter)).into_response())
}

async fn run(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Page {
    let op = operator(&state, &headers).await?;
    let (org, lookup, now) = (op.org.clone(), id.clone(), state.now());
    let found = state
        .db(move |s| {
            let Some(run) = s.run(&org, &lookup)? else {
                return Ok(None);
            };
            let ops = s.ops(&org, &lookup)?;
            let events = s.events(&org, Some(&lookup), 0, pages::EVENTS_SHOWN)?;
            let artifacts = s.artifacts(&org, &lookup)?;
            let quarantined = s.run_quarantine(&org, &lookup)?;
            let (runners, quota) = if run.state == moat_store::RunState::Queued {
                let quota = s.quota_reached(&org, now)?.map(|(e, _)| e.to_string());
                (s.runner_presence(&org)?, quota)
            } else {
                (Vec::new(), None)
            };
            Ok(Some((
                run,
                ops,
                events,
                artifacts,
                quarantined,
                (runners, quota),
            )))
        })
        .await
        .map_err(failure)?;
    let Some((run, ops, events, artifacts, quarantined, (runners, quota))) = found else {
        return Err(failure(ApiError::not_found(format_args!("run {id}"))));
    };
    let waiting = super::views::waiting_reason(&run, &runners, quota.as_deref(), now);
    let page = pages::run(
        &pages::RunPage {
            run: &run,
            waiting: waiting.as_deref(),
        },
        &ops,
        &events,
        &artifacts,
        &quarantined,
    );
    Ok(Html(page).into_response())
}

/// The run page's cancel button: the run ends `cancelled`, its runner stops
/// it and tears it down; back to the run page.
async fn cancel_run(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Page {
    let op = operator(&state, &headers).await?;
    super::org_api::cancel(&state, &op.org, &id)
        .await
        .map_err(failure)?;
    Ok(Redirect::to(&format!(
        "/ui/runs/{}",
        moat_core::url::encode_component(&id)
    ))
    .into_response())
}

#[derive(Deserialize)]
struct AfterQuery {
    after: Option<i64>,
}

async fn run_events(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<AfterQuery>,
) -> Page {
    let op = operator(&state, &headers).await?;
    let (org, lookup) = (op.org.clone(), id.clone());
    let exists = state
        .db(move |s| s.run(&org, &lookup))
        .await
        .map_err(failure)?;
    if exists.is_none() {
        return Err(failure(ApiError::not_found(format_args!("run {id}"))));
    }
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .or(q.after)
        .unwrap_or(0);
    Ok(
        super::event_stream::run_events_sse(Arc::clone(&state), op.org, id, after, false)
            .into_response(),
    )
}

/// An artifact of the operator's org, by its SHA-256, checked against it.
async fn artifact_bytes(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    sha: &str,
) -> Result<Vec<u8>, Response> {
    let op = operator(state, headers).await?;
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(failure(ApiError::bad_request("not a SHA-256")));
    }
    let lookup = sha.to_owned();
    let stored = state
        .db(move |s| super::content::locate(s, &op.org, &lookup))
        .await
        .map_err(failure)?
        .ok_or_else(|| failure(ApiError::not_found(format_args!("artifact {sha}"))))?;
    super::content::fetch(state, stored, sha)
        .await
        .and_then(|bytes| super::content::checked(bytes, sha))
        .map_err(failure)
}

/// A browser step's screenshot, shown in the page: only a PNG is served
/// as an image (anything else stays a download).
async fn screenshot(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(sha): Path<String>,
) -> Page {
    let bytes = artifact_bytes(&state, &headers, &sha).await?;
    if !bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Err(failure(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "not_an_image",
            format!("artifact {sha} is not a PNG"),
        )));
    }
    Ok(([(header::CONTENT_TYPE, "image/png")], bytes).into_response())
}

async fn artifact(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(sha): Path<String>,
) -> Page {
    let bytes = artifact_bytes(&state, &headers, &sha).await?;
    let disposition = format!("attachment; filename=\"{sha}\"");
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_DISPOSITION, disposition),
            (header::HeaderName::from_static("x-moat-sha256"), sha),
        ],
        bytes,
    )
        .into_response())
}

async fn approvals(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Page {
    let op = operator(&state, &headers).await?;
    let page = approvals_page(&state, &op, None).await?;
    Ok(Html(page).into_response())
}

/// The approvals page: pending requests (an export's with a preview of
/// the held file, read now, never stored with the request) and recent ones.
async fn approvals_page(
    state: &Arc<AppState>,
    op: &Operator,
    problem: Option<&str>,
) -> Result<String, Response> {
    let org = op.org.clone();
    let (pending, recent, (previews, screens)) = state
        .db(move |s| {
            let pending = s.approvals(&org, Some(moat_store::ApprovalState::Pending), 500)?;
            let recent = s.approvals(&org, None, 50)?;
            let mut previews = std::collections::HashMap::new();
            let mut screens = std::collections::HashMap::new();
            // A run's operations read once, however many of its steps wait.
            let mut runs_ops = std::collections::HashMap::new();
            for a in &pending {
                if a.summary["op"] == "browser_step" {
                    if !runs_ops.contains_key(&a.run_id) {
                        runs_ops.insert(a.run_id.clone(), s.ops(&org, &a.run_id)?);
                    }
                    let ops = runs_ops
                        .get(&a.run_id)
                        .map(Vec::as_slice)
                        .unwrap_or_default();
                    if let Some(sha) = pages::last_screenshot(ops, &a.summary["args"]["sessionId"])
                    {
                        screens.insert(a.id.clone(), sha);
                    }
                    continue;
                }
                if a.summary["op"] != crate::policy::EXPORT_ACTION {
                    continue;
                }
                let ty: Option<moat_core::exports::ExportType> =
                    serde_json::from_value(a.summary["args"]["type"].clone()).ok();
                // Text only, and only its first bytes: never a whole file.
                let Some(ty) = ty.filter(|t| t.is_text()) else {
                    continue;
                };
                let max = super::quarantine::PREVIEW_BYTES;
                if let Some(head) = s.held_prefix(&org, &a.id, max)?
                    && let Some(preview) = super::quarantine::preview(
                        ty,
                        &head,
                        a.summary["args"]["size"].as_u64().unwrap_or(0),
                    )
                {
                    previews.insert(a.id.clone(), preview);
                }
            }
            Ok((pending, recent, (previews, screens)))
        })
        .await
        .map_err(failure)?;
    Ok(pages::approvals(
        &pending, &recent, &previews, &screens, problem,
    ))
}

#[derive(Deserialize)]
struct ResolveForm {
    #[serde(default)]
    reason: String,
}

async fn resolve(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path((id, verdict)): Path<(String, String)>,
    Form(form): Form<ResolveForm>,
) -> Page {
    let op = operator(&state, &headers).await?;
    let approve = match verdict.as_str() {
        "approve" => true,
        "deny" => false,
        _ => return Err(failure(ApiError::not_found("no such action"))),
    };
    let reason = Some(form.reason).filter(|r| !r.trim().is_empty());
    match super::approvals::resolve(&state, &op, &id, approve, reason, "inspector").await {
        Ok(_) => Ok(Redirect::to("/ui/approvals").into_response()),
        Err(e) => {
            let page = approvals_page(&state, &op, Some(&e.message)).await?;
            Ok((e.status, Html(page)).into_response())
        }
    }
}

async fn runners(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Page {
    let op = operator(&state, &headers).await?;
    let org = op.org.clone();
    let rows = state
        .db(move |s| {
            let mut rows = Vec::new();
            for runner in s.runners(&org)? {
                let manifest = s.manifest(&org, &runner.manifest_hash)?;
                rows.push((runner, manifest));
            }
            Ok(rows)
        })
        .await
        .map_err(failure)?;
    Ok(Html(pages::runners(&rows, state.now())).into_response())
}

async fn capacity(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Page {
    let op = operator(&state, &headers).await?;
    let scope = super::capacity::Scope::Org(op.org.clone());
    let capacity = super::capacity::capacity_of(&state, &scope)
        .await
        .map_err(failure)?;
    let (org, now) = (op.org.clone(), state.now());
    let (name, (quota, used), days) = state
        .db(move |s| {
            Ok((
                s.org_name(&org)?.unwrap_or_default(),
                s.quota(&org, now)?,
                s.usage_days(&org, 14)?,
            ))
        })
        .await
        .map_err(failure)?;
    let exceeded = quota
        .as_ref()
        .and_then(|q| q.exceeded(&used))
        .map(|e| e.to_string());
    let quota = moat_api::org::QuotaView {
        org: name,
        quota,
        used,
        exceeded,
    };
    Ok(Html(pages::capacity(&pages::CapacityPage {
        capacity: &capacity,
        quota: &quota,
        days: &days,
    }))
    .into_response())
}

/// Days of usage the page shows.
const USAGE_DAYS: i64 = 90;

async fn usage(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Page {
    let op = operator(&state, &headers).await?;
    let org = op.org.clone();
    let days = state
        .db(move |s| s.usage_days(&org, USAGE_DAYS))
        .await
        .map_err(failure)?;
    Ok(Html(pages::usage(&days)).into_response())
}

#[derive(Deserialize)]
struct LedgerQuery {
    verify: Option<String>,
}

/// The chain's head; with `?verify=1`, the chain re-hashed (read-only, so a
/// plain GET form). Re-hashing reads every org's events, so it runs at most
/// once every [`VERIFY_EVERY_MS`] per process: a request within that time
/// gets the last result, with when it was found and when the next may run.
async fn ledger(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<LedgerQuery>,
) -> Page {
    operator(&state, &headers).await?;
    let head = state.db(|s| s.ledger_head()).await.map_err(failure)?;
    let verdict = match q.verify {
        Some(_) => Some(verify(&state).await.map_err(failure)?),
        None => None,
    };
    Ok(Html(pages::ledger(head, verdict)).into_response())
}

/// How often the Inspector may re-hash the whole chain.
pub const VERIFY_EVERY_MS: i64 = 10_000;

/// The last full verification of this process.
#[derive(Clone)]
pub struct LedgerCheck {
    pub at_ms: i64,
    /// The events re-hashed, or where the chain broke.
    pub verdict: Result<i64, String>,
    /// Set when this is an earlier result: when the next check may run.
    pub next_ms: Option<i64>,
}

async fn verify(state: &Arc<AppState>) -> Result<LedgerCheck, ApiError> {
    // Held while verifying: requests meanwhile wait and share the result.
    let mut last = state.ledger_check.lock().await;
    let now = state.now();
    if let Some(check) = last.as_ref() {
        let next = check.at_ms.saturating_add(VERIFY_EVERY_MS);
        if (check.at_ms..next).contains(&now) {
            return Ok(LedgerCheck {
                next_ms: Some(next),
                ..check.clone()
            });
        }
    }
    let checked = state.db(|s| s.verify_ledger()).await?;
    let check = LedgerCheck {
        at_ms: now,
        verdict: checked.map(|v| v.events).map_err(|b| b.to_string()),
        next_ms: None,
    };
    *last = Some(check.clone());
    Ok(check)
}
