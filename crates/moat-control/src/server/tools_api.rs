//! The credential proxy's API: secrets (write-only), tools, and the call a
//! runner makes for a `control-plane-tool-proxy` operation. The secret is
//! decrypted here, put where the tool says, and never leaves: the answer is
//! redacted, and every known secret value is scrubbed from it, from the
//! events and from any error message before anything is stored or returned.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use moat_api::org::{NewSecret, SecretList, SecretView, TokenCall, ToolAnswer, ToolResult};
use moat_core::event_data::{NetworkDecision, NetworkDenied, NetworkRequest, OpFinished};
use moat_core::{DenialReason, EventData, OpStatus};
use moat_egress::addr::AddressPolicy;
use moat_egress::outbound::{self, Gate, HttpRequest, HttpResponse, OutboundError, TlsConfig};
use moat_store::{OpResult as StoreOpResult, OpState, stamp, typed_event};
use serde_json::{Value, json};

use super::AppState;
use super::auth;
use super::auth::SignedRunner;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use super::secrets::{no_vault, open_secrets};
use base64::Engine as _;

use crate::tools::{self, MIN_SECRET, PROFILE, Scrubber, ToolCallArgs, ToolDef, ToolList};

/// The largest secret value.
const MAX_SECRET: usize = 64 << 10;

pub async fn put_secret(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    Path(name): Path<String>,
    // Its value is wiped when the body is dropped, once sealed.
    JsonObject(body): JsonObject<NewSecret>,
) -> ApiResult<(StatusCode, Json<SecretView>)> {
    if !tools::plain_name(&name) {
        return Err(ApiError::bad_request(
            "secret name: 1 to 64 of [A-Za-z0-9_.-]",
        ));
    }
    if !(MIN_SECRET..=MAX_SECRET).contains(&body.value.len()) {
        return Err(ApiError::bad_request(format!(
            "a secret is {MIN_SECRET} bytes to 64 KiB (shorter values would be scrubbed everywhere they occur)"
        )));
    }
    let vault = state.config.vault.as_ref().ok_or_else(no_vault)?;
    let (nonce, sealed) = vault
        .seal(&org, &name, body.value.as_bytes())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    drop(body);
    let now = state.now();
    let n = name.clone();
    state
        .db(move |s| s.put_secret(&org, &n, &nonce, &sealed, now))
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(SecretView {
            name,
            updated_at: stamp(now),
        }),
    ))
}

/// Names and times only: a secret is never read back.
pub async fn list_secrets(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
) -> ApiResult<Json<SecretList>> {
    let rows = state.db(move |s| s.secrets(&org)).await?;
    Ok(Json(SecretList {
        secrets: rows
            .iter()
            .map(|r| SecretView {
                name: r.name.clone(),
                updated_at: stamp(r.updated_ms),
            })
            .collect(),
    }))
}

pub async fn put_tool(
    State(state): State<Arc<AppState>>,
    auth::OrgAdmin(org): auth::OrgAdmin,
    JsonObject(body): JsonObject<Value>,
) -> ApiResult<(StatusCode, Json<ToolDef>)> {
    let def = ToolDef::parse(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let stored = serde_json::to_value(&def).map_err(|e| ApiError::internal(e.to_string()))?;
    let now = state.now();
    let (name, value) = (def.name.clone(), stored);
    state
        .db(move |s| s.put_tool(&org, &name, &value, now))
        .await?;
    Ok((StatusCode::CREATED, Json(def)))
}

pub async fn list_tools(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
) -> ApiResult<Json<ToolList>> {
    let rows = state.db(move |s| s.tools(&org)).await?;
    let tools = rows
        .into_iter()
        .map(|r| {
            serde_json::from_value(r.definition)
                .map_err(|e| ApiError::internal(format!("stored tool {}: {e}", r.name)))
        })
        .collect::<ApiResult<_>>()?;
    Ok(Json(ToolList { tools }))
}

/// The runner's `control-plane-tool-proxy` operation, made here: checked
/// (dispatched to this runner, so allowed or approved), called, redacted,
/// scrubbed, recorded as the operation's result.
pub async fn call(
    State(state): State<Arc<AppState>>,
    Path((run_id, op_id)): Path<(String, String)>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Json<ToolResult>> {
    let (org, r, o) = (runner.org_id.clone(), run_id.clone(), op_id.clone());
    let (run, op) = state
        .db(move |s| Ok((s.run(&org, &r)?, s.op(&org, &r, &o)?)))
        .await?;
    let held = run.is_some_and(|r| r.runner_id.as_deref() == Some(runner.id.as_str()));
    let Some(op) = op.filter(|o| held && o.state == OpState::Dispatched) else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_dispatched",
            format!("operation {op_id} is not dispatched to this runner"),
        ));
    };
    let args: ToolCallArgs = serde_json::from_value(op.envelope["args"].clone())
        .ok()
        .filter(|a: &ToolCallArgs| op.op == "http_request" && a.profile == PROFILE)
        .ok_or_else(|| ApiError::bad_request("not a control-plane-tool-proxy operation"))?;
    // Once per operation: a retried or concurrent request does not call
    // the vendor again.
    let now = state.now();
    let lease = i64::try_from(state.config.lease.as_millis()).unwrap_or(i64::MAX);
    let (org, rid, r, o) = (
        runner.org_id.clone(),
        runner.id.clone(),
        run_id.clone(),
        op_id.clone(),
    );
    let (first, held) = state
        .db(move |s| {
            let first = s.start_tool_call(&r, &o, now)?;
            // The call may take a while: the run's lease is renewed first.
            let held = s.renew_lease(&org, &rid, &r, now, lease)?.is_some();
            Ok((first, held))
        })
        .await?;
    if !first || !held {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "tool_call_started",
            format!(
                "the tool call of operation {op_id} was already made, or the run is no longer held"
            ),
        ));
    }
    let (org, name) = (runner.org_id.clone(), args.tool.clone());
    let (tool, sealed) = state
        .db(move |s| Ok((s.tool(&org, &name)?, s.secrets(&org)?)))
        .await?;
    let secrets = open_secrets(&state, &runner.org_id, &sealed)?;
    let mut scrubber = Scrubber::new(secrets.clone());
    let decided_hash = op.decision["toolHash"].as_str().map(str::to_owned);
    let allow_private = state.config.tools_allow_private;
    // Half a lease at most: the result is recorded while the run is held.
    let timeout = (state.config.lease / 2).min(Duration::from_secs(30));
    let called = match tool.map(|t| ToolDef::parse(&t.definition)) {
        None => Err(format!("no tool {:?} in this org", args.tool)),
        Some(Err(e)) => Err(e.to_string()),
        Some(Ok(def)) if decided_hash.as_deref() != Some(def.hash().as_str()) => Err(format!(
            "tool {} changed since the operation was decided: refused",
            def.name
        )),
        Some(Ok(def)) => Ok(make_call(
            &def,
            &args.params,
            &secrets,
            &mut scrubber,
            &CallContext {
                run_id: &run_id,
                via: None,
                timeout,
                allow_private,
                now,
            },
        )
        .await?),
    };
    let mut events = Vec::new();
    let (succeeded, mut result) = match called {
        Ok((Ok((status, body)), request)) => {
            events.push(request);
            let ok = (200..300).contains(&status);
            let result = moat_core::OpResult {
                id: op_id.clone(),
                status: if ok { OpStatus::Ok } else { OpStatus::Error },
                result: Some(json!({"status": status, "body": body})),
                reason: None,
                message: (!ok).then(|| format!("{} answered {status}", args.tool)),
                event_type: None,
                artifacts: Vec::new(),
            };
            (ok, result)
        }
        Ok((Err(message), request)) => {
            events.push(request);
            (false, failed(&op_id, &message))
        }
        Err(message) => (false, failed(&op_id, &message)),
    };
    // Last, over everything that leaves or is kept: no secret survives.
    if let Some(m) = result.message.take() {
        result.message = Some(scrubber.text(&m));
    }
    let mut result_json =
        serde_json::to_value(&result).map_err(|e| ApiError::internal(e.to_string()))?;
    scrubber.json(&mut result_json);
    let data = EventData::OpFinished(OpFinished {
        status: result.status,
        runner_id: runner.id.clone(),
        reason: None,
        artifacts: None,
        profile: Some(PROFILE.into()),
        message: result.message.clone(),
    });
    let mut finished = typed_event(data, &run_id, now);
    finished.op_id = Some(op_id.clone());
    events.push(finished);
    for e in &mut events {
        e.op_id = Some(op_id.clone());
        scrubber.json(&mut e.data);
    }
    let (org, rid, run, opid, stored) = (
        runner.org_id.clone(),
        runner.id.clone(),
        run_id.clone(),
        op_id.clone(),
        result_json.clone(),
    );
    state
        .db(move |s| {
            s.finish_op(
                &StoreOpResult {
                    org: &org,
                    runner: &rid,
                    run: &run,
                    op: &opid,
                    succeeded,
                    result: &stored,
                    events: &events,
                    artifacts: &[],
                    held: &[],
                    heads: &[],
                },
                now,
            )
        })
        .await?;
    state.notify_run(&run_id);
    let result = serde_json::from_value(result_json)
        .map_err(|e| ApiError::internal(format!("the scrubbed result: {e}")))?;
    Ok(Json(ToolResult { result }))
}

/// A program's call with its one-operation token (the fallback path: for a
/// program that must call a tool itself). The token is good while its
/// operation runs, for the tools the operation was allowed, each as it was
/// when decided. The answer is redacted and scrubbed like any tool call,
/// and the call is recorded against the operation.
pub async fn token_call(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonObject(body): JsonObject<TokenCall>,
) -> ApiResult<Json<ToolAnswer>> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| {
            ApiError::unauthorized("a tool token is required (Authorization: Bearer ...)")
        })?;
    let hash = moat_core::hash::sha256_hex(token.as_bytes());
    let now = state.now();
    let name = body.tool.clone();
    let found = state
        .db(move |s| {
            let Some(grant) = s.tool_token(&hash, now)? else {
                return Ok(None);
            };
            let op = s.op(&grant.org_id, &grant.run_id, &grant.op_id)?;
            let tool = s.tool(&grant.org_id, &name)?;
            let sealed = s.secrets(&grant.org_id)?;
            Ok(Some((grant, op, tool, sealed)))
        })
        .await?;
    let Some((grant, op, tool, sealed)) = found else {
        return Err(ApiError::unauthorized("unknown or expired tool token"));
    };
    if op.is_none_or(|o| o.state != OpState::Dispatched) {
        return Err(ApiError::unauthorized("the token's operation has ended"));
    }
    let def = tool
        .and_then(|t| ToolDef::parse(&t.definition).ok())
        .filter(|d| grant.tools[&d.name].as_str() == Some(d.hash().as_str()))
        .ok_or_else(|| {
            ApiError::forbidden(
                "tool_not_granted",
                format!(
                    "this token does not grant {:?} (or the tool changed since)",
                    body.tool
                ),
            )
        })?;
    let secrets = open_secrets(&state, &grant.org_id, &sealed)?;
    let mut scrubber = Scrubber::new(secrets.clone());
    let timeout = Duration::from_secs(30);
    let (outcome, mut request) = make_call(
        &def,
        &body.params,
        &secrets,
        &mut scrubber,
        &CallContext {
            run_id: &grant.run_id,
            via: Some("tool-token"),
            timeout,
            allow_private: state.config.tools_allow_private,
            now,
        },
    )
    .await?;
    request.op_id = Some(grant.op_id.clone());
    scrubber.json(&mut request.data);
    let org = grant.org_id.clone();
    state.db(move |s| s.append_events(&org, &[request])).await?;
    state.notify_run(&grant.run_id);
    Ok(Json(match outcome {
        Ok((status, mut body)) => {
            scrubber.json(&mut body);
            ToolAnswer {
                status: Some(status),
                body: Some(body),
                error: None,
            }
        }
        Err(message) => ToolAnswer {
            status: None,
            body: None,
            error: Some(scrubber.text(&message)),
        },
    }))
}

fn failed(op_id: &str, message: &str) -> moat_core::OpResult {
    moat_core::OpResult {
        id: op_id.to_owned(),
        status: OpStatus::Error,
        result: None,
        reason: None,
        message: Some(format!("tool call failed: {message}")),
        event_type: None,
        artifacts: Vec::new(),
    }
}

/// Where and how a tool call is made.
pub(crate) struct CallContext<'a> {
    pub run_id: &'a str,
    /// How the call came (`tool-token` for a program's own call), as its
    /// event says; `None` for an operation's.
    pub via: Option<&'static str>,
    pub timeout: Duration,
    pub allow_private: bool,
    pub now: i64,
}

/// One call of `def` with `params`: the credential put in place, the answer
/// redacted (`{status, body}`), the `network.request` event; or why not.
/// The caller scrubs what it keeps or returns (`scrubber` learns the forms
/// of the secret this call made).
pub(crate) async fn make_call(
    def: &ToolDef,
    params: &serde_json::Map<String, Value>,
    secrets: &[(String, crate::vault::Secret)],
    scrubber: &mut Scrubber,
    cx: &CallContext<'_>,
) -> ApiResult<(Result<(u16, Value), String>, moat_core::Event)> {
    let (run_id, now, timeout, allow_private) = (cx.run_id, cx.now, cx.timeout, cx.allow_private);
    let via = cx.via.map(str::to_owned);
    if let Some(c) = def
        .credential
        .as_ref()
        .filter(|c| c.place == tools::CredentialPlace::Basic)
        && let Some((_, v)) = secrets.iter().find(|(n, _)| *n == c.secret)
    {
        let pair = crate::vault::Secret::new(format!(
            "{}:{}",
            c.name.as_deref().unwrap_or(""),
            v.as_str()
        ));
        let b64 = crate::vault::Secret::new(
            base64::engine::general_purpose::STANDARD.encode(pair.as_bytes()),
        );
        scrubber.also(
            &c.secret,
            crate::vault::Secret::new(b64.trim_end_matches('=').to_owned()),
        );
    }
    let secret = def.credential.as_ref().and_then(|c| {
        secrets
            .iter()
            .find(|(n, _)| *n == c.secret)
            .map(|(_, v)| v.clone())
    });
    let call = match def.call(params, secret.as_ref().map(|s| s.as_str())) {
        Ok(call) => call,
        Err(e) => {
            let refused = typed_event(
                EventData::NetworkDenied(NetworkDenied {
                    profile: Some(PROFILE.into()),
                    tool: Some(def.name.clone()),
                    reason: Some(DenialReason::InvalidArgs),
                    message: Some(e.to_string()),
                    via,
                    ..NetworkDenied::default()
                }),
                run_id,
                now,
            );
            return Ok((Err(e.to_string()), refused));
        }
    };
    let max = def.max_response();
    let answer = tokio::time::timeout(timeout, send(&call, max, allow_private))
        .await
        .unwrap_or_else(|_| {
            Err(OutboundError::Unreachable(format!(
                "no complete answer in {} s",
                timeout.as_secs()
            )))
        });
    // The host and port as the egress proxy records them; the path
    // without the query, where a credential may be.
    let port = call.uri.port_u16().unwrap_or(match call.uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    let host = call.uri.host().unwrap_or_default().to_owned();
    let mut request = NetworkRequest {
        profile: Some(PROFILE.into()),
        tool: Some(def.name.clone()),
        path: Some(call.uri.path().to_owned()),
        via,
        ..NetworkRequest::new(host, port, call.method.clone(), NetworkDecision::Allowed)
    };
    let outcome = match answer {
        Ok((response, address, took)) => {
            request.status = Some(response.status);
            request.address = Some(address.ip().to_string());
            request.bytes_in = Some(u64::try_from(response.body.len()).unwrap_or(u64::MAX));
            request.duration_ms = Some(u64::try_from(took.as_millis()).unwrap_or(u64::MAX));
            let body = String::from_utf8_lossy(&response.body);
            Ok((response.status, def.redact(&body)))
        }
        Err(e) => {
            let message = match &e {
                OutboundError::AddressNotAllowed { .. } => {
                    format!("{e}: refused (moat serve --tools-allow-private-addresses allows it)")
                }
                _ => e.to_string(),
            };
            request.decision = match e.reason() {
                DenialReason::UpstreamUnreachable => NetworkDecision::Failed,
                _ => NetworkDecision::Denied,
            };
            request.reason = Some(e.reason());
            request.message = Some(message.clone());
            Err(message)
        }
    };
    Ok((
        outcome,
        typed_event(EventData::NetworkRequest(request), run_id, now),
    ))
}

/// TLS for tool calls: the bundled Mozilla roots.
static TLS: LazyLock<Result<TlsConfig, String>> = LazyLock::new(|| outbound::tls_config(None));

/// Sends `call` through the same gate as the egress proxy: its host is
/// resolved once, every address checked, and only a checked address dialled
/// (a name answering differently the second time reaches nothing). A
/// non-public address (loopback, private, link-local, metadata...) is
/// refused unless the operator allowed it: an org's admin must not reach
/// the control plane's own network through a tool. No redirect is followed
/// (a credential must not follow one to another host), and no proxy from
/// the environment is used. Returns the answer (body up to `max` bytes),
/// the address it came from and the time it took.
async fn send(
    call: &tools::Call,
    max: u64,
    allow_private: bool,
) -> Result<(HttpResponse, SocketAddr, Duration), OutboundError> {
    let addresses = if allow_private {
        AddressPolicy::any()
    } else {
        AddressPolicy::default()
    };
    let no_fixed_answers = BTreeMap::new();
    let gate = Gate::new(&no_fixed_answers, &addresses);
    let tls = TLS
        .as_ref()
        .map_err(|e| OutboundError::Unreachable(e.clone()))?;
    let method = call
        .method
        .parse()
        .map_err(|_| OutboundError::Invalid(format!("method {:?}", call.method)))?;
    let request = HttpRequest {
        method,
        uri: call.uri.clone(),
        headers: call.headers.clone(),
        body: call.body.clone().unwrap_or_default().into_bytes(),
    };
    let started = Instant::now();
    let (response, address) = outbound::request(&gate, tls, &request, max).await?;
    if response.truncated {
        return Err(OutboundError::Unreachable(format!(
            "reading the answer: it is larger than {max} bytes"
        )));
    }
    Ok((response, address, started.elapsed()))
}
