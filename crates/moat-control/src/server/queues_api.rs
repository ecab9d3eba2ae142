//! Queues and key-value namespaces: the `worker` class's control-plane
//! half.
//!
//! An org's admin names the worker component that consumes a queue
//! (`PUT /v1/queues/{name}`); a message sent to it (`POST .../messages`)
//! is delivered to a run of its own, placed like any run on a runner that
//! offers the `worker` class, whose one `exec_argv` invokes the component
//! with the message, the granted kv namespaces as they are and the queues
//! it may send to. The delivery's decision is the consumer's registration
//! (made with the org's admin token), recorded as `capability.granted`
//! with the queue as its resource; what the invocation writes under
//! `output/` still passes the export boundary and the policy's `export`
//! decision. Its result settles the message: acknowledged, with its kv
//! writes and sends made in the same transaction, only if it exited 0;
//! otherwise retried after a backoff that doubles, dead-lettered after
//! the queue's `maxAttempts`, and redriven by hand.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use moat_api::queues::{
    KvNamespace, MessageList, MessageSent, MessageView, PutQueue, QueueList, QueueView, SendMessage,
};
use moat_core::event_data::{CapabilityGranted, PolicyDecision, RunInput};
use moat_core::op::WorkerGrants;
use moat_core::{Envelope, EventData, WorkloadClass};
use moat_store::{
    Delivery, KvSnapshot, MessageRow, MessageState, NewArtifact, NewMessage, QueueRow, Settle,
    Store, StoreError, queue_effects, stamp, typed_event,
};
use moat_worker_api::{valid_idempotency_key, valid_key, valid_name};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::auth;
use super::body::{JsonObject, parse};
use super::error::{ApiError, ApiResult};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Where a delivery run's workspace holds the component.
const MODULE_PATH: &str = "worker/component.wasm";

/// Messages delivered per pass.
const DELIVER_BATCH: i64 = 32;

/// The most messages a list answers.
const MAX_LISTED: i64 = 1000;

/// What a kv namespace holds at most: its snapshot travels with each
/// delivery's operation.
const MAX_NAMESPACE_BYTES: i64 = 4 << 20;
const MAX_NAMESPACE_KEYS: i64 = 10_000;

/// A delivery carries the granted namespaces up to this many bytes (keys
/// and values): the namespaces' own bounds keep them under it.
const MAX_SNAPSHOT_BYTES: usize = 16 << 20;

/// Whether `namespace`, holding `(keys, bytes)`, may take a value of
/// `new` bytes under a key it holds (`old` bytes) or not (`old` None).
fn namespace_room(
    namespace: &str,
    (keys, bytes): (i64, i64),
    old: Option<usize>,
    new: usize,
) -> Result<(), String> {
    let new = i64::try_from(new).unwrap_or(i64::MAX);
    let old_bytes = old.map_or(0, |o| i64::try_from(o).unwrap_or(0));
    let keys_after = keys + i64::from(old.is_none());
    if bytes - old_bytes + new > MAX_NAMESPACE_BYTES || keys_after > MAX_NAMESPACE_KEYS {
        return Err(format!(
            "kv namespace {namespace} would hold more than {MAX_NAMESPACE_KEYS} keys or 4 MiB of \
             values (it travels with each delivery)"
        ));
    }
    Ok(())
}

fn no_such_queue(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no such queue {name}"),
    )
}

fn check_name(what: &str, name: &str) -> ApiResult<()> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{what} {name:?}: 1 to 64 of a-z 0-9 _ . -, starting with a letter or digit"
        )))
    }
}

/// What the consumer keeps beyond the store's columns.
#[derive(serde::Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Consumer {
    args: Vec<String>,
    send_to: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
}

fn consumer_of(queue: &QueueRow) -> Consumer {
    serde_json::from_value(queue.consumer.clone()).unwrap_or_default()
}

fn queue_view(queue: &QueueRow) -> QueueView {
    let consumer = consumer_of(queue);
    QueueView {
        name: queue.name.clone(),
        environment: queue.environment.clone(),
        module_sha256: queue.module_sha256.clone(),
        args: consumer.args,
        inputs: queue
            .inputs
            .iter()
            .filter(|i| i.path != MODULE_PATH)
            .map(|i| i.path.clone())
            .collect(),
        kv: queue.namespaces.clone(),
        send_to: consumer.send_to,
        max_attempts: queue.max_attempts,
        backoff_ms: queue.backoff_ms,
        timeout_ms: consumer.timeout_ms,
        created_at: stamp(queue.created_ms),
        updated_at: stamp(queue.updated_ms),
    }
}

fn message_view(message: &MessageRow) -> MessageView {
    MessageView {
        id: message.id.clone(),
        queue: message.queue.clone(),
        state: message.state.as_str().to_owned(),
        attempts: message.attempts,
        body: message.body.clone(),
        idempotency_key: message.idempotency_key.clone(),
        run_id: message.run_id.clone(),
        last_error: message.last_error.clone(),
        visible_at: stamp(message.visible_ms),
        created_at: stamp(message.created_ms),
        updated_at: stamp(message.updated_ms),
    }
}

/// `PUT /v1/queues/{name}`: its body carries the component, so it is read
/// up to the large body limit, after the token was checked.
pub async fn put_queue(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    Path(name): Path<String>,
    request: axum::extract::Request,
) -> ApiResult<Json<QueueView>> {
    check_name("queue", &name)?;
    let bytes = axum::body::to_bytes(request.into_body(), super::MAX_BODY)
        .await
        .map_err(|_| ApiError::bad_request("request body unreadable or over 64 MiB"))?;
    let body: PutQueue = parse(&bytes)?;
    let module = B64
        .decode(body.module_base64.as_bytes())
        .map_err(|_| ApiError::bad_request("moduleBase64 is not base64"))?;
    // A component's preamble: "\0asm", version 0x0d, layer 1.
    if module.len() < 8 || &module[..4] != b"\0asm" || module[6..8] != [1, 0] {
        return Err(ApiError::bad_request(
            "moduleBase64 is not a WebAssembly component (WASI 0.2; moat worker build makes one)",
        ));
    }
    for namespace in &body.kv {
        check_name("kv namespace", namespace)?;
    }
    for queue in &body.send_to {
        check_name("sendTo queue", queue)?;
    }
    let max_attempts = body.max_attempts.unwrap_or(3);
    if !(1..=20).contains(&max_attempts) {
        return Err(ApiError::bad_request("maxAttempts: 1 to 20"));
    }
    let backoff_ms = body.backoff_ms.unwrap_or(1_000);
    if !(0..=3_600_000).contains(&backoff_ms) {
        return Err(ApiError::bad_request("backoffMs: 0 to 3600000"));
    }
    if body.args.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::bad_request(
            "args: an argument contains a NUL byte",
        ));
    }
    let mut blobs = vec![blob(MODULE_PATH, module)];
    for input in body.inputs {
        let path = input.path.to_string();
        if !path.starts_with("input/") {
            return Err(ApiError::bad_request(format!(
                "input {path}: a worker's inputs are under input/"
            )));
        }
        let data = match (input.content, input.content_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(b64)) => B64.decode(b64.as_bytes()).map_err(|_| {
                ApiError::bad_request(format!("input {path}: contentBase64 is not base64"))
            })?,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "input {path}: give content or contentBase64"
                )));
            }
        };
        blobs.push(blob(&path, data));
    }
    // Nothing the runs of a queue read may carry one of the org's secrets.
    let o = org.clone();
    let sealed = state.db(move |s| s.secrets(&o)).await?;
    let secrets = super::secrets::open_secrets(&state, &org, &sealed)?;
    if !secrets.is_empty() {
        let fields: Vec<(String, &[u8])> = blobs
            .iter()
            .skip(1)
            .map(|b| (format!("inputs {}", b.label), b.data.as_slice()))
            .collect();
        if let Some(found) = super::inputs::find_secret(&secrets, &fields) {
            return Err(super::inputs::refuse(&state, &org, found).await);
        }
    }
    let inputs: Vec<RunInput> = blobs
        .iter()
        .map(|b| RunInput {
            path: b.label.clone(),
            sha256: b.sha256.clone(),
            size: b.data.len() as u64,
        })
        .collect();
    let consumer = Consumer {
        args: body.args,
        send_to: body.send_to,
        timeout_ms: body.timeout_ms,
    };
    let row = QueueRow {
        org_id: org,
        name,
        environment: body
            .environment
            .unwrap_or_else(|| state.config.environment.clone()),
        module_sha256: blobs[0].sha256.clone(),
        inputs,
        namespaces: body.kv,
        max_attempts,
        backoff_ms,
        consumer: serde_json::to_value(&consumer).map_err(|e| ApiError::internal(e.to_string()))?,
        created_ms: 0,
        updated_ms: 0,
    };
    let now = state.now();
    let row = state.db(move |s| s.put_queue(&row, &blobs, now)).await?;
    Ok(Json(queue_view(&row)))
}

fn blob(path: &str, data: Vec<u8>) -> NewArtifact {
    NewArtifact {
        sha256: moat_core::hash::sha256_hex(&data),
        kind: "input".into(),
        label: path.to_owned(),
        data,
        kept: moat_store::Kept::Database,
    }
}

/// `GET /v1/queues`.
pub async fn list_queues(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
) -> ApiResult<Json<QueueList>> {
    let rows = state.db(move |s| s.queues(&org)).await?;
    Ok(Json(QueueList {
        queues: rows.iter().map(queue_view).collect(),
    }))
}

/// `GET /v1/queues/{name}`.
pub async fn show_queue(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(name): Path<String>,
) -> ApiResult<Json<QueueView>> {
    let shown = name.clone();
    let row = state.db(move |s| s.queue(&org, &name)).await?;
    row.map(|r| Json(queue_view(&r)))
        .ok_or_else(|| no_such_queue(&shown))
}

/// `POST /v1/queues/{name}/messages`: 201 with the message queued, or 200
/// with the first one its idempotency key named (`duplicate`).
pub async fn send(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(name): Path<String>,
    JsonObject(body): JsonObject<SendMessage>,
) -> ApiResult<Response> {
    check_name("queue", &name)?;
    if body.body.to_string().len() > moat_worker_api::MAX_MESSAGE_BYTES {
        return Err(ApiError::bad_request("body: at most 256 KiB of JSON"));
    }
    if let Some(key) = &body.idempotency_key
        && !valid_idempotency_key(key)
    {
        return Err(ApiError::bad_request(
            "idempotencyKey: 1 to 200 printable ASCII characters",
        ));
    }
    let now = state.now();
    let id = moat_core::random::new_id("msg_");
    let shown = name.clone();
    let sent = state
        .db(move |s| {
            s.enqueue(
                &NewMessage {
                    org: &org,
                    queue: &name,
                    id: &id,
                    body: &body.body,
                    idempotency_key: body.idempotency_key.as_deref(),
                },
                now,
            )
        })
        .await
        .map_err(|e| match e.status {
            StatusCode::NOT_FOUND => no_such_queue(&shown),
            _ => e,
        })?;
    let (message, duplicate) = sent;
    if !duplicate {
        deliver(&state).await;
    }
    let status = if duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let answer = MessageSent {
        message: message_view(&message),
        duplicate,
    };
    Ok((status, Json(answer)).into_response())
}

#[derive(Deserialize)]
pub struct ListQuery {
    state: Option<String>,
}

/// `GET /v1/queues/{name}/messages[?state=ready|running|done|dead]`.
pub async fn list_messages(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(name): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<MessageList>> {
    let filter = match query.state.as_deref() {
        None => None,
        Some(text) => Some(
            MessageState::parse(text)
                .ok_or_else(|| ApiError::bad_request("state: one of ready, running, done, dead"))?,
        ),
    };
    let rows = state
        .db(move |s| s.messages(&org, &name, filter, MAX_LISTED))
        .await?;
    Ok(Json(MessageList {
        messages: rows.iter().map(message_view).collect(),
    }))
}

/// `GET /v1/queues/{name}/messages/{id}`.
pub async fn show_message(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<Json<MessageView>> {
    let shown = id.clone();
    let row = state.db(move |s| s.message(&org, &name, &id)).await?;
    row.map(|m| Json(message_view(&m)))
        .ok_or_else(|| ApiError::not_found(format!("message {shown}")))
}

/// `POST /v1/queues/{name}/messages/{id}/redrive`: a dead-lettered message
/// queued again, its attempts reset (409 `not_dead` for any other).
pub async fn redrive(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<Json<MessageView>> {
    let now = state.now();
    let (o, n, i) = (org.clone(), name.clone(), id.clone());
    let row = state.db(move |s| s.redrive(&o, &n, &i, now)).await?;
    let Some(row) = row else {
        let exists = state.db(move |s| s.message(&org, &name, &id)).await?;
        return Err(match exists {
            None => ApiError::not_found("message"),
            Some(m) => ApiError::new(
                StatusCode::CONFLICT,
                "not_dead",
                format!(
                    "message {} is {}: only a dead-lettered message is redriven",
                    m.id,
                    m.state.as_str()
                ),
            ),
        });
    };
    deliver(&state).await;
    Ok(Json(message_view(&row)))
}

fn kv_path(namespace: &str, key: Option<&str>) -> ApiResult<()> {
    check_name("namespace", namespace)?;
    if let Some(key) = key
        && !valid_key(key)
    {
        return Err(ApiError::bad_request(
            "key: 1 to 512 bytes of UTF-8 without control characters",
        ));
    }
    Ok(())
}

/// `GET /v1/kv/{namespace}`.
pub async fn kv_list(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(namespace): Path<String>,
) -> ApiResult<Json<KvNamespace>> {
    kv_path(&namespace, None)?;
    let ns = namespace.clone();
    let entries = state.db(move |s| s.kv_list(&org, &ns)).await?;
    Ok(Json(KvNamespace {
        namespace,
        entries: entries
            .into_iter()
            .map(|(k, v)| (k, B64.encode(v)))
            .collect(),
    }))
}

/// `GET /v1/kv/{namespace}/{key}`: the value's bytes.
pub async fn kv_get(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path((namespace, key)): Path<(String, String)>,
) -> ApiResult<Response> {
    kv_path(&namespace, Some(&key))?;
    let shown = format!("{namespace}/{key}");
    let value = state.db(move |s| s.kv_get(&org, &namespace, &key)).await?;
    let value = value.ok_or_else(|| ApiError::not_found(format!("key {shown}")))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], value).into_response())
}

/// `PUT /v1/kv/{namespace}/{key}`: the body's bytes (at most 64 KiB).
pub async fn kv_put(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path((namespace, key)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    kv_path(&namespace, Some(&key))?;
    if body.len() > moat_worker_api::MAX_VALUE_BYTES {
        return Err(ApiError::bad_request("a value holds at most 64 KiB"));
    }
    let now = state.now();
    let size = body.len();
    state
        .db(move |s| {
            let held = s.kv_size(&org, &namespace)?;
            let old = s.kv_get(&org, &namespace, &key)?.map(|v| v.len());
            if let Err(message) = namespace_room(&namespace, held, old, size) {
                return Err(StoreError::InUse(message));
            }
            s.kv_put(&org, &namespace, &key, Some(&body), now)
        })
        .await
        .map_err(|e| match e.status {
            StatusCode::CONFLICT => {
                ApiError::new(StatusCode::CONFLICT, "namespace_full", e.message)
            }
            _ => e,
        })?;
    Ok(Json(json!({"stored": true, "bytes": size})))
}

/// `DELETE /v1/kv/{namespace}/{key}`.
pub async fn kv_delete(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path((namespace, key)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    kv_path(&namespace, Some(&key))?;
    let now = state.now();
    state
        .db(move |s| s.kv_put(&org, &namespace, &key, None, now))
        .await?;
    Ok(Json(json!({"deleted": true})))
}

/// Delivers the messages that are due, each to a run of its own; wakes
/// the runners when it made any. Said, not fatal: the sweep tries again.
pub async fn deliver(state: &Arc<AppState>) {
    let policy_hash = state.config.policy.hash().to_owned();
    let now = state.now();
    let made = state.db(move |s| deliver_due(s, &policy_hash, now)).await;
    match made {
        Ok(0) => {}
        Ok(_) => state.notify(),
        Err(e) => eprintln!("moat serve: delivering queue messages: {}", e.message),
    }
}

/// One delivery pass (also the sweep's): the runs made.
pub fn deliver_due(store: &Store, policy_hash: &str, now: i64) -> Result<usize, StoreError> {
    let settled = store.settle_lost_deliveries(now)?;
    let made = store.deliver_due(now, DELIVER_BATCH, &mut |message, queue, snapshot| {
        plan(message, queue, snapshot, policy_hash, now)
    })?;
    Ok(made.len() + settled)
}

/// The run and the one operation that deliver `message`.
fn plan(
    message: &MessageRow,
    queue: &QueueRow,
    snapshot: &KvSnapshot,
    policy_hash: &str,
    now: i64,
) -> Result<Delivery, StoreError> {
    let consumer = consumer_of(queue);
    let run_id = moat_core::ids::RunId::random().into_string();
    let op_id = moat_core::random::new_id("op_");
    let mut kv = BTreeMap::new();
    let mut carried = 0;
    for (namespace, entries) in snapshot {
        let mut values = BTreeMap::new();
        for (key, value) in entries {
            carried += key.len() + value.len();
            values.insert(key.clone(), B64.encode(value));
        }
        kv.insert(namespace.clone(), values);
    }
    let mut argv = vec![format!("/workspace/{MODULE_PATH}")];
    argv.extend(consumer.args.iter().cloned());
    let grants = WorkerGrants {
        queue: queue.name.clone(),
        message_id: message.id.clone(),
        message: message.body.clone(),
        // Past the snapshot's bound the namespaces are not carried: the
        // invocation runs without them and fails on its first read.
        kv: if carried <= MAX_SNAPSHOT_BYTES {
            kv
        } else {
            BTreeMap::new()
        },
        queues: consumer.send_to.clone(),
    };
    let mut args = json!({"argv": argv, "worker": grants});
    if let Some(timeout) = consumer.timeout_ms {
        args["timeoutMs"] = timeout.into();
    }
    let envelope = Envelope {
        id: op_id.clone(),
        run_id: run_id.clone(),
        correlation_id: message.id.clone(),
        op: "exec_argv".into(),
        args,
        timeout_ms: None,
        max_output_bytes: None,
        network: None,
        cwd: None,
        capability: None,
        policy_decision_ref: None,
        tool_token: None,
        secret_value: None,
        created_at: stamp(now),
    };
    let decision = json!({
        "decision": PolicyDecision::Allow,
        "policyHash": policy_hash,
        "resource": format!("Moat::Queue::{:?}", queue.name),
        "class": WorkloadClass::Worker,
        "policies": [format!("queue-consumer:{}", queue.name)],
    });
    let mut requested = super::org_api::requested_event(&envelope, now);
    requested.correlation_id = Some(message.id.clone());
    let mut granted = typed_event(
        EventData::CapabilityGranted(CapabilityGranted {
            op: Some("exec_argv".into()),
            decision: Some(PolicyDecision::Allow),
            policy_hash: Some(policy_hash.to_owned()),
            resource: Some(format!("Moat::Queue::{:?}", queue.name)),
            class: Some(WorkloadClass::Worker),
            policies: Some(vec![format!("queue-consumer:{}", queue.name)]),
            ..CapabilityGranted::default()
        }),
        &run_id,
        now,
    );
    granted.op_id = Some(op_id.clone());
    granted.correlation_id = Some(message.id.clone());
    Ok(Delivery {
        run_id,
        op_id,
        envelope: serde_json::to_value(&envelope).map_err(|e| StoreError::Encode(e.to_string()))?,
        decision,
        events: vec![requested, granted],
        needs_classes: vec![WorkloadClass::Worker],
    })
}

/// A delivered message and its queue (none: the queue was removed since).
pub type DeliveredMessage = (MessageRow, Option<QueueRow>);

/// The message run `run` was created to deliver, with its queue (none:
/// not a delivery run), as [`settle`] takes it.
pub fn delivery_of(
    store: &Store,
    org: &str,
    run: &str,
) -> Result<Option<DeliveredMessage>, StoreError> {
    let Some(message) = store.message_of_run(run)? else {
        return Ok(None);
    };
    let queue = store.queue(org, &message.queue)?;
    Ok(Some((message, queue)))
}

/// Settles the message a delivery run was invoking (`delivery`, as
/// [`delivery_of`] found it), from its op's result:
/// acknowledged with its effects (each checked against the consumer's
/// grants: a runner's report is not trusted to have kept them), or
/// failed. The run then finishes, or fails with the message's error.
pub async fn settle(
    state: &Arc<AppState>,
    org: &str,
    run: &str,
    delivery: Option<DeliveredMessage>,
    result: &Value,
    succeeded: bool,
) -> ApiResult<()> {
    let Some((message, queue)) = delivery else {
        return Ok(());
    };
    if message.state != MessageState::Running {
        return Ok(());
    }
    // The op's result: its status, and the program's (`result.result`).
    let exit = result["result"]["exitCode"].as_i64();
    let checked = match (&queue, succeeded, exit) {
        (Some(queue), true, Some(0)) => effects_of(queue, &result["result"]["effects"]),
        (None, _, _) => Err(format!("queue {} was removed", message.queue)),
        (_, true, Some(code)) => Err(format!("the worker exited with status {code}")),
        _ => Err(result["message"].as_str().map_or_else(
            || format!("the invocation ended {}", result["status"]),
            str::to_owned,
        )),
    };
    let now = state.now();
    let r = run.to_owned();
    let o = org.to_owned();
    state
        .db(move |s| {
            let checked = match checked {
                Ok((kv, sends)) => room_for(s, &o, &kv)?.map(|()| (kv, sends)),
                Err(error) => Err(error),
            };
            // The run ends as its invocation did: asked to finish, or
            // failed with the reason the message records.
            match &checked {
                Ok((kv, sends)) => {
                    s.settle_message(&r, &Settle::Succeeded { kv, sends }, now)?;
                    s.request_finish(&o, &r, now)?;
                }
                Err(error) => {
                    s.settle_message(&r, &Settle::Failed { error }, now)?;
                    s.force_end_run(&o, &r, moat_store::RunState::Failed, error, now)?;
                }
            };
            Ok(())
        })
        .await?;
    state.notify_run(run);
    deliver(state).await;
    Ok(())
}

/// Whether the org's namespaces have room for `writes` (in order), as
/// [`namespace_room`] says: `Err` fails the invocation (`Ok` inside: the
/// store answered).
fn room_for(
    store: &Store,
    org: &str,
    writes: &[queue_effects::KvWrite],
) -> Result<Result<(), String>, StoreError> {
    let mut held: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    let mut seen: BTreeMap<(&str, &str), Option<usize>> = BTreeMap::new();
    for write in writes {
        let namespace = write.namespace.as_str();
        if !held.contains_key(namespace) {
            held.insert(namespace, store.kv_size(org, namespace)?);
        }
        let old = match seen.get(&(namespace, write.key.as_str())) {
            Some(old) => *old,
            None => store.kv_get(org, namespace, &write.key)?.map(|v| v.len()),
        };
        let (keys, bytes) = held.get(namespace).copied().unwrap_or((0, 0));
        let now = match &write.value {
            Some(value) => {
                if let Err(e) = namespace_room(namespace, (keys, bytes), old, value.len()) {
                    return Ok(Err(e));
                }
                let added = i64::try_from(value.len()).unwrap_or(i64::MAX);
                let removed = old.map_or(0, |o| i64::try_from(o).unwrap_or(0));
                (keys + i64::from(old.is_none()), bytes - removed + added)
            }
            None => match old {
                Some(o) => (keys - 1, bytes - i64::try_from(o).unwrap_or(0)),
                None => (keys, bytes),
            },
        };
        held.insert(namespace, now);
        seen.insert(
            (namespace, write.key.as_str()),
            write.value.as_ref().map(Vec::len),
        );
    }
    Ok(Ok(()))
}

/// The kv writes and sends a successful invocation asked for, held to its
/// queue's grants.
fn effects_of(
    queue: &QueueRow,
    effects: &Value,
) -> Result<(Vec<queue_effects::KvWrite>, Vec<queue_effects::Send>), String> {
    let effects: moat_worker_api::Effects = match effects {
        Value::Null => moat_worker_api::Effects::default(),
        other => serde_json::from_value(other.clone())
            .map_err(|e| format!("the worker's effects do not parse: {e}"))?,
    };
    let sends_to = consumer_of(queue).send_to;
    if effects.kv.len() > moat_worker_api::MAX_KV_WRITES
        || effects.sends.len() > moat_worker_api::MAX_SENDS
    {
        return Err("the worker asked for more writes or sends than one invocation makes".into());
    }
    let mut kv = Vec::new();
    for write in effects.kv {
        if !queue.namespaces.contains(&write.namespace) || !valid_key(&write.key) {
            return Err(format!(
                "the worker wrote {}/{}, which its queue does not grant",
                write.namespace, write.key
            ));
        }
        if write
            .value
            .as_ref()
            .is_some_and(|v| v.0.len() > moat_worker_api::MAX_VALUE_BYTES)
        {
            return Err(format!(
                "the value of {}/{} is over 64 KiB",
                write.namespace, write.key
            ));
        }
        kv.push(queue_effects::KvWrite {
            namespace: write.namespace,
            key: write.key,
            value: write.value.map(|v| v.0),
        });
    }
    let mut sends = Vec::new();
    for send in effects.sends {
        if !sends_to.contains(&send.queue)
            || send
                .idempotency_key
                .as_deref()
                .is_some_and(|k| !valid_idempotency_key(k))
        {
            return Err(format!(
                "the worker sent to {}, which its queue does not grant",
                send.queue
            ));
        }
        if send.body.to_string().len() > moat_worker_api::MAX_MESSAGE_BYTES {
            return Err(format!("a message to {} is over 256 KiB", send.queue));
        }
        sends.push(queue_effects::Send {
            queue: send.queue,
            id: moat_core::random::new_id("msg_"),
            body: send.body,
            idempotency_key: send.idempotency_key,
        });
    }
    Ok((kv, sends))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_takes_a_value_only_while_it_stays_within_its_bounds() {
        let full = MAX_NAMESPACE_BYTES;
        // A new key, room left.
        assert!(namespace_room("n", (0, 0), None, 10).is_ok());
        // Replacing a value counts the difference.
        assert!(namespace_room("n", (1, full), Some(10), 10).is_ok());
        assert!(namespace_room("n", (1, full), Some(10), 11).is_err());
        // A new value past the bytes, or a key past the count.
        assert!(namespace_room("n", (1, full - 5), None, 6).is_err());
        assert!(namespace_room("n", (MAX_NAMESPACE_KEYS, 0), None, 0).is_err());
        assert!(namespace_room("n", (MAX_NAMESPACE_KEYS, 0), Some(0), 1).is_ok());
    }
}
