//! An org's runs, their operations (decided here), events and artifacts.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use moat_api::RunView;
use moat_api::org::{
    ArtifactCheck, ArtifactList, EventPage, EventView, NewRun as NewRunBody, OpList, OpRefused,
    OpSubmission, OpView, PendingApproval, RunList,
};
use moat_core::event_data::{ApprovalRequested, ApprovalSummary, CapabilityRequested};
use moat_core::hash::sha256_hex;
use moat_core::ids::RunId;
use moat_core::{Envelope, Event, EventData, SignedManifest};
use moat_store::{
    NewApproval, NewArtifact, NewOp, NewRun, OpRow, RunRow, RunState, stamp, typed_event,
};
use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::auth;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use super::event_stream::run_events_sse;
use super::views::{artifact_view, op_view, run_view};
use super::wake::Topic;
use crate::decide::{decide, decide_token_tools, denied_result};
use crate::tools::ToolDef;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

pub async fn create_run(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    JsonObject(body): JsonObject<NewRunBody>,
) -> ApiResult<(StatusCode, Json<RunView>)> {
    let id = body.id.unwrap_or_else(RunId::random).into_string();
    let max_attempts = body.max_attempts.unwrap_or(state.config.max_attempts);
    if !(1..=100).contains(&max_attempts) {
        return Err(ApiError::bad_request("maxAttempts: 1 to 100"));
    }
    let mut inputs = Vec::new();
    let mut listed = Vec::new();
    for input in body.inputs {
        let data = match (input.content, input.content_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(b64)) => B64.decode(b64.as_bytes()).map_err(|_| {
                ApiError::bad_request(format!("input {}: contentBase64 is not base64", input.path))
            })?,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "input {}: give content or contentBase64",
                    input.path
                )));
            }
        };
        let sha = sha256_hex(&data);
        listed.push(moat_core::event_data::RunInput {
            path: input.path.to_string(),
            sha256: sha.clone(),
            size: u64::try_from(data.len()).unwrap_or(u64::MAX),
        });
        inputs.push(NewArtifact {
            sha256: sha,
            kind: "input".into(),
            label: input.path.into_string(),
            data,
            kept: moat_store::Kept::Database,
        });
    }
    let mut environment = body
        .environment
        .clone()
        .unwrap_or_else(|| state.config.environment.clone());
    if let Some(hash) = &body.manifest_hash {
        let (o, h) = (org.clone(), hash.clone());
        let pinned = state
            .db(move |s| s.manifest(&o, &h))
            .await?
            .filter(|m| !m.revoked)
            .ok_or_else(|| {
                ApiError::bad_request(format!("manifestHash {hash}: no such published manifest"))
            })?;
        if body
            .environment
            .as_ref()
            .is_some_and(|e| *e != pinned.environment)
        {
            return Err(ApiError::bad_request(format!(
                "manifest {hash} is for environment {:?}",
                pinned.environment
            )));
        }
        environment = pinned.environment;
    }
    // What the checks below and the new run's view need, in one trip to
    // the store: the org's secrets, its quota's state, its name, the
    // manifest the run would be decided under, and its runners (why a
    // queued run waits). Queued runs count towards no quota, so the quota
    // read before the run is created says what it says after.
    let manifest_hash = body.manifest_hash;
    let (o, e, h) = (org.clone(), environment.clone(), manifest_hash.clone());
    let now = state.now();
    let moat_store::NewRunContext {
        org_name,
        secrets: sealed,
        manifest,
        quota_reached: reached,
        runners,
    } = state
        .db(move |s| s.new_run_context(&o, &e, h.as_deref(), now))
        .await?;
    let org_name = org_name.unwrap_or_default();
    let context = WaitingContext {
        runners,
        quota: reached.as_ref().map(|(exceeded, _)| exceeded.to_string()),
    };
    // Nothing of a run that carries a secret is stored or handed out.
    let secrets = super::secrets::open_secrets(&state, &org, &sealed)?;
    if !secrets.is_empty() {
        let mut fields: Vec<(String, &[u8])> = vec![
            ("the run id".into(), id.as_bytes()),
            ("environment".into(), environment.as_bytes()),
        ];
        for (i, input) in inputs.iter().enumerate() {
            fields.push((format!("inputs[{i}].path"), input.label.as_bytes()));
            fields.push((format!("inputs[{i}]"), &input.data));
        }
        if let Some(found) = super::inputs::find_secret(&secrets, &fields) {
            return Err(super::inputs::refuse(&state, &org, found).await);
        }
    }
    super::capacity::refuse_if_over(&state, &org, reached, now).await?;
    let manifest: Option<SignedManifest> = manifest
        .filter(|m| !m.revoked)
        .and_then(|m| serde_json::from_str(&m.signed).ok());
    let needs = crate::decide::run_classes(
        &state.config.policy,
        &org_name,
        manifest.as_ref(),
        &body.workload_classes,
    )
    .map_err(ApiError::bad_request)?;
    let attachments = attachments(&state, &org, &body.volumes, body.resume_from.as_ref()).await?;
    check_attachments(&attachments, &listed, manifest.as_ref())?;
    let run = state
        .db(move |s| {
            let volumes: Vec<moat_store::Attach<'_>> = attachments
                .iter()
                .map(|(volume, path, read_only)| moat_store::Attach {
                    volume,
                    path,
                    read_only: *read_only,
                })
                .collect();
            s.create_run(
                &NewRun {
                    org: &org,
                    id: &id,
                    environment: &environment,
                    inputs: &listed,
                    blobs: &inputs,
                    max_attempts,
                    manifest_hash: manifest_hash.as_deref(),
                    needs_classes: &needs,
                    volumes: &volumes,
                },
                now,
            )
        })
        .await?;
    state.notify_queue(&run.org_id, &run.environment);
    Ok((StatusCode::CREATED, Json(explained(&run, &context, now)?)))
}

/// The volumes a new run attaches, as `(volume, path, read-only)`: those
/// it names, then those of the run it resumes from (same org only) at
/// paths it does not name.
async fn attachments(
    state: &Arc<AppState>,
    org: &str,
    named: &[moat_api::org::VolumeAttachment],
    resume_from: Option<&RunId>,
) -> ApiResult<Vec<(String, String, bool)>> {
    let mut out: Vec<(String, String, bool)> = named
        .iter()
        .map(|v| (v.volume.to_string(), v.path.to_string(), v.read_only))
        .collect();
    if let Some(from) = resume_from {
        let (o, id) = (org.to_owned(), from.to_string());
        let previous = state.db(move |s| s.run(&o, &id)).await?.ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("resumeFrom: no run {from} in this org"),
            )
        })?;
        if previous.volumes.is_empty() {
            return Err(ApiError::bad_request(format!(
                "resumeFrom: run {from} had no volumes: there is nothing to continue from"
            )));
        }
        // A volume or path the new run names itself is attached as named.
        for v in previous.volumes {
            if !out
                .iter()
                .any(|(volume, path, _)| *path == v.path || *volume == v.volume)
            {
                out.push((v.volume, v.path, v.read_only));
            }
        }
    }
    Ok(out)
}

/// Each volume once, at its own persistent root of the manifest (when one
/// is published: the runner checks again), with no input inside it.
fn check_attachments(
    attachments: &[(String, String, bool)],
    inputs: &[moat_core::event_data::RunInput],
    manifest: Option<&SignedManifest>,
) -> ApiResult<()> {
    let inside = |path: &str, root: &str| path == root || path.starts_with(&format!("{root}/"));
    for (i, (volume, path, _)) in attachments.iter().enumerate() {
        for (other_volume, other_path, _) in &attachments[..i] {
            if other_volume == volume {
                return Err(ApiError::bad_request(format!(
                    "volume {volume} is attached twice"
                )));
            }
            if inside(path, other_path) || inside(other_path, path) {
                return Err(ApiError::bad_request(format!(
                    "volumes {other_volume} and {volume}: paths {other_path} and {path} overlap"
                )));
            }
        }
        if let Some(input) = inputs.iter().find(|input| inside(&input.path, path)) {
            return Err(ApiError::bad_request(format!(
                "input {} is inside volume {volume}'s path {path}: a volume's content comes \
                 from its snapshots only",
                input.path
            )));
        }
        if let Some(signed) = manifest {
            let fs = &signed.manifest.filesystem;
            if !fs.is_persistent(std::path::Path::new(path)) {
                return Err(ApiError::bad_request(format!(
                    "volume {volume}: path {path} is not a persistent root of the manifest \
                     (filesystem.persistentRoots: {:?})",
                    fs.persistent_roots
                )));
            }
        }
    }
    Ok(())
}

/// Why an org's queued runs wait: its runners and the quota it has reached
/// (read only if one of `runs` is queued), read in the same trip to the
/// store as the runs.
fn waiting_context(
    s: &moat_store::Store,
    org: &str,
    runs: &[RunRow],
    now: i64,
) -> Result<WaitingContext, moat_store::StoreError> {
    if !runs.iter().any(|r| r.state == RunState::Queued) {
        return Ok(WaitingContext::default());
    }
    Ok(WaitingContext {
        quota: s.quota_reached(org, now)?.map(|(e, _)| e.to_string()),
        runners: s.runner_presence(org)?,
    })
}

#[derive(Default)]
struct WaitingContext {
    runners: Vec<moat_store::RunnerPresence>,
    quota: Option<String>,
}

/// The view of `run`, with why it waits if it is queued and nothing could
/// claim it (no runner, or none with the classes it needs).
fn explained(run: &RunRow, context: &WaitingContext, now: i64) -> ApiResult<RunView> {
    Ok(RunView {
        waiting: super::views::waiting_reason(run, &context.runners, context.quota.as_deref(), now),
        ..run_view(run)?
    })
}

#[derive(Deserialize)]
pub struct RunsQuery {
    state: Option<String>,
    limit: Option<i64>,
}

pub async fn list_runs(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Query(q): Query<RunsQuery>,
) -> ApiResult<Json<RunList>> {
    let filter = match q.state.as_deref() {
        None => None,
        Some(text) => Some(
            RunState::parse(text)
                .ok_or_else(|| ApiError::bad_request(format!("unknown run state {text:?}")))?,
        ),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let now = state.now();
    let (runs, context) = state
        .db(move |s| {
            let runs = s.runs(&org, filter, limit)?;
            let context = waiting_context(s, &org, &runs, now)?;
            Ok((runs, context))
        })
        .await?;
    Ok(Json(RunList {
        runs: runs
            .iter()
            .map(|run| explained(run, &context, now))
            .collect::<ApiResult<_>>()?,
    }))
}

async fn the_run(state: &Arc<AppState>, org: &str, run: &str) -> ApiResult<RunRow> {
    let (org, id) = (org.to_owned(), run.to_owned());
    state
        .db(move |s| s.run(&org, &id))
        .await?
        .ok_or_else(|| ApiError::not_found(format_args!("run {run}")))
}

pub async fn get_run(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(run): Path<String>,
) -> ApiResult<Json<RunView>> {
    let (id, now) = (run.clone(), state.now());
    let (row, context) = state
        .db(move |s| {
            let Some(row) = s.run(&org, &id)? else {
                return Ok(None);
            };
            let context = waiting_context(s, &org, std::slice::from_ref(&row), now)?;
            Ok(Some((row, context)))
        })
        .await?
        .ok_or_else(|| ApiError::not_found(format_args!("run {run}")))?;
    Ok(Json(explained(&row, &context, now)?))
}

pub async fn finish_run(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(run): Path<String>,
) -> ApiResult<Json<RunView>> {
    let now = state.now();
    let id = run.clone();
    let row = state
        .db(move |s| s.request_finish(&org, &id, now))
        .await?
        .ok_or_else(|| ApiError::not_found(format_args!("run {run}")))?;
    state.notify_run(&run);
    Ok(Json(run_view(&row)?))
}

/// Cancels a run that has not ended: its pending operations fail
/// (`run_ended`), pending approvals expire, and the runner holding it finds
/// the run gone at its next heartbeat (every second while an operation
/// runs), stops the operation's sandbox and tears the run down.
pub async fn cancel_run(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(run): Path<String>,
) -> ApiResult<Json<RunView>> {
    Ok(Json(run_view(&cancel(&state, &org, &run).await?)?))
}

/// Cancels `run` of `org` (the API's and the Inspector's): the run as it
/// is now, or 409 `not_cancellable` once it has ended.
pub(crate) async fn cancel(state: &Arc<AppState>, org: &str, run: &str) -> ApiResult<RunRow> {
    let now = state.now();
    let (o, id) = (org.to_owned(), run.to_owned());
    let cancelled = state
        .db(move |s| s.force_end_run(&o, &id, RunState::Cancelled, "cancelled", now))
        .await?;
    let row = the_run(state, org, run).await?;
    if !cancelled {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_cancellable",
            format!("run {run} already ended ({})", row.state.as_str()),
        ));
    }
    state.notify_run(run);
    Ok(row)
}

#[derive(Deserialize)]
pub struct WaitQuery {
    wait_ms: Option<u64>,
}

/// The envelope as posted, completed: its run, a correlation id and a time.
fn complete_envelope(body: Value, run: &str, now: i64) -> ApiResult<Envelope> {
    let map = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the operation must be a JSON object"))?;
    if map.contains_key("toolToken") {
        return Err(ApiError::bad_request(
            "tool tokens are issued by the control plane to the runner, not sent to it",
        ));
    }
    if map.contains_key("capability") {
        return Err(ApiError::bad_request(
            "capabilities are issued by the control plane, not sent to it",
        ));
    }
    let posted: OpSubmission = serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("the operation envelope: {e}")))?;
    if let Some(given) = posted.run_id.as_deref().filter(|given| *given != run) {
        return Err(ApiError::bad_request(format!(
            "runId {given:?} is not this run"
        )));
    }
    let id = posted.id.into_string();
    Ok(Envelope {
        correlation_id: posted.correlation_id.unwrap_or_else(|| id.clone()),
        id,
        run_id: run.to_owned(),
        op: posted.op,
        args: posted.args,
        timeout_ms: posted.timeout_ms,
        max_output_bytes: posted.max_output_bytes,
        network: posted.network,
        cwd: posted.cwd,
        capability: None,
        policy_decision_ref: posted.policy_decision_ref,
        tool_token: None,
        secret_value: None,
        created_at: posted.created_at.unwrap_or_else(|| stamp(now)),
    })
}

/// What an approver reads about an operation.
/// `capability.requested` for `envelope`, filed under its run and op.
pub(super) fn requested_event(envelope: &Envelope, now: i64) -> Event {
    let mut requested = typed_event(
        EventData::CapabilityRequested(CapabilityRequested {
            op: Some(envelope.op.clone()),
            ..CapabilityRequested::default()
        }),
        &envelope.run_id,
        now,
    );
    requested.op_id = Some(envelope.id.clone());
    requested.correlation_id = Some(envelope.correlation_id.clone());
    requested
}

pub(super) fn approval_summary(
    envelope: &Envelope,
    described: Option<&crate::describe::Described>,
) -> ApprovalSummary {
    ApprovalSummary {
        op: envelope.op.clone(),
        resource: described.map(|d| d.resource.to_string()),
        size: described.map(|d| d.size),
        network: described.map(|d| d.network),
        args: envelope.args.clone(),
        element: None,
    }
}

pub async fn post_op(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(run_id): Path<String>,
    Query(q): Query<WaitQuery>,
    JsonObject(body): JsonObject<Value>,
) -> ApiResult<Response> {
    let now = state.now();
    // One trip to the store: the run's context, the org's sealed secrets
    // and, for a tool call, the tool.
    let tool_name = match (
        body.get("op").and_then(Value::as_str),
        body.pointer("/args/profile").and_then(Value::as_str),
        body.pointer("/args/tool").and_then(Value::as_str),
    ) {
        (Some("http_request"), Some(crate::tools::PROFILE), Some(name)) => Some(name.to_owned()),
        _ => None,
    };
    // Tools a program asks a one-operation token for (at most 16).
    let token_names: Vec<String> = match body.get("op").and_then(Value::as_str) {
        Some("exec_argv") => body
            .pointer("/args/toolToken")
            .and_then(Value::as_array)
            .map(|names| {
                names
                    .iter()
                    .take(16)
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let (o, r) = (org.clone(), run_id.clone());
    let (context, tool, token_tools) = state
        .db(move |s| {
            let tool = match &tool_name {
                Some(name) => s.tool(&o, name)?,
                None => None,
            };
            let mut token_tools = Vec::new();
            for name in token_names {
                let def = s.tool(&o, &name)?;
                token_tools.push((name, def));
            }
            Ok((s.op_context(&o, &r)?, tool, token_tools))
        })
        .await?;
    let moat_store::OpContext {
        run,
        org_name,
        manifest,
        runner_classes,
        secrets: sealed,
    } = context.ok_or_else(|| ApiError::not_found(format_args!("run {run_id}")))?;
    // An agent cannot hand one of the org's secrets to a program or to the
    // ledger: known values are scrubbed from the envelope before anything.
    let mut body = body;
    crate::tools::Scrubber::new(super::secrets::open_secrets(&state, &org, &sealed)?)
        .json(&mut body);
    if let (Some(op), Some(args)) = (
        body.get("op").and_then(Value::as_str).map(str::to_owned),
        body.get_mut("args"),
    ) {
        crate::describe::canonicalize_args(&op, args);
    }
    let envelope = complete_envelope(body, &run_id, now)?;
    if run.state.is_final() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "run_ended",
            format!("run {run_id} has ended ({})", run.state.as_str()),
        ));
    }
    let manifest = manifest.filter(|m| !m.revoked);
    let manifest: Option<SignedManifest> =
        manifest.and_then(|m| serde_json::from_str(&m.signed).ok());
    let tool = tool.and_then(|t| ToolDef::parse(&t.definition).ok());
    let mut decided = decide(
        &state.config.policy,
        &org_name,
        &run,
        manifest.as_ref(),
        &envelope,
        tool.as_ref(),
        runner_classes.as_deref(),
        None,
    );
    if let Some(def) = &tool {
        decided.record.tool_hash = Some(def.hash());
    }
    if !token_tools.is_empty() {
        decide_token_tools(
            &state.config.policy,
            &org_name,
            &run,
            manifest.as_ref(),
            &token_tools,
            &mut decided,
        );
    }
    let (op_state, decision, denial) = (
        decided.state,
        decided.record.clone(),
        decided.denial.clone(),
    );
    let requested = requested_event(&envelope, now);
    let approval_id = moat_core::random::new_id("apr_");
    let approval_ttl = i64::try_from(state.config.approval_ttl.as_millis()).unwrap_or(i64::MAX);
    let approval_expires = now.saturating_add(approval_ttl);
    let summary = approval_summary(&envelope, decided.described.as_ref());
    let summary_json =
        serde_json::to_value(&summary).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut outcome = match (&denial, &decided.approval) {
        (Some((reason, message)), _) => typed_event(
            EventData::CapabilityDenied(decision.denied(*reason, message.clone())),
            &run_id,
            now,
        ),
        (None, Some((rule, risk))) => typed_event(
            EventData::ApprovalRequested(ApprovalRequested {
                approval_id: approval_id.clone(),
                rule: rule.clone(),
                risk: risk.clone(),
                expires_at: stamp(approval_expires),
                summary: summary.clone(),
                policy_hash: decision.policy_hash.clone(),
                manifest_hash: decision.manifest_hash.clone().unwrap_or_default(),
            }),
            &run_id,
            now,
        ),
        (None, None) => typed_event(
            EventData::CapabilityGranted(decision.granted()),
            &run_id,
            now,
        ),
    };
    outcome.op_id = requested.op_id.clone();
    outcome.correlation_id = requested.correlation_id.clone();
    let result = denial
        .as_ref()
        .map(|(reason, message)| denied_result(&envelope.id, *reason, message.clone()));
    let envelope_json =
        serde_json::to_value(&envelope).map_err(|e| ApiError::internal(e.to_string()))?;
    let decision = decision.to_json();
    let approval = decided.approval.clone();
    let pending = approval.is_some().then(|| PendingApproval {
        id: approval_id.clone(),
        expires_at: stamp(approval_expires),
    });
    let (o, r, op_id, kind) = (
        org.clone(),
        run_id.clone(),
        envelope.id.clone(),
        envelope.op.clone(),
    );
    // Taken before the op exists: every change to the run after it wakes
    // the wait for its result below, which need not look first.
    let mut changes = state.watch(Topic::Run(run_id.clone()));
    let row = state
        .db(move |s| {
            s.insert_op(
                &NewOp {
                    org: &o,
                    run: &r,
                    id: &op_id,
                    op: &kind,
                    state: op_state,
                    envelope: &envelope_json,
                    decision: &decision,
                    result: result.as_ref(),
                    events: &[requested, outcome],
                    approval: approval.as_ref().map(|(rule, risk)| NewApproval {
                        id: &approval_id,
                        rule,
                        risk,
                        summary: &summary_json,
                        expires_ms: approval_expires,
                    }),
                },
                now,
            )
        })
        .await?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "run_ended",
                format!("run {run_id} has ended"),
            )
        })?;
    state.notify_run_past(&run_id, &mut changes);
    if let Some((reason, message)) = denial {
        let body = OpRefused {
            error: moat_api::ErrorDetail {
                reason: reason.as_str().to_owned(),
                message,
            },
            op: op_view(&row),
        };
        return Ok((StatusCode::FORBIDDEN, Json(body)).into_response());
    }
    match q.wait_ms {
        Some(wait) if wait > 0 => {
            // Just queued (or waiting for approval): nothing to look at
            // until the run changes.
            let done = if row.state.is_final() {
                Some(row.clone())
            } else {
                let (org, run, op) = (org.clone(), run_id.clone(), row.id.clone());
                state
                    .wait_after(changes, Duration::from_millis(wait), false, move |s| {
                        Ok(s.op(&org, &run, &op)?.filter(|o| o.state.is_final()))
                    })
                    .await?
            };
            Ok((StatusCode::OK, Json(op_view(done.as_ref().unwrap_or(&row)))).into_response())
        }
        _ => match pending {
            Some(approval) => {
                let body = OpView {
                    approval: Some(approval),
                    ..op_view(&row)
                };
                Ok((StatusCode::ACCEPTED, Json(body)).into_response())
            }
            None => Ok((StatusCode::CREATED, Json(op_view(&row))).into_response()),
        },
    }
}

async fn wait_final(
    state: &Arc<AppState>,
    org: &str,
    run: &str,
    op: &str,
    wait: Duration,
) -> ApiResult<Option<OpRow>> {
    let (org, run, op) = (org.to_owned(), run.to_owned(), op.to_owned());
    state
        .wait_for(wait, Topic::Run(run.clone()), move |s| {
            Ok(s.op(&org, &run, &op)?.filter(|o| o.state.is_final()))
        })
        .await
}

pub async fn list_ops(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(run): Path<String>,
) -> ApiResult<Json<OpList>> {
    the_run(&state, &org, &run).await?;
    let ops = state.db(move |s| s.ops(&org, &run)).await?;
    Ok(Json(OpList {
        ops: ops.iter().map(op_view).collect(),
    }))
}

pub async fn get_op(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path((run, op)): Path<(String, String)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<Json<OpView>> {
    if let Some(wait) = q.wait_ms.filter(|w| *w > 0)
        && let Some(done) = wait_final(&state, &org, &run, &op, Duration::from_millis(wait)).await?
    {
        return Ok(Json(op_view(&done)));
    }
    let (r, o) = (run.clone(), op.clone());
    let row = state
        .db(move |s| s.op(&org, &r, &o))
        .await?
        .ok_or_else(|| ApiError::not_found(format_args!("operation {op} of run {run}")))?;
    Ok(Json(op_view(&row)))
}

#[derive(Deserialize)]
pub struct EventsQuery {
    after: Option<i64>,
    limit: Option<i64>,
}

pub async fn events(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(run): Path<String>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Json<EventPage>> {
    the_run(&state, &org, &run).await?;
    let (after, limit) = (
        q.after.unwrap_or(0),
        q.limit.unwrap_or(1000).clamp(1, 10_000),
    );
    let page = state
        .db(move |s| s.events(&org, Some(&run), after, limit))
        .await?;
    Ok(Json(EventPage {
        events: page
            .events
            .into_iter()
            .map(|e| EventView {
                event: e.event,
                seq: e.seq,
                prev_hash: e.prev_hash,
                hash: e.hash,
            })
            .collect(),
        last: page.last_seq,
    }))
}

/// Server-sent events of one run: every event so far (or after
/// `Last-Event-ID`), then new ones as they are recorded; the stream ends
/// once the run has ended and its events are all sent.
pub async fn event_stream(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(run): Path<String>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>>> {
    let org = auth::agent(&state, &headers).await?;
    the_run(&state, &org, &run).await?;
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let after = resume.or(q.after).unwrap_or(0);
    Ok(run_events_sse(state, org, run, after, true))
}

pub async fn list_artifacts(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(run): Path<String>,
) -> ApiResult<Json<ArtifactList>> {
    the_run(&state, &org, &run).await?;
    let artifacts = state.db(move |s| s.artifacts(&org, &run)).await?;
    Ok(Json(ArtifactList {
        artifacts: artifacts.iter().map(artifact_view).collect(),
    }))
}

async fn artifact_bytes(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    sha: &str,
) -> ApiResult<Vec<u8>> {
    let org = auth::agent(state, headers).await?;
    let lookup = sha.to_owned();
    let (stored, held, quarantined) = state
        .db(move |s| {
            // Bytes held for an approval or rejected at the boundary do not
            // leave under another name (a copy a later artifact_read made,
            // a stdout that printed them), unless the boundary promoted
            // them or the agent gave them as an input.
            let held = s.held_export(&org, &lookup)?;
            let quarantined = match held {
                Some(_) => None,
                None => s.quarantined(&org, &lookup)?,
            };
            let stored = if (held.is_some() || quarantined.is_some())
                && !s.artifact_of_kind(&org, &lookup, &["export", "input"])?
            {
                None
            } else {
                super::content::locate(s, &org, &lookup)?
            };
            Ok((stored, held, quarantined))
        })
        .await?;
    match (stored, held, quarantined) {
        (Some(stored), _, _) => super::content::fetch(state, stored, sha).await,
        (None, Some(h), _) => Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "awaiting_approval",
            format!(
                "artifact {sha} (run {}, {:?}) waits for approval {} before it leaves",
                h.run_id, h.path, h.approval_id
            ),
        )),
        (None, None, Some(q)) => Err(quarantined_answer(sha, &q)),
        (None, None, None) => Err(ApiError::not_found(format_args!("artifact {sha}"))),
    }
}

/// A rejected file is not an artifact: 404, with why it was held back.
fn quarantined_answer(sha: &str, q: &moat_store::QuarantineRow) -> ApiError {
    let reasons: Vec<String> = q
        .reasons
        .iter()
        .map(|r| format!("{} ({})", r.rule.as_str(), r.detail))
        .collect();
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "quarantined",
        format!(
            "artifact {sha} was rejected at the export boundary (run {}, {:?}): {}",
            q.run_id,
            q.path,
            reasons.join("; ")
        ),
    )
}

pub async fn download_artifact(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(sha): Path<String>,
) -> ApiResult<Response> {
    let bytes = super::content::checked(artifact_bytes(&state, &headers, &sha).await?, &sha)?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::HeaderName::from_static("x-moat-sha256"), sha),
        ],
        bytes,
    )
        .into_response())
}

pub async fn verify_artifact(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(sha): Path<String>,
) -> ApiResult<Json<ArtifactCheck>> {
    let bytes = artifact_bytes(&state, &headers, &sha).await?;
    let computed = sha256_hex(&bytes);
    Ok(Json(ArtifactCheck {
        ok: computed == sha,
        size: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
        sha256: sha,
        computed,
    }))
}
