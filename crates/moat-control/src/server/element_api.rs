//! `POST /v1/runner/runs/{run}/ops/{op}/element`: an acting browser step
//! (`click`, `type`, `select`, `fill_secret`) is decided on the element it
//! would act on, which only the runner's browser can find. The step was let
//! through to be looked at (`elementCheck`); its shell answered
//! `element_unchecked` with what the selector matches on the page; here the
//! policy decides again with `context.element` and `context.domain`:
//! allowed, the runner gets a capability bound to that element's
//! fingerprint and takes the step; otherwise the op waits for a person, who
//! approves seeing the element, or is refused. Each outcome is on record
//! with the element.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use moat_api::runner::{ElementBody, ElementDecision};
use moat_core::event_data::ApprovalRequested;
use moat_core::event_data::PolicyDecision;
use moat_core::{DenialReason, Envelope, EventData, OpKind, SignedManifest};
use moat_store::{NewApproval, OpState, Redecided, stamp, typed_event};

use super::AppState;
use super::auth::SignedRunner;
use super::body::parse;
use super::error::{ApiError, ApiResult};
use crate::decide::{ACTING, Decided, decide, denied_result};

pub async fn element(
    State(state): State<Arc<AppState>>,
    Path((run_id, op_id)): Path<(String, String)>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<ElementDecision>> {
    let ElementBody {
        mut element,
        mut events,
    } = parse(&body)?;
    if events.len() > super::runner_api::MAX_RESULT_EVENTS {
        return Err(ApiError::bad_request(format!(
            "at most {} events with an element",
            super::runner_api::MAX_RESULT_EVENTS
        )));
    }
    for e in &mut events {
        super::runner_api::check_shell_event(e, &runner)?;
        e.run_id = run_id.clone();
        e.op_id = Some(op_id.clone());
    }
    let now = state.now();
    let (o, r, id) = (runner.org_id.clone(), run_id.clone(), op_id.clone());
    let (op, context) = state
        .db(move |s| Ok((s.op(&o, &r, &id)?, s.op_context(&o, &r)?)))
        .await?;
    let not_held = || {
        ApiError::new(
            StatusCode::CONFLICT,
            "op_not_dispatched",
            format!("operation {op_id} is not one this runner is taking"),
        )
    };
    let op = op.ok_or_else(not_held)?;
    let context = context.ok_or_else(not_held)?;
    if op.state != OpState::Dispatched || context.run.runner_id.as_deref() != Some(&runner.id) {
        return Err(not_held());
    }
    let envelope: Envelope = serde_json::from_value(op.envelope.clone())
        .map_err(|e| ApiError::internal(format!("stored envelope: {e}")))?;
    let action = envelope.args["action"].as_str().unwrap_or_default();
    if envelope.op != OpKind::BrowserStep.as_str() || !ACTING.contains(&action) {
        return Err(ApiError::bad_request(format!(
            "operation {op_id} is not an acting browser step"
        )));
    }
    // A page may show one of the org's secrets: never in a decision, an
    // approval or the record.
    let scrubber = crate::tools::Scrubber::new(super::secrets::open_secrets(
        &state,
        &runner.org_id,
        &context.secrets,
    )?);
    let shown = serde_json::to_value(&element).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut facts = shown.clone();
    scrubber.json(&mut facts);
    // The shell scrubs only what it filled into the page: a secret it did
    // not fill, shown by the element, makes its facts differ from what
    // the shell would act on (no capability could bind them), and an
    // approver must not see it: refused.
    let shows_secret = facts != shown;
    element = serde_json::from_value(facts).map_err(|e| ApiError::internal(e.to_string()))?;
    for e in &mut events {
        scrubber.json(&mut e.data);
    }
    let manifest: Option<SignedManifest> = context
        .manifest
        .filter(|m| !m.revoked)
        .and_then(|m| serde_json::from_str(&m.signed).ok());
    let decided = decide(
        &state.config.policy,
        &context.org_name,
        &context.run,
        manifest.as_ref(),
        &envelope,
        None,
        context.runner_classes.as_deref(),
        Some(&element),
    );
    let decided = if shows_secret {
        refuse_shown_secret(decided)
    } else {
        decided
    };
    let requested = super::org_api::requested_event(&envelope, now);
    let approval_id = moat_core::random::new_id("apr_");
    let ttl = i64::try_from(state.config.approval_ttl.as_millis()).unwrap_or(i64::MAX);
    let expires = now.saturating_add(ttl);
    let mut summary = super::org_api::approval_summary(&envelope, decided.described.as_ref());
    summary.element = Some(element.clone());
    let summary_json =
        serde_json::to_value(&summary).map_err(|e| ApiError::internal(e.to_string()))?;
    let record = &decided.record;
    let (next_state, data) = match (&decided.denial, &decided.approval) {
        (Some((reason, message)), _) => (
            OpState::Denied,
            EventData::CapabilityDenied(record.denied(*reason, message.clone())),
        ),
        (None, Some((rule, risk))) => (
            OpState::PendingApproval,
            EventData::ApprovalRequested(ApprovalRequested {
                approval_id: approval_id.clone(),
                rule: rule.clone(),
                risk: risk.clone(),
                expires_at: stamp(expires),
                summary,
                policy_hash: record.policy_hash.clone(),
                manifest_hash: record.manifest_hash.clone().unwrap_or_default(),
            }),
        ),
        (None, None) => (
            OpState::Dispatched,
            EventData::CapabilityGranted(record.granted()),
        ),
    };
    let mut outcome = typed_event(data, &run_id, now);
    outcome.op_id = requested.op_id.clone();
    outcome.correlation_id = requested.correlation_id.clone();
    events.push(requested);
    events.push(outcome);
    let result = decided
        .denial
        .as_ref()
        .map(|(reason, message)| denied_result(&op_id, *reason, message.clone()));
    let decision = record.to_json();
    let approval = decided.approval.clone();
    let (o, w, r, id) = (
        runner.org_id.clone(),
        runner.id.clone(),
        run_id.clone(),
        op_id.clone(),
    );
    let recorded = state
        .db(move |s| {
            s.redecide_op(
                &Redecided {
                    org: &o,
                    runner: &w,
                    run: &r,
                    id: &id,
                    state: next_state,
                    decision: &decision,
                    result: result.as_ref(),
                    events: &events,
                    approval: approval.as_ref().map(|(rule, risk)| NewApproval {
                        id: &approval_id,
                        rule,
                        risk,
                        summary: &summary_json,
                        expires_ms: expires,
                    }),
                },
                now,
            )
        })
        .await?;
    if !recorded {
        return Err(not_held());
    }
    state.notify_run(&run_id);
    if next_state != OpState::Dispatched {
        return Ok(Json(ElementDecision::Held {
            state: next_state.as_str().to_owned(),
        }));
    }
    let dispatched =
        super::runner_api::dispatch_envelope(&state, &runner, &decided.record.to_json(), envelope)
            .await?;
    Ok(Json(ElementDecision::Act {
        envelope: Box::new(dispatched.0),
        secret_value: dispatched.1,
    }))
}

/// `decided`, turned into a refusal: the element shows one of the org's
/// secrets that its page was not given by this session.
fn refuse_shown_secret(mut decided: Decided) -> Decided {
    decided.record.decision = PolicyDecision::Deny;
    decided.approval = None;
    decided.state = OpState::Denied;
    decided.denial = Some((
        DenialReason::PolicyDenied,
        "the element shows one of the org's secrets, which this session did not fill into its \
         page: it is not acted on, nor shown to an approver"
            .into(),
    ));
    decided
}
