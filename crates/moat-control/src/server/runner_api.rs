//! What runners call: registration (with a bootstrap token or an
//! enrolment's token, `enrolments.rs`), then signed
//! requests to claim runs, take operations (each with a fresh capability),
//! report results and finish runs.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use moat_core::event_data::{
    OpFinished, RunDestroyed, RunnerJanitor, RunnerManifestRefreshed, RunnerRegistered,
    RunnerRejection, TeardownCheck,
};
use moat_core::{Envelope, Event, EventData, EventType, OpKind, SandboxMode, SignedManifest};
use moat_store::{
    ClaimLook, Kept, NewArtifact, OpResult as StoreOpResult, RunState, RunnerRow, stamp,
    typed_event,
};
use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::auth;
use super::auth::SignedRunner;
use super::error::{ApiError, ApiResult};
use super::manifests::{check_manifest, is_sha256, manifest_expiry};
use super::queues_api::DeliveredMessage;
use super::views::{inputs_with_content, manifest_view, run_view};
use super::wake::Topic;
use moat_api::ManifestView;
use moat_api::runner::{
    Claim, EventsBody, EventsRecorded, FinishBody, Heartbeat, Janitor, ManifestRefreshed, Next,
    Recorded, Registered, Registration, Released, Reported, ResultBody, RunEnd, ShellEnded,
    Teardown, TornDown,
};
use moat_core::lifecycle::{self, Lifetime};
use moat_core::op::BrowserStepArgs;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

use super::body::parse;

/// The most runs one runner may hold at once.
pub const MAX_SLOTS: i64 = 256;

/// Why a registration is refused, checked in this order.
fn registration_problem(
    state: &AppState,
    reg: &Registration,
    now: i64,
    build_allowed: bool,
    key_revoked: bool,
    current: Option<&str>,
) -> Option<(RunnerRejection, String)> {
    let m = &reg.signed_manifest.manifest;
    if let Err(problem) = check_manifest(state, &reg.signed_manifest) {
        return Some(problem);
    }
    if key_revoked {
        return Some((
            RunnerRejection::Revoked,
            "the manifest's signing key was revoked".into(),
        ));
    }
    if !build_allowed {
        return Some((
            RunnerRejection::UnknownRunnerHash,
            format!("runner build {} is not on the allowlist", reg.runner_hash),
        ));
    }
    if reg.environment != m.environment {
        return Some((
            RunnerRejection::WrongEnvironment,
            format!(
                "the runner says {:?}, its manifest {:?}",
                reg.environment, m.environment
            ),
        ));
    }
    if reg.version != m.runner_version {
        return Some((
            RunnerRejection::WrongVersion,
            format!(
                "runner version {:?}, manifest {:?}",
                reg.version, m.runner_version
            ),
        ));
    }
    match manifest_expiry(&reg.signed_manifest) {
        Ok(expires) if expires <= now => {
            return Some((
                RunnerRejection::ManifestExpired,
                format!("the manifest expired at {}", m.expires_at),
            ));
        }
        Ok(_) => {}
        Err(_) => {
            return Some((
                RunnerRejection::BadSignature,
                "the manifest's expiresAt is unreadable".into(),
            ));
        }
    }
    if m.policy_hash != state.config.policy.hash() {
        return Some((
            RunnerRejection::StalePolicy,
            "the manifest names a policy this control plane no longer serves".into(),
        ));
    }
    if current != Some(reg.signed_manifest.manifest_hash.as_str()) {
        return Some((
            RunnerRejection::StaleManifest,
            match current {
                Some(c) => format!("the current manifest is {c}"),
                None => "no manifest is published for this environment".into(),
            },
        ));
    }
    if let Some(extra) = reg.ops.iter().find(|op| !m.allowed_ops.contains(op)) {
        return Some((
            RunnerRejection::OpsBeyondManifest,
            format!("{} is not in the manifest's allowedOps", extra.as_str()),
        ));
    }
    if !m
        .sandbox_modes
        .iter()
        .any(|mode| mode.as_str() == reg.sandbox_mode)
    {
        return Some((
            RunnerRejection::OpsBeyondManifest,
            format!("sandbox mode {} is not in the manifest", reg.sandbox_mode),
        ));
    }
    if let Some(problem) = reg
        .host_id
        .as_deref()
        .map(moat_core::host::check_host_id)
        .and_then(Result::err)
        .or_else(|| {
            reg.labels
                .iter()
                .find_map(|(k, v)| moat_core::host::check_label(k, v).err())
        })
    {
        return Some((RunnerRejection::BadRequest, problem));
    }
    if reg.labels.len() > 32 {
        return Some((RunnerRejection::BadRequest, "at most 32 labels".into()));
    }
    if let Some(why) = state.config.host_minimum.shortfall(reg.host.as_ref()) {
        return Some((RunnerRejection::HostBelowMinimum, why));
    }
    if let Some(class) = reg
        .workload_classes
        .iter()
        .find(|c| !m.classes().contains(c))
    {
        return Some((
            RunnerRejection::OpsBeyondManifest,
            format!("workload class {class} is not in the manifest's workloadClasses"),
        ));
    }
    if !(1..=MAX_SLOTS).contains(&reg.slots) {
        return Some((
            RunnerRejection::BadRequest,
            format!("slots: from 1 to {MAX_SLOTS}, not {}", reg.slots),
        ));
    }
    if moat_core::sign::PublicKey::from_base64(&reg.public_key).is_err() {
        return Some((
            RunnerRejection::BadSignature,
            "publicKey is not a base64 Ed25519 key".into(),
        ));
    }
    None
}

/// The classes a registration offers: those it lists, `namespace` when it
/// lists none (a runner older than classes).
fn offered_classes(reg: &Registration) -> Vec<moat_core::WorkloadClass> {
    if reg.workload_classes.is_empty() {
        vec![moat_core::WorkloadClass::Namespace]
    } else {
        reg.workload_classes.clone()
    }
}

pub async fn register(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let now = state.now();
    let (org, enrolled, reg) = match auth::registration_token(&headers)? {
        auth::RegistrationToken::Bootstrap(token) => {
            // Spent before anything else: a token is good for one attempt.
            let org = state
                .db(move |s| s.spend_bootstrap_token(&token, now))
                .await?
                .ok_or_else(|| {
                    ApiError::unauthorized(
                        "the bootstrap token is unknown, expired or already used",
                    )
                })?;
            (org, None, parse::<Registration>(&body)?)
        }
        auth::RegistrationToken::Enrolment(token) => {
            // Checked before the token is: a refusal recorded in the org
            // then quotes a well-formed registration only.
            let reg: Registration = parse(&body)?;
            if !is_sha256(&reg.runner_hash) {
                return Err(ApiError::bad_request(
                    "runnerHash: 64 lower-case hex digits",
                ));
            }
            let (org, identity) = super::enrolments::vouch(&state, &token, &reg, now).await?;
            (org, Some(identity), reg)
        }
    };
    if !is_sha256(&reg.runner_hash) {
        return Err(ApiError::bad_request(
            "runnerHash: 64 lower-case hex digits",
        ));
    }
    let (o, hash, env, signer) = (
        org.clone(),
        reg.runner_hash.clone(),
        reg.signed_manifest.manifest.environment.clone(),
        reg.signed_manifest.signed_by.clone(),
    );
    let (build_allowed, key_revoked, current) = state
        .db(move |s| {
            Ok((
                s.runner_build_allowed(&o, &hash)?,
                s.signing_key_revoked(&o, &signer)?,
                s.current_manifest(&o, &env)?.map(|m| m.hash),
            ))
        })
        .await?;
    let subject = auth::Rejected::registration(&reg);
    if let Some((reason, message)) = registration_problem(
        &state,
        &reg,
        now,
        build_allowed,
        key_revoked,
        current.as_deref(),
    ) {
        return Err(auth::reject(&state, &org, reason, message, subject).await);
    }
    let runner = RunnerRow {
        id: moat_core::random::new_id("runner_"),
        org_id: org.clone(),
        runner_hash: reg.runner_hash.clone(),
        manifest_hash: reg.signed_manifest.manifest_hash.clone(),
        policy_hash: reg.signed_manifest.manifest.policy_hash.clone(),
        version: reg.version.clone(),
        environment: reg.environment.clone(),
        ops: serde_json::to_value(&reg.ops).unwrap_or(Value::Null),
        sandbox_mode: reg.sandbox_mode.clone(),
        boot_time: reg.boot_time.clone(),
        public_key: reg.public_key.clone(),
        registered_ms: now,
        seen_ms: now,
        slots: reg.slots,
        slots_used: 0,
        enrolment_id: enrolled.as_ref().map(|e| e.enrolment_id.clone()),
        classes: moat_core::WorkloadClass::mask(&offered_classes(&reg)),
        host_features: reg
            .host
            .as_ref()
            .and_then(|h| serde_json::to_string(h).ok()),
        host_id: reg.host_id.clone(),
        labels: (!reg.labels.is_empty())
            .then(|| serde_json::to_string(&reg.labels).ok())
            .flatten(),
        // (A runner's own figures: an absurd one only starves itself.)
        cpu_millis: reg
            .cpu_millis
            .map_or(0, |n| i64::try_from(n.min(MAX_RESERVATION)).unwrap_or(0)),
        memory_bytes: reg
            .memory_bytes
            .map_or(0, |n| i64::try_from(n.min(1 << 50)).unwrap_or(0)),
        draining: false,
        cpu_reserved: 0,
        memory_reserved: 0,
    };
    let sandbox_mode: SandboxMode = reg
        .sandbox_mode
        .parse()
        .map_err(|e| ApiError::bad_request(format!("sandboxMode: {e}")))?;
    let data = EventData::RunnerRegistered(RunnerRegistered {
        runner_id: runner.id.clone(),
        runner_hash: reg.runner_hash.clone(),
        manifest_hash: reg.signed_manifest.manifest_hash.clone(),
        policy_hash: reg.signed_manifest.manifest.policy_hash.clone(),
        environment: reg.environment.clone(),
        version: reg.version.clone(),
        ops: reg.ops.clone(),
        sandbox_mode,
        boot_time: reg.boot_time.clone(),
        slots: reg.slots,
        enrolment: enrolled,
        workload_classes: reg.workload_classes.clone(),
        host: reg.host.clone(),
        host_id: reg.host_id.clone(),
        labels: reg.labels.clone(),
        cpu_millis: reg.cpu_millis,
        memory_bytes: reg.memory_bytes,
    });
    let stored = runner.clone();
    state
        .db(move |s| {
            s.register_runner(&stored)?;
            s.append_events(&org, &[typed_event(data, "", now)])
        })
        .await?;
    let body = Registered {
        runner_id: runner.id,
        lease_ms: u64::try_from(state.config.lease.as_millis()).unwrap_or(u64::MAX),
        max_wait_ms: u64::try_from(super::MAX_WAIT.as_millis()).unwrap_or(u64::MAX),
        finish_takes_teardown: true,
        last_report_takes_claim: true,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Runner-side provenance (`runner.selected`, `.started`, `.policy.loaded`,
/// `.manifest.loaded`, `.manifest.refresh_failed`).
pub async fn events(
    State(state): State<Arc<AppState>>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<EventsRecorded>> {
    let EventsBody { mut events } = parse(&body)?;
    const ALLOWED: [EventType; 5] = [
        EventType::RunnerSelected,
        EventType::RunnerStarted,
        EventType::RunnerPolicyLoaded,
        EventType::RunnerManifestLoaded,
        EventType::RunnerManifestRefreshFailed,
    ];
    if events.len() > 100 {
        return Err(ApiError::bad_request("at most 100 events at once"));
    }
    for e in &mut events {
        if !ALLOWED.contains(&e.event_type) {
            return Err(ApiError::bad_request(format!(
                "a runner does not report {} here",
                e.event_type.as_str()
            )));
        }
        // Provenance is about the runner, never about a run.
        e.run_id = String::new();
        e.op_id = None;
        e.correlation_id = None;
        attribute(e, &runner)?;
    }
    let n = events.len();
    state
        .db(move |s| s.append_events(&runner.org_id, &events))
        .await?;
    Ok(Json(EventsRecorded { recorded: n as u64 }))
}

/// Stamps the runner's identity into an event it reports, which must be
/// of its type's shape (`moat_core::EventData`): a runner cannot put
/// free-form data into the org's ledger.
fn attribute(e: &mut Event, runner: &RunnerRow) -> ApiResult<()> {
    let Some(map) = e.data.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "{} event: data must be an object",
            e.event_type.as_str()
        )));
    };
    map.insert("runnerId".into(), runner.id.clone().into());
    map.insert("runnerHash".into(), runner.runner_hash.clone().into());
    map.insert("manifestHash".into(), runner.manifest_hash.clone().into());
    EventData::parse(e.event_type, &e.data).map_err(|err| {
        ApiError::bad_request(format!(
            "{} event: not of its type's shape: {err}",
            e.event_type.as_str()
        ))
    })?;
    Ok(())
}

/// What a runner's manifest says about its runs' time and size: its
/// lifetime and grace, and what each run reserves of the runner.
#[derive(Debug, Clone, Copy)]
pub struct ManifestTerms {
    pub life: Lifetime,
    pub grace: Duration,
    /// Millicores (0: no CPU limit, nothing reserved).
    pub cpu_millis: i64,
    pub memory_bytes: i64,
}

/// The most one run reserves of either figure (2^40: a thousand million
/// millicores, a tebibyte).
const MAX_RESERVATION: u64 = 1 << 40;

/// The runner's manifest terms, from the published record.
async fn terms(state: &Arc<AppState>, runner: &RunnerRow) -> ApiResult<ManifestTerms> {
    let key = (runner.org_id.clone(), runner.manifest_hash.clone());
    let known = |state: &AppState| {
        state
            .lifetimes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .copied()
    };
    if let Some(known) = known(state) {
        return Ok(known);
    }
    let (org, hash) = key.clone();
    let row = state
        .db(move |s| s.manifest(&org, &hash))
        .await?
        .ok_or_else(|| ApiError::forbidden("revoked", "the runner's manifest is not published"))?;
    let signed: SignedManifest =
        serde_json::from_str(&row.signed).map_err(|e| ApiError::internal(e.to_string()))?;
    let created = moat_core::time::parse_rfc3339(&signed.manifest.created_at)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let at = |ms: i64| std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    let limits = &signed.manifest.limits;
    // Bounded, so that sums of many runs' reservations never overflow.
    let bounded = |n: u64| i64::try_from(n.min(MAX_RESERVATION)).unwrap_or(0);
    let found = ManifestTerms {
        life: Lifetime {
            created,
            expires: at(row.expires_ms),
        },
        grace: Duration::from_millis(limits.timeout_ms),
        cpu_millis: limits.cpu_millis.map_or(0, bounded),
        memory_bytes: bounded(limits.memory_bytes),
    };
    let mut lifetimes = state
        .lifetimes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Manifests are few; a bound keeps a long-lived replica's memory flat.
    if lifetimes.len() >= 4096 {
        lifetimes.clear();
    }
    lifetimes.insert(key, found);
    Ok(found)
}

#[derive(Deserialize)]
pub struct WaitQuery {
    wait_ms: Option<u64>,
}

pub async fn claim(
    State(state): State<Arc<AppState>>,
    Query(q): Query<WaitQuery>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Response> {
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(0));
    Ok(
        match claim_for(&state, &runner, wait, Asked::Alone).await? {
            Some(claim) => Json(claim).into_response(),
            None => StatusCode::NO_CONTENT.into_response(),
        },
    )
}

/// How a claim was asked for: what it says when the runner may claim
/// nothing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// `POST /v1/runner/claim`: refused, and an expired manifest's refusal
    /// recorded.
    Alone,
    /// With a run's last report (`thenClaimMs`): nothing claimed, nothing
    /// recorded; the report stands, and the runner's own claim after it
    /// is refused.
    WithReport,
}

/// The oldest queued run `runner` may take, claimed for it, waiting up to
/// `wait` (at most [`super::MAX_WAIT`]) for one: `None` if none came.
async fn claim_for(
    state: &Arc<AppState>,
    runner: &RunnerRow,
    wait: Duration,
    asked: Asked,
) -> ApiResult<Option<Claim>> {
    let terms = terms(state, runner).await?;
    let (life, grace) = (terms.life, terms.grace);
    if runner.draining {
        if asked == Asked::WithReport {
            return Ok(None);
        }
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "draining",
            "this runner is draining: it finishes the runs it holds and claims nothing new",
        ));
    }
    let deadline = match lifecycle::claim(state.config.clock.now(), &life, grace, false) {
        Ok(deadline) => deadline,
        Err(_) if asked == Asked::WithReport => return Ok(None),
        Err(stop) => {
            return Err(auth::reject(
                state,
                &runner.org_id,
                stop.into(),
                "no new claims on an expired manifest".into(),
                auth::Rejected::runner(runner),
            )
            .await);
        }
    };
    let clock = Arc::clone(&state.config.clock);
    let lease = state.config.lease.as_millis() as i64;
    let r = runner.clone();
    let placing = Arc::clone(state);
    let probe = move |s: &moat_store::Store| {
        let ask = moat_store::ClaimAsk {
            org: &r.org_id,
            environment: &r.environment,
            runner: &r.id,
            manifest_hash: &r.manifest_hash,
            now: clock.now_ms(),
            lease_ms: lease,
            cpu_millis: terms.cpu_millis,
            memory_bytes: terms.memory_bytes,
            oldest_only: placing.config.placement.places_anywhere(),
        };
        let look = s.claim(&ask, &mut |candidate| {
            Ok(place(&placing.config.placement, candidate))
        })?;
        Ok(match look {
            ClaimLook::Nothing => None,
            found => Some(found),
        })
    };
    // The looks again below stay within the one long poll's bound.
    let waited = tokio::time::Instant::now() + wait.min(super::MAX_WAIT);
    let mut again = LOCKED_FIRST_RETRY;
    let claimed = loop {
        let wait = waited.saturating_duration_since(tokio::time::Instant::now());
        let topic = Topic::Queue {
            org: runner.org_id.clone(),
            environment: runner.environment.clone(),
        };
        match state.wait_for(wait, topic, probe.clone()).await? {
            Some(ClaimLook::Took(claimed)) => break Some(*claimed),
            // A run it could take was locked for a moment (its finish
            // being asked as it was queued): its queuing's wake-up was
            // this claim's turn, and no other change may follow, so it
            // looks again itself, soon, then less often.
            Some(ClaimLook::Locked) if tokio::time::Instant::now() + again < waited => {
                tokio::time::sleep(again).await;
                again = (again * 2).min(LOCKED_LAST_RETRY);
            }
            _ => break None,
        }
    };
    let Some(moat_store::Claimed {
        run,
        more_queued,
        finish_now,
    }) = claimed
    else {
        return Ok(None);
    };
    state.notify_run(&run.id);
    if more_queued {
        state.pass_claim_turn(&runner.org_id, &runner.environment);
    }
    match claim_of(state, &run, finish_now, deadline).await {
        Ok(claim) => Ok(Some(claim)),
        Err(e) => {
            // The run is this runner's in the store, but it will never
            // hear of it: its claim lapses now, not a lease later, as a
            // lost lease does (its attempt counted, so a run that can
            // never be handed over is dead-lettered in the end, not
            // claimed for ever; the price: a database fault that hits
            // only this read costs the run an attempt at once, where a
            // lapse took a lease).
            lapse_now(state, runner, &run.id, run.attempts).await;
            Err(e)
        }
    }
}

/// What a runner is told of run `run` it has just claimed: the run, its
/// inputs' bytes, and by when it must finish.
async fn claim_of(
    state: &Arc<AppState>,
    run: &moat_store::RunRow,
    finish_now: bool,
    deadline: std::time::SystemTime,
) -> ApiResult<Claim> {
    let stored: Vec<String> = run
        .inputs
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|input| input["sha256"].as_str().map(str::to_owned))
        .collect();
    // A run without stored inputs needs no second trip to the store.
    let mut blobs = std::collections::HashMap::new();
    if !stored.is_empty() {
        let org = run.org_id.clone();
        blobs = state
            .db(move |s| {
                let mut blobs = std::collections::HashMap::new();
                for sha in stored {
                    if let Some(bytes) = s.artifact_bytes(&org, &sha)? {
                        blobs.insert(sha, bytes);
                    }
                }
                Ok(blobs)
            })
            .await?;
    }
    let inputs = inputs_with_content(run, |sha| blobs.get(sha).cloned());
    Ok(Claim {
        run: run_view(run)?,
        inputs: inputs?,
        finish_by: moat_core::time::stamp(deadline),
        // What its first `next` would answer at once: the lease was just
        // taken, and the run is not near its manifest's end (the deadline
        // above was checked).
        next: finish_now.then_some(Next::Finish),
    })
}

/// Run `run`, claimed for `runner` but not handed over, lapses now (see
/// [`claim_for`]) and a waiting claim is woken for it; a failure is only
/// logged: its lease then lapses in its own time.
async fn lapse_now(state: &Arc<AppState>, runner: &RunnerRow, run: &str, attempt: i64) {
    let now = state.now();
    let (org, id, run_id) = (runner.org_id.clone(), runner.id.clone(), run.to_owned());
    match state
        .db(move |s| s.lapse_claim(&org, &id, &run_id, attempt, now))
        .await
    {
        Ok(lapsed) => {
            state.notify_run(run);
            if lapsed == Some(RunState::Queued) {
                state.notify_queue(&runner.org_id, &runner.environment);
            }
        }
        Err(e) => eprintln!(
            "moat serve: runner {}: run {run} was claimed but not handed over, and could \
             not be given back before its lease lapses: {}",
            runner.id, e.message
        ),
    }
}

/// How soon a claim that found a takeable run locked looks again, at first
/// and at most (doubling in between).
const LOCKED_FIRST_RETRY: Duration = Duration::from_millis(5);
const LOCKED_LAST_RETRY: Duration = Duration::from_millis(500);

/// The placement policy's answer for one queued run and the claiming
/// runner's host.
fn place(
    engine: &crate::placement::PlacementEngine,
    ask: &moat_store::PlacementAsk<'_>,
) -> Option<moat_store::PlacementRefusal> {
    let labels: std::collections::BTreeMap<String, String> =
        match ask.runner.and_then(|w| w.labels.as_deref()) {
            None => Default::default(),
            Some(text) => match serde_json::from_str(text) {
                Ok(labels) => labels,
                // A rule on a label must not be sidestepped by a row it
                // cannot read.
                Err(e) => {
                    return Some(moat_store::PlacementRefusal {
                        reason: format!("placement_waiting: the runner's stored labels: {e}"),
                        policies: Vec::new(),
                    });
                }
            },
        };
    let classes = moat_core::WorkloadClass::from_mask(ask.run.needs_classes);
    let answer = engine.place(&crate::placement::PlacementRequest {
        org: ask.org_name,
        run: &ask.run.id,
        environment: &ask.run.environment,
        runner: ask.runner.map_or("", |w| w.id.as_str()),
        host: ask.runner.and_then(|w| w.host_id.as_deref()).unwrap_or(""),
        labels: &labels,
        classes: &classes,
        tenants: ask.tenants,
    });
    match answer {
        crate::placement::Placement::Placed => None,
        crate::placement::Placement::Refused { reason, policies } => {
            Some(moat_store::PlacementRefusal { reason, policies })
        }
    }
}

/// The next thing for the runner to do in a run it holds.
pub async fn next(
    State(state): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    Query(q): Query<WaitQuery>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Response> {
    let now = state.now();
    let lease = state.config.lease.as_millis() as i64;
    let ManifestTerms { life, grace, .. } = terms(&state, &runner).await?;
    let st = Arc::clone(&state);
    let r = runner.clone();
    let id = run_id.clone();
    // An operation first: most wake-ups are one queued, handed over in
    // one statement.
    let probe = move |s: &moat_store::Store| {
        let now = st.now();
        if let Some(op) = s.dispatch_op(&r.org_id, &r.id, &id, now)? {
            return Ok(Some(Ok(op)));
        }
        match s.run_with_open_ops(&r.org_id, &id)? {
            Some((run, _)) if run.state.is_final() => Ok(Some(Err(Next::Ended))),
            Some((run, 0)) if run.finish_wanted => Ok(Some(Err(Next::Finish))),
            None => Ok(Some(Err(Next::Ended))),
            _ => Ok(None),
        }
    };
    // Taken before the first look: a change after it wakes the wait.
    let changes = state.watch(Topic::Run(run_id.clone()));
    // One trip to the store: the lease renewed (with the count of open
    // ops the first look needs), then the first look.
    let (org, rid, run) = (runner.org_id.clone(), runner.id.clone(), run_id.clone());
    let clock = state.config.clock.now();
    let first = state
        .db(move |s| {
            let Some((held, open)) = s.renew_lease_counting(&org, &rid, &run, now, lease)? else {
                return Ok(First::LeaseLost);
            };
            if let Err(stop) = lifecycle::in_flight(clock, &life, grace, false) {
                return Ok(First::Expired(held.id, stop));
            }
            // Nothing open (as the renewal counted): nothing to hand over.
            if open > 0
                && let Some(op) = s.dispatch_op(&org, &rid, &run, now)?
            {
                return Ok(First::Looked(Some(Ok(op))));
            }
            // As `probe` decides, from the run as the renewal left it: an
            // op queued or answered since wakes the wait below.
            Ok(First::Looked(if held.state.is_final() {
                Some(Err(Next::Ended))
            } else if open == 0 && held.finish_wanted {
                Some(Err(Next::Finish))
            } else {
                None
            }))
        })
        .await?;
    let found = match first {
        First::LeaseLost => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "lease_lost",
                format!("this runner no longer holds run {run_id}"),
            ));
        }
        First::Expired(id, stop) => {
            let org = runner.org_id.clone();
            state
                .db(move |s| s.force_end_run(&org, &id, RunState::DeadLettered, stop.as_str(), now))
                .await?;
            state.notify_run(&run_id);
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                stop.as_str(),
                "the run outlived its manifest's expiry plus grace",
            ));
        }
        First::Looked(Some(found)) => Some(found),
        First::Looked(None) => {
            let wait = Duration::from_millis(q.wait_ms.unwrap_or(0));
            state.wait_after(changes, wait, false, probe).await?
        }
    };
    match found {
        None => Ok(StatusCode::NO_CONTENT.into_response()),
        Some(Err(what)) => Ok(Json(what).into_response()),
        // Nobody waits for an op to be dispatched (an agent waits for its
        // result): the change wakes nobody.
        Some(Ok(op)) => match hand_over(&state, &runner, &run_id, &op, now).await {
            Ok(next) => Ok(Json(next).into_response()),
            // Marked dispatched, it would be handed over again at every
            // ask and fail the same way until the run expired: it fails
            // now, saying why (a database that was busy is asked again).
            Err(e) if e.reason != "store_unavailable" => {
                fail_dispatched(&state, &runner, &run_id, &op.id, &e.message, now).await?;
                Err(e)
            }
            Err(e) => Err(e),
        },
    }
}

/// What a runner's ask for its run's next step found on its first trip to
/// the store.
enum First<T> {
    /// The runner no longer holds the run.
    LeaseLost,
    /// The run outlived its manifest (the run, why).
    Expired(String, lifecycle::Stop),
    /// The lease renewed, and what the first look found.
    Looked(Option<T>),
}

/// Operation `op`, just marked dispatched to `runner`, as the runner takes
/// it: with its capability and what travels beside it.
async fn hand_over(
    state: &Arc<AppState>,
    runner: &RunnerRow,
    run_id: &str,
    op: &moat_store::OpRow,
    now: i64,
) -> ApiResult<Next> {
    let envelope: Envelope = serde_json::from_value(op.envelope.clone())
        .map_err(|e| ApiError::internal(format!("stored envelope: {e}")))?;
    let (envelope, secret_value) = dispatch_envelope(state, runner, &op.decision, envelope).await?;
    let mut tool_token = None;
    if let Some(tools) = op.decision.get("toolToken").filter(|t| t.is_object()) {
        // Good for this operation only: until its timeout (plus a
        // moment), and not at all once its result is in.
        let timeout = envelope.args["timeoutMs"]
            .as_u64()
            .or(envelope.timeout_ms)
            .unwrap_or(30_000)
            .min(MAX_TOOL_TOKEN_MS);
        let token = moat_core::random::new_id("moat_tt_");
        let row = moat_store::ToolTokenRow {
            org_id: runner.org_id.clone(),
            run_id: run_id.to_owned(),
            op_id: op.id.clone(),
            tools: tools.clone(),
            expires_ms: now
                .saturating_add(i64::try_from(timeout).unwrap_or(i64::MAX))
                .saturating_add(5_000),
        };
        let hash = moat_core::hash::sha256_hex(token.as_bytes());
        state.db(move |s| s.put_tool_token(&hash, &row)).await?;
        tool_token = Some(token);
    }
    Ok(Next::Op {
        envelope: Box::new(envelope),
        tool_token,
        secret_value,
    })
}

/// Records operation `op` of `run` as failed with `message` (and its
/// `op.finished` event), as if its runner had reported it so.
async fn fail_dispatched(
    state: &Arc<AppState>,
    runner: &RunnerRow,
    run: &str,
    op: &str,
    message: &str,
    now: i64,
) -> ApiResult<()> {
    let message = format!("the control plane could not hand the operation over: {message}");
    let result = serde_json::to_value(moat_core::OpResult::error(op, message.clone()))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut finished = typed_event(
        EventData::OpFinished(OpFinished {
            status: moat_core::OpStatus::Error,
            runner_id: runner.id.clone(),
            reason: None,
            artifacts: None,
            profile: None,
            message: Some(message),
        }),
        run,
        now,
    );
    finished.op_id = Some(op.to_owned());
    let (org, w, r, o) = (
        runner.org_id.clone(),
        runner.id.clone(),
        run.to_owned(),
        op.to_owned(),
    );
    state
        .db(move |s| {
            s.finish_op(
                &StoreOpResult {
                    org: &org,
                    runner: &w,
                    run: &r,
                    op: &o,
                    succeeded: false,
                    result: &result,
                    events: &[finished],
                    artifacts: &[],
                    held: &[],
                    heads: &[],
                },
                now,
            )
        })
        .await?;
    state.notify_run(run);
    Ok(())
}

/// `envelope` with the capability its decision grants (in the class its
/// program runs in; for an acting browser step decided on its element,
/// bound to that element), and what travels beside it: the value of the
/// secret a `fill_secret` decided on its element fills in.
pub(super) async fn dispatch_envelope(
    state: &Arc<AppState>,
    runner: &RunnerRow,
    decision: &Value,
    mut envelope: Envelope,
) -> ApiResult<(Envelope, Option<zeroize::Zeroizing<String>>)> {
    let kind = OpKind::parse(&envelope.op).ok_or_else(|| ApiError::internal("stored op kind"))?;
    let class = dispatch_class(state, runner, decision, &envelope).await?;
    let element = match decision.get("element") {
        None | Some(Value::Null) => None,
        Some(facts) => Some(
            serde_json::from_value::<moat_core::element::ElementFacts>(facts.clone()).map_err(
                |e| ApiError::internal(format!("the operation's recorded element: {e}")),
            )?,
        ),
    };
    let capability = state
        .config
        .policy
        .grant(
            (
                &envelope,
                kind,
                class,
                element
                    .as_ref()
                    .map(moat_core::element::ElementFacts::fingerprint),
            ),
            &state.config.key,
            state.config.clock.now(),
            state.config.capability_ttl,
            moat_core::random::new_id(""),
        )
        .map_err(|e| ApiError::internal(e.to_string()))?;
    envelope.capability = Some(capability);
    // Only once decided on where it goes does a secret leave the vault.
    let secret_value = match element {
        Some(_) => fill_secret_value(state, &runner.org_id, &envelope).await?,
        None => None,
    };
    Ok((envelope, secret_value))
}

/// The value of the org secret a `browser_step` `fill_secret` names, to
/// travel beside the envelope to the runner holding the run (none: the org
/// has no such secret, and the shell fails the step saying so).
async fn fill_secret_value(
    state: &Arc<AppState>,
    org: &str,
    envelope: &Envelope,
) -> ApiResult<Option<zeroize::Zeroizing<String>>> {
    // Every dispatch passes here: only a fill_secret's arguments are read.
    if envelope.op != "browser_step" || envelope.args["action"] != "fill_secret" {
        return Ok(None);
    }
    let name = match serde_json::from_value::<BrowserStepArgs>(envelope.args.clone()) {
        Ok(BrowserStepArgs::FillSecret { secret, .. }) => secret,
        _ => return Ok(None),
    };
    let o = org.to_owned();
    let sealed = state.db(move |s| s.secrets(&o)).await?;
    let Some(one) = sealed.into_iter().find(|s| s.name == name) else {
        return Ok(None);
    };
    let mut opened = super::secrets::open_secrets(state, org, std::slice::from_ref(&one))?;
    Ok(opened.pop().map(|(_, value)| value))
}

/// The class an operation's decision put its program in (none recorded:
/// `namespace`, as for every decision made before classes). A record that
/// names a class this build does not know grants nothing.
fn decided_class(decision: &Value) -> ApiResult<moat_core::WorkloadClass> {
    match decision.get("class") {
        None | Some(Value::Null) => Ok(moat_core::WorkloadClass::Namespace),
        Some(class) => serde_json::from_value(class.clone())
            .map_err(|e| ApiError::internal(format!("the operation's recorded class: {e}"))),
    }
}

/// The class an operation's program is dispatched in: the decision's, or
/// the stronger class the policy gives it under the runner's manifest when
/// it was decided under another (before the run was claimed, say).
async fn dispatch_class(
    state: &Arc<AppState>,
    runner: &RunnerRow,
    decision: &Value,
    envelope: &Envelope,
) -> ApiResult<moat_core::WorkloadClass> {
    let class = decided_class(decision)?;
    if decision["manifestHash"].as_str() == Some(runner.manifest_hash.as_str()) {
        return Ok(class);
    }
    let (o, h) = (runner.org_id.clone(), runner.manifest_hash.clone());
    let (org_name, manifest) = state
        .db(move |s| Ok((s.org_name(&o)?.unwrap_or_default(), s.manifest(&o, &h)?)))
        .await?;
    let Some(manifest) =
        manifest.and_then(|m| serde_json::from_str::<SignedManifest>(&m.signed).ok())
    else {
        return Ok(class);
    };
    Ok(
        match crate::decide::reclassify(
            &state.config.policy,
            &org_name,
            &runner.id,
            &manifest,
            envelope,
        ) {
            Some(again) if again.satisfies(class) => again,
            _ => class,
        },
    )
}

/// The longest a tool token lives: an hour.
const MAX_TOOL_TOKEN_MS: u64 = 3_600_000;

/// Keeps the lease of a run while a long operation runs.
pub async fn heartbeat(
    State(state): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Json<Heartbeat>> {
    let now = state.now();
    let lease = state.config.lease.as_millis() as i64;
    let (org, rid, run) = (runner.org_id.clone(), runner.id.clone(), run_id.clone());
    let held = state
        .db(move |s| s.renew_lease(&org, &rid, &run, now, lease))
        .await?;
    match held {
        Some(run) => Ok(Json(Heartbeat {
            lease_until: stamp(run.lease_until_ms),
        })),
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "lease_lost",
            format!("this runner no longer holds run {run_id}"),
        )),
    }
}

/// Most events a runner may report with one result: a sandbox records up
/// to 10,000 connections to its ports (`network.ingress`) besides the rest.
pub(super) const MAX_RESULT_EVENTS: usize = 12_000;

/// The events a shell records about an operation.
const SHELL_EVENTS: [EventType; 18] = [
    EventType::CapabilityRequested,
    EventType::CapabilityGranted,
    EventType::CapabilityDenied,
    EventType::SandboxExecStarted,
    EventType::SandboxExecDenied,
    EventType::SandboxExecFinished,
    EventType::SandboxSyscallDenied,
    EventType::SandboxViolation,
    EventType::SandboxDangerFullAccess,
    EventType::WorkerBinding,
    EventType::ArtifactCreated,
    EventType::ArtifactPromoted,
    EventType::ArtifactRejected,
    EventType::ProcessTimeout,
    EventType::NetworkDenied,
    EventType::NetworkRequest,
    EventType::NetworkIngress,
    EventType::PathDenied,
];

/// The events a shell records as its run ends (the browser sessions the
/// run left open, closed then).
const END_EVENTS: [EventType; 8] = [
    EventType::SandboxExecStarted,
    EventType::SandboxExecDenied,
    EventType::SandboxExecFinished,
    EventType::SandboxSyscallDenied,
    EventType::SandboxViolation,
    EventType::ProcessTimeout,
    EventType::NetworkDenied,
    EventType::NetworkRequest,
];

/// A shell's event as a runner reports it: only what a shell records (a
/// runner cannot write run, approval, manifest or runner events), of its
/// type's shape, attributed to the runner.
pub(super) fn check_shell_event(e: &mut Event, runner: &RunnerRow) -> ApiResult<()> {
    if !SHELL_EVENTS.contains(&e.event_type) {
        return Err(ApiError::bad_request(format!(
            "a runner does not report {} from its shell",
            e.event_type.as_str()
        )));
    }
    // Only the control plane settles an approval.
    if e.data.get("approvalId").is_some()
        && matches!(
            e.event_type,
            EventType::ArtifactPromoted | EventType::ArtifactRejected
        )
    {
        return Err(ApiError::bad_request(format!(
            "a runner does not report {} with an approval",
            e.event_type.as_str()
        )));
    }
    attribute(e, runner)
}

pub async fn result(
    State(state): State<Arc<AppState>>,
    Path((run_id, op_id)): Path<(String, String)>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<Recorded>> {
    let ResultBody {
        result,
        mut events,
        artifacts,
        volumes,
    } = parse(&body)?;
    let heads: Vec<moat_store::NewHead> = volumes
        .into_iter()
        .map(|h| moat_store::NewHead {
            volume: h.volume.into_string(),
            snapshot: h.snapshot.into_string(),
        })
        .collect();
    if result.id != op_id {
        return Err(ApiError::bad_request(
            "the result's id is not this operation's",
        ));
    }
    let mut blobs: Vec<NewArtifact> = Vec::with_capacity(artifacts.len());
    for a in artifacts {
        let data = B64.decode(a.content_base64.as_bytes()).map_err(|_| {
            ApiError::bad_request(format!("artifact {}: contentBase64 is not base64", a.label))
        })?;
        if moat_core::hash::sha256_hex(&data) != a.sha256 {
            return Err(ApiError::bad_request(format!(
                "artifact {}: content does not hash to {}",
                a.label, a.sha256
            )));
        }
        if blobs
            .iter()
            .any(|b| b.kind == a.kind && b.label == a.label && b.sha256 == a.sha256)
        {
            // One file, one artifact: a second copy would be stored past
            // the export boundary's decision on the first.
            return Err(ApiError::bad_request(format!(
                "artifact {} reported twice",
                a.label
            )));
        }
        blobs.push(NewArtifact {
            sha256: a.sha256,
            kind: a.kind,
            label: a.label,
            data,
            kept: Kept::Database,
        });
    }
    let now = state.now();
    if events.len() > MAX_RESULT_EVENTS {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_RESULT_EVENTS} events with one result"
        )));
    }
    for e in &mut events {
        check_shell_event(e, &runner)?;
        // A runner speaks only for the run and operation it reports on.
        e.run_id = run_id.clone();
        e.op_id = Some(op_id.clone());
    }
    let succeeded = result.status == moat_core::OpStatus::Ok;
    let result_json =
        serde_json::to_value(&result).map_err(|e| ApiError::internal(e.to_string()))?;
    let judging = Judging {
        state: Arc::clone(&state),
        runner,
        run_id: run_id.clone(),
        op_id: op_id.clone(),
        result,
        result_json,
        events,
        blobs,
        now,
    };
    let (org, changed, oid) = (judging.runner.org_id.clone(), run_id.clone(), op_id.clone());
    let path = format!("/v1/runner/runs/{changed}/ops/{oid}/result");
    let moves_heads = !heads.is_empty();
    let asker = judging.runner.clone();
    // Promoted files kept in the database: judged, recorded and, for a
    // queue's delivery, its message looked up in one trip to the store.
    // Kept elsewhere, they are written there between judging and
    // recording (see `keep_promoted`).
    let (recorded, result_json, delivery) = if state.config.outputs.in_database() {
        state
            .db(move |s| {
                let judged = match judging.judge(s)? {
                    Ok(judged) => judged,
                    Err(e) => return Ok(Err(e)),
                };
                judged.record(s, succeeded, &heads, now).map(Ok)
            })
            .await??
    } else {
        let mut judged = state.db(move |s| judging.judge(s)).await??;
        keep_promoted(&state, &mut judged.blobs).await?;
        state
            .db(move |s| judged.record(s, succeeded, &heads, now))
            .await?
    };
    // A head the run may not move (not its volume, not written by it, a
    // snapshot not stored for that volume) is refused and kept on record.
    let recorded = match recorded.map_err(ApiError::from) {
        Err(e)
            if moves_heads && matches!(e.status, StatusCode::NOT_FOUND | StatusCode::CONFLICT) =>
        {
            return Err(super::refusals::volume_not_held(&state, &asker, "POST", path, e).await);
        }
        other => other?,
    };
    state.notify_run(&changed);
    // A queue's delivery: its result settles the message.
    super::queues_api::settle(&state, &org, &changed, delivery, &result_json, succeeded).await?;
    Ok(Json(Recorded { recorded }))
}

/// A runner's report on an operation, as it arrived.
struct Judging {
    state: Arc<AppState>,
    runner: RunnerRow,
    run_id: String,
    op_id: String,
    result: moat_core::OpResult,
    result_json: Value,
    events: Vec<Event>,
    blobs: Vec<NewArtifact>,
    now: i64,
}

/// A report judged: what is recorded of it.
struct Judged {
    runner: RunnerRow,
    run_id: String,
    op_id: String,
    result_json: Value,
    events: Vec<Event>,
    blobs: Vec<NewArtifact>,
    held: Vec<moat_store::HeldExport>,
}

impl Judging {
    /// The report with the org's secrets out of it and the export
    /// boundary's decisions made (`Err` inside: the report is refused;
    /// outside: the store failed).
    fn judge(self, s: &moat_store::Store) -> Result<ApiResult<Judged>, moat_store::StoreError> {
        let Judging {
            state: st,
            runner,
            run_id,
            op_id,
            result,
            mut result_json,
            mut events,
            mut blobs,
            now,
        } = self;
        // No secret of the org is kept, whatever a program printed or
        // wrote (read in the same trip to the store as the write).
        let (org_name, sealed) = s.org_name_and_secrets(&runner.org_id)?;
        let org_name = org_name.unwrap_or_default();
        let secrets = match super::secrets::open_secrets(&st, &runner.org_id, &sealed) {
            Ok(secrets) => secrets,
            Err(e) => return Ok(Err(e)),
        };
        // Before the scrub: a promoted file holding a secret is
        // rejected whole, not kept scrubbed; then the policy decides
        // what may leave.
        let mut report = super::quarantine::Report {
            result: &mut result_json,
            events: &mut events,
            blobs: &mut blobs,
        };
        super::quarantine::reject_secrets(&secrets, &mut report);
        let scrubber = crate::tools::Scrubber::new(secrets);
        let held = super::quarantine::decide(
            &super::quarantine::Deciding {
                policy: &st.config.policy,
                org_name: &org_name,
                runner: &runner,
                run: &run_id,
                op: &op_id,
                now,
                approval_ttl_ms: i64::try_from(st.config.approval_ttl.as_millis())
                    .unwrap_or(i64::MAX),
            },
            &mut report,
        );
        scrub_report(&scrubber, &mut result_json, &mut events, &mut blobs);
        let artifacts = result_json["artifacts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x["sha256"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let data = EventData::OpFinished(OpFinished {
            status: result.status,
            runner_id: runner.id.clone(),
            reason: result.reason,
            artifacts: Some(artifacts),
            profile: None,
            message: None,
        });
        let mut finished = typed_event(data, &run_id, now);
        finished.op_id = Some(op_id.clone());
        events.push(finished);
        Ok(Ok(Judged {
            runner,
            run_id,
            op_id,
            result_json,
            events,
            blobs,
            held,
        }))
    }
}

/// What recording a judged report gave: recorded now (`false`: before;
/// `Err`: the store refused it), the recorded result, and the queue
/// message its run delivers (when recorded now).
type Recording = (
    Result<bool, moat_store::StoreError>,
    Value,
    Option<DeliveredMessage>,
);

impl Judged {
    /// Records the judged report, once; see [`Recording`].
    fn record(
        self,
        s: &moat_store::Store,
        succeeded: bool,
        heads: &[moat_store::NewHead],
        now: i64,
    ) -> Result<Recording, moat_store::StoreError> {
        let recorded = s.finish_op(
            &StoreOpResult {
                org: &self.runner.org_id,
                runner: &self.runner.id,
                run: &self.run_id,
                op: &self.op_id,
                succeeded,
                result: &self.result_json,
                events: &self.events,
                artifacts: &self.blobs,
                held: &self.held,
                heads,
            },
            now,
        );
        let delivery = match &recorded {
            Ok(true) => super::queues_api::delivery_of(s, &self.runner.org_id, &self.run_id)?,
            _ => None,
        };
        Ok((recorded, self.result_json, delivery))
    }
}

/// Writes each promoted file into the trusted output store, before the
/// transaction that records it: a store that cannot take it fails the
/// result with 503, which the runner sends again.
async fn keep_promoted(state: &AppState, blobs: &mut [NewArtifact]) -> ApiResult<()> {
    let outputs = &state.config.outputs;
    if outputs.in_database() {
        return Ok(());
    }
    for blob in blobs.iter_mut().filter(|b| b.kind == "export") {
        outputs
            .put(&blob.sha256, &blob.data)
            .await
            .map_err(super::error::outputs_unavailable)?;
        blob.kept = Kept::Outputs;
    }
    Ok(())
}

/// Every known secret out of a runner's report; an artifact that held one
/// is kept scrubbed, under its new hash, and the report names that hash.
fn scrub_report(
    scrubber: &crate::tools::Scrubber,
    result: &mut Value,
    events: &mut [moat_core::Event],
    blobs: &mut [NewArtifact],
) {
    if scrubber.is_empty() {
        return;
    }
    scrubber.json(result);
    for e in events.iter_mut() {
        scrubber.json(&mut e.data);
    }
    for blob in blobs {
        // A label can be a program's file name.
        blob.label = scrubber.text(&blob.label);
        if let Some(clean) = scrubber.bytes(&blob.data) {
            let sha = moat_core::hash::sha256_hex(&clean);
            let old = std::mem::replace(&mut blob.sha256, sha.clone());
            blob.data = clean;
            crate::tools::replace_text(result, &old, &sha);
            for e in events.iter_mut() {
                crate::tools::replace_text(&mut e.data, &old, &sha);
            }
        }
    }
}

pub async fn finish(
    State(state): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<Reported>> {
    let FinishBody {
        state: end,
        error,
        mut events,
        teardown,
        then_claim_ms,
    } = parse(&body)?;
    let end = match end {
        RunEnd::Succeeded => RunState::Succeeded,
        RunEnd::Failed => RunState::Failed,
    };
    check_closing(&mut events, &runner, &run_id, "with a run's end")?;
    let now = state.now();
    let torn_down = match teardown {
        Some(Teardown { checks }) => {
            check_teardown(&checks)?;
            Some(destroyed_event(&runner, &run_id, checks, now))
        }
        None => None,
    };
    let run = run_id.clone();
    let st = Arc::clone(&state);
    let held_by = runner.clone();
    let finished = state
        .db(move |s| {
            let runner = held_by;
            // What the run's end closed (browser sessions left open) is
            // recorded while the run is this runner's, with its end in one
            // transaction: a finish sent again records nothing twice (a
            // teardown sent with it is recorded again, as a teardown
            // report sent again is).
            // With nothing to close, no read: the end checks the holder.
            let held = !events.is_empty()
                && match file_closing(s, &st, &runner, &run, &mut events)? {
                    Ok(held) => held,
                    Err(e) => return Ok(Err(e)),
                };
            let (org, closing) = (&runner.org_id, if held { &events[..] } else { &[] });
            let end = (end, error.as_deref());
            let Some(torn_down) = &torn_down else {
                return s
                    .finish_run(org, &runner.id, &run, end, closing, now)
                    .map(Ok);
            };
            // Its teardown is recorded as `destroyed` records it: for a
            // run of the org, whoever holds it now.
            match s.finish_torn_down_run(org, &runner.id, &run, end, closing, torn_down, now)? {
                Some(finished) => Ok(Ok(finished)),
                None => Ok(Err(ApiError::not_found(format_args!("run {run}")))),
            }
        })
        .await??;
    state.notify_run(&run_id);
    let claim = claim_after(&state, &runner, &run_id, then_claim_ms).await;
    Ok(Json(Reported {
        recorded: finished,
        claim,
    }))
}

/// The claim a run's last report asked for (`then_claim_ms`), made once
/// the report is recorded: what it meets (a store error, nothing queued in
/// time) is only its own answer, never the report's.
async fn claim_after(
    state: &Arc<AppState>,
    runner: &RunnerRow,
    run_id: &str,
    then_claim_ms: Option<u64>,
) -> Option<Box<Claim>> {
    let wait = Duration::from_millis(then_claim_ms?);
    match claim_for(state, runner, wait, Asked::WithReport).await {
        Ok(claim) => claim.map(Box::new),
        Err(e) => {
            eprintln!(
                "moat serve: runner {}: the claim after run {run_id}'s last report: {}",
                runner.id, e.message
            );
            None
        }
    }
}

/// `POST /v1/runner/runs/{run}/shell-ended`: what a run's shell recorded as
/// it ended between operations (a refreshed manifest takes over in a new
/// shell; a draining runner gives the run back), closing the browser
/// sessions it held: recorded as a finish's are.
pub async fn shell_ended(
    State(state): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<Recorded>> {
    let ShellEnded { mut events } = parse(&body)?;
    check_closing(&mut events, &runner, &run_id, "as a shell ends")?;
    let st = Arc::clone(&state);
    let run = run_id.clone();
    let recorded = state
        .db(move |s| {
            let held = match file_closing(s, &st, &runner, &run, &mut events)? {
                Ok(held) => held,
                Err(e) => return Ok(Err(e)),
            };
            if held && !events.is_empty() {
                s.append_events(&runner.org_id, &events)?;
            }
            Ok(Ok(held))
        })
        .await??;
    if !recorded {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "lease_lost",
            format!("this runner no longer holds run {run_id}"),
        ));
    }
    state.notify_run(&run_id);
    Ok(Json(Recorded { recorded }))
}

/// Checks the events a runner reports as its shell ended (`when`, for the
/// refusal): only what closing a browser records (its sandbox's start and
/// end, its requests: an artifact or a capability is never reported past
/// the export boundary's and the policy's decisions this way), each a
/// shell event of run `run`.
fn check_closing(events: &mut [Event], runner: &RunnerRow, run: &str, when: &str) -> ApiResult<()> {
    if events.len() > MAX_RESULT_EVENTS {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_RESULT_EVENTS} events {when}"
        )));
    }
    for e in events {
        if !END_EVENTS.contains(&e.event_type) {
            return Err(ApiError::bad_request(format!(
                "a runner does not report {} {when}",
                e.event_type.as_str()
            )));
        }
        check_shell_event(e, runner)?;
        e.run_id = run.to_owned();
    }
    Ok(())
}

/// Whether `runner` holds live run `run`; if so, `events` are made ready to
/// record: each under the operation that opened its session if that is one
/// of the run's, scrubbed of the org's secrets.
fn file_closing(
    s: &moat_store::Store,
    state: &AppState,
    runner: &RunnerRow,
    run: &str,
    events: &mut [Event],
) -> Result<ApiResult<bool>, moat_store::StoreError> {
    let held = s
        .run(&runner.org_id, run)?
        .is_some_and(|r| !r.state.is_final() && r.runner_id.as_deref() == Some(runner.id.as_str()));
    if !held || events.is_empty() {
        return Ok(Ok(held));
    }
    let ops: Vec<String> = s
        .ops(&runner.org_id, run)?
        .into_iter()
        .map(|o| o.id)
        .collect();
    let sealed = s.secrets(&runner.org_id)?;
    let secrets = match super::secrets::open_secrets(state, &runner.org_id, &sealed) {
        Ok(secrets) => secrets,
        Err(e) => return Ok(Err(e)),
    };
    let scrubber = crate::tools::Scrubber::new(secrets);
    for e in events {
        if e.op_id.as_ref().is_some_and(|op| !ops.contains(op)) {
            e.op_id = None;
        }
        scrubber.json(&mut e.data);
    }
    Ok(Ok(true))
}

/// The runner is stopping: the run goes back to the queue, the claim not
/// counted, and a waiting claim (here or on another replica) is woken.
pub async fn release(
    State(state): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Json<Released>> {
    let now = state.now();
    let (org, id, run) = (runner.org_id.clone(), runner.id.clone(), run_id.clone());
    let released = state
        .db(move |s| s.release_run(&org, &id, &run, now))
        .await?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "not_releasable",
                format!(
                    "run {run_id} is not held by this runner, or an operation of it is dispatched"
                ),
            )
        })?;
    state.notify_run(&run_id);
    state.notify_queue(&released.org_id, &released.environment);
    Ok(Json(Released {
        attempts: released.attempts,
    }))
}

/// Most checks one teardown report may carry.
const MAX_TEARDOWN_CHECKS: usize = 64;

fn check_teardown(checks: &[TeardownCheck]) -> ApiResult<()> {
    if checks.is_empty() || checks.len() > MAX_TEARDOWN_CHECKS {
        return Err(ApiError::bad_request(format!(
            "a teardown reports 1 to {MAX_TEARDOWN_CHECKS} checks"
        )));
    }
    if checks
        .iter()
        .any(|c| c.check.is_empty() || c.check.len() > 64 || c.detail.len() > 4096)
    {
        return Err(ApiError::bad_request(
            "a check is named in 1 to 64 bytes, with at most 4096 bytes of detail",
        ));
    }
    Ok(())
}

/// The runner tore a run down (`run.destroyed`): a run of its org, whoever
/// holds it now (a run whose lease this runner lost may already be another
/// runner's). The event names the runner: it speaks for its own host only.
pub async fn destroyed(
    State(state): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<Reported>> {
    let TornDown {
        checks,
        then_claim_ms,
    } = parse(&body)?;
    check_teardown(&checks)?;
    let event = destroyed_event(&runner, &run_id, checks, state.now());
    let org = runner.org_id.clone();
    let recorded = state.db(move |s| s.append_run_event(&org, &event)).await?;
    if !recorded {
        return Err(ApiError::not_found(format_args!("run {run_id}")));
    }
    let claim = claim_after(&state, &runner, &run_id, then_claim_ms).await;
    Ok(Json(Reported {
        recorded: true,
        claim,
    }))
}

/// The runner's `run.destroyed`: it names the runner, which speaks for
/// its own host only.
fn destroyed_event(
    runner: &RunnerRow,
    run: &str,
    checks: Vec<TeardownCheck>,
    now: i64,
) -> moat_core::Event {
    let data = EventData::RunDestroyed(RunDestroyed {
        runner_id: runner.id.clone(),
        ok: checks.iter().all(|c| c.ok),
        checks,
    });
    typed_event(data, run, now)
}

/// A runner that started tore down leftovers of runs it no longer holds
/// (`runner.janitor`).
pub async fn janitor(
    State(state): State<Arc<AppState>>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<Recorded>> {
    let Janitor { runs, checks } = parse(&body)?;
    check_teardown(&checks)?;
    if runs.len() > 10_000 || runs.iter().any(|r| !moat_core::op::is_plain_id(r)) {
        return Err(ApiError::bad_request("runs: at most 10000 plain run ids"));
    }
    let now = state.now();
    let data = EventData::RunnerJanitor(RunnerJanitor {
        runner_id: runner.id.clone(),
        ok: checks.iter().all(|c| c.ok),
        runs,
        checks,
    });
    state
        .db(move |s| s.append_events(&runner.org_id, &[typed_event(data, "", now)]))
        .await?;
    Ok(Json(Recorded { recorded: true }))
}

/// The current manifest of the runner's environment (for refreshing).
pub async fn manifest(
    State(state): State<Arc<AppState>>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Json<ManifestView>> {
    let row = state
        .db(move |s| s.current_manifest(&runner.org_id, &runner.environment))
        .await?
        .ok_or_else(|| ApiError::not_found("published manifest"))?;
    Ok(Json(manifest_view(&row)?))
}

/// The runner swapped to a refreshed manifest (at an operation boundary).
pub async fn refreshed(
    State(state): State<Arc<AppState>>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<ManifestRefreshed>> {
    let ManifestRefreshed { manifest_hash } = parse(&body)?;
    let (org, env) = (runner.org_id.clone(), runner.environment.clone());
    let current = state.db(move |s| s.current_manifest(&org, &env)).await?;
    let Some(current) = current.filter(|c| c.hash == manifest_hash) else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "stale_manifest",
            "that is not the current manifest",
        ));
    };
    let signed_manifest: SignedManifest =
        serde_json::from_str(&current.signed).map_err(|e| ApiError::internal(e.to_string()))?;
    if signed_manifest.manifest.policy_hash != state.config.policy.hash() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "stale_policy",
            "the manifest names another policy",
        ));
    }
    let listed = signed_manifest.manifest.classes();
    if let Some(class) = moat_core::WorkloadClass::from_mask(runner.classes)
        .into_iter()
        .find(|c| !listed.contains(c))
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "ops_beyond_manifest",
            format!(
                "the runner offers workload class {class}, which that manifest does not list: \
                 restart it without the class"
            ),
        ));
    }
    let now = state.now();
    let data = EventData::RunnerManifestRefreshed(RunnerManifestRefreshed {
        runner_id: runner.id.clone(),
        from: runner.manifest_hash.clone(),
        manifest_hash: current.hash.clone(),
        expires_at: stamp(current.expires_ms),
    });
    let policy = signed_manifest.manifest.policy_hash.clone();
    state
        .db(move |s| {
            s.set_runner_manifest(&runner.id, &current.hash, &policy)?;
            s.append_events(&runner.org_id, &[typed_event(data, "", now)])
        })
        .await?;
    Ok(Json(ManifestRefreshed { manifest_hash }))
}
