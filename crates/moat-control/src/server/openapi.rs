//! The OpenAPI document of the API, served at `/openapi.json`. Every route
//! of the router is listed in [`ROUTES`]; a test checks the two agree in
//! both directions (against `super::routes()`, which builds the router).
//! Bodies with a `moat-api` type carry its JSON Schema (generated, under
//! `components/schemas`).

use axum::Json;
use moat_api::runner::{
    Claim, EventsBody, EventsRecorded, FinishBody, Heartbeat, ManifestRefreshed, Next, Recorded,
    Registered, Registration, ResultBody,
};
use moat_api::{ErrorBody, ManifestView, RunView};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Value, json};

/// `(method, path, auth, summary)` of every route.
pub const ROUTES: &[(&str, &str, &str, &str)] = &[
    ("get", "/healthz", "none", "Liveness: 200 `ok`."),
    ("get", "/openapi.json", "none", "This document."),
    (
        "post",
        "/v1/orgs",
        "admin",
        "Create an org; returns its id and its admin token (shown once).",
    ),
    (
        "post",
        "/v1/bootstrap-tokens",
        "org-admin",
        "A single-use runner bootstrap token, valid `ttlSeconds` (default 600, at most 3600).",
    ),
    (
        "post",
        "/v1/agent-tokens",
        "org-admin",
        "A token for an agent: runs, operations, events and artifacts only (no builds, tokens, manifests or revocations).",
    ),
    (
        "get",
        "/v1/runner-builds",
        "org-admin",
        "The runner-build allowlist (SHA-256 of sealed runners).",
    ),
    (
        "post",
        "/v1/runner-builds",
        "org-admin",
        "Allow a runner build: `{sha256, label}`.",
    ),
    (
        "post",
        "/v1/runner-builds/{sha256}/revoke",
        "org-admin",
        "Revoke a runner build: its runners are refused from their next request.",
    ),
    (
        "post",
        "/v1/manifests",
        "org-admin",
        "Publish a signed manifest (signed with this control plane's key, for its environment and policy).",
    ),
    (
        "get",
        "/v1/manifests/current",
        "org-admin",
        "The newest unrevoked manifest of an environment (`?environment=`).",
    ),
    (
        "post",
        "/v1/manifests/{hash}/revoke",
        "org-admin",
        "Revoke a manifest: its runners are refused from their next request.",
    ),
    (
        "post",
        "/v1/signing-keys/revoke",
        "org-admin",
        "Revoke a manifest-signing key: `{publicKey}`.",
    ),
    (
        "get",
        "/v1/runners",
        "org-admin",
        "Registered runners: hash, manifest, policy, version, environment, ops, sandbox mode, boot time, slots (used and free).",
    ),
    (
        "get",
        "/v1/ledger/verify",
        "admin",
        "Recompute the event hash chain.",
    ),
    (
        "get",
        "/v1/runs",
        "org",
        "Runs, newest first (`?state=`, `?limit=`).",
    ),
    (
        "post",
        "/v1/runs",
        "org",
        "Create a run: `{id?, environment?, manifestHash?, maxAttempts?, inputs: [{path, content | contentBase64}]}`; with `manifestHash`, only runners under that manifest claim it. An input (or id) holding one of the org's secrets is refused: 422 `secret_in_input`, recorded as `request.refused`.",
    ),
    ("get", "/v1/runs/{run}", "org", "One run."),
    (
        "post",
        "/v1/runs/{run}/finish",
        "org",
        "The agent is done: the runner finishes the run after its queued operations.",
    ),
    (
        "get",
        "/v1/runs/{run}/ops",
        "org",
        "The run's operations with decisions and results.",
    ),
    (
        "post",
        "/v1/runs/{run}/ops",
        "org",
        "Submit an operation envelope (`id`, `op`, `args`...): decided by policy; 201 queued, 202 waiting for an approval (`approval.id`), 403 denied; `?wait_ms=` waits for the result.",
    ),
    (
        "get",
        "/v1/runs/{run}/ops/{op}",
        "org",
        "One operation (`?wait_ms=` waits until it is final).",
    ),
    (
        "get",
        "/v1/approvals",
        "org",
        "Approval requests, newest first (`?state=pending|approved|denied|expired|all`, `?limit=`).",
    ),
    (
        "get",
        "/v1/approvals/{id}",
        "org",
        "One approval request: the operation's summary, the rule that asked, its risk, expiry and resolution.",
    ),
    (
        "post",
        "/v1/approvals/{id}/approve",
        "org-admin",
        "Approve (`{reason?}`): the operation is queued for the runner at once. 409 if settled or expired.",
    ),
    (
        "post",
        "/v1/approvals/{id}/deny",
        "org-admin",
        "Deny (`{reason}`, required): the operation is denied with `approval_denied`. 409 if settled or expired.",
    ),
    (
        "get",
        "/v1/secrets",
        "org-admin",
        "The org's secret names and when each was set (values are never returned).",
    ),
    (
        "put",
        "/v1/secrets/{name}",
        "org-admin",
        "Set a secret: `{value}` (8 bytes to 64 KiB), sealed with the control plane's secrets key; write-only.",
    ),
    (
        "get",
        "/v1/tools",
        "org",
        "The org's tools (credential proxy).",
    ),
    (
        "post",
        "/v1/tools",
        "org-admin",
        "Define a tool: `{name, method, url, params, credential: {secret, in: header|query|basic, name, prefix}, redact: {drop, mask}, approval, maxResponseBytes}`.",
    ),
    (
        "get",
        "/v1/runs/{run}/events",
        "org",
        "The run's events (`?after=SEQ&limit=`), with their chain hashes.",
    ),
    (
        "get",
        "/v1/runs/{run}/events/stream",
        "org",
        "The run's events as server-sent events (resumes after `Last-Event-ID`).",
    ),
    (
        "get",
        "/v1/runs/{run}/artifacts",
        "org",
        "The run's artifacts: hash, size, kind, label.",
    ),
    (
        "get",
        "/v1/artifacts/{sha256}",
        "org",
        "Download an artifact's bytes.",
    ),
    (
        "get",
        "/v1/artifacts/{sha256}/verify",
        "org",
        "Recompute an artifact's hash.",
    ),
    (
        "post",
        "/v1/tool-tokens/call",
        "tool-token",
        "A program's tool call with its one-operation token (`{tool, params}`): made with the credential, answered redacted and scrubbed; good only while its operation runs.",
    ),
    (
        "post",
        "/v1/runner/register",
        "bootstrap",
        "Register a sealed runner (hashes, manifest, version, environment, ops, sandbox mode, boot time, per-boot public key).",
    ),
    (
        "post",
        "/v1/runner/events",
        "runner",
        "Runner provenance events.",
    ),
    (
        "post",
        "/v1/runner/claim",
        "runner",
        "Claim the next queued run under a lease (`?wait_ms=`); 204 if none.",
    ),
    (
        "get",
        "/v1/runner/manifest",
        "runner",
        "The current manifest of the runner's environment.",
    ),
    (
        "post",
        "/v1/runner/manifest",
        "runner",
        "Report the swap to a refreshed manifest: `{manifestHash}`.",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/next",
        "runner",
        "Renew the lease and take the next operation (with a fresh capability), or `finish`/`ended` (`?wait_ms=`).",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/heartbeat",
        "runner",
        "Renew the lease of a run while an operation runs.",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/ops/{op}/result",
        "runner",
        "Report an operation's result, events and artifacts (recorded once).",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/ops/{op}/tool",
        "runner",
        "Make a dispatched `control-plane-tool-proxy` operation's call: the control plane adds the credential, redacts and scrubs the answer, and records it as the result.",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/finish",
        "runner",
        "End a run: `{state: succeeded|failed, error?}`.",
    ),
];

fn security(auth: &str) -> Value {
    match auth {
        "none" => json!([]),
        "admin" => json!([{"adminToken": []}]),
        "org" => json!([{"apiToken": []}, {"agentToken": []}]),
        "org-admin" => json!([{"apiToken": []}]),
        "bootstrap" => json!([{"bootstrapToken": []}]),
        "tool-token" => json!([{"toolToken": []}]),
        _ => json!([{"runnerSignature": []}]),
    }
}

/// A body's schema, as a `$ref` into `components/schemas`.
type SchemaOf = fn(&mut SchemaGenerator) -> Schema;

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// The typed request body (if any) and the success status and answer of
/// `method path`, where the protocol has types for them.
fn typed(method: &str, path: &str) -> (Option<SchemaOf>, Option<(&'static str, SchemaOf)>) {
    match (method, path) {
        ("post", "/v1/runner/register") => (
            Some(schema::<Registration>),
            Some(("201", schema::<Registered>)),
        ),
        ("post", "/v1/runner/events") => (
            Some(schema::<EventsBody>),
            Some(("200", schema::<EventsRecorded>)),
        ),
        ("post", "/v1/runner/claim") => (None, Some(("200", schema::<Claim>))),
        ("get", "/v1/runner/manifest") | ("get", "/v1/manifests/current") => {
            (None, Some(("200", schema::<ManifestView>)))
        }
        ("post", "/v1/runner/manifest") => (
            Some(schema::<ManifestRefreshed>),
            Some(("200", schema::<ManifestRefreshed>)),
        ),
        ("post", "/v1/runner/runs/{run}/next") => (None, Some(("200", schema::<Next>))),
        ("post", "/v1/runner/runs/{run}/heartbeat") => (None, Some(("200", schema::<Heartbeat>))),
        ("post", "/v1/runner/runs/{run}/ops/{op}/result") => (
            Some(schema::<ResultBody>),
            Some(("200", schema::<Recorded>)),
        ),
        ("post", "/v1/runner/runs/{run}/finish") => (
            Some(schema::<FinishBody>),
            Some(("200", schema::<Recorded>)),
        ),
        ("post", "/v1/runs") => (None, Some(("201", schema::<RunView>))),
        ("get", "/v1/runs/{run}") | ("post", "/v1/runs/{run}/finish") => {
            (None, Some(("200", schema::<RunView>)))
        }
        _ => (None, None),
    }
}

fn json_body(schema: Schema) -> Value {
    json!({"content": {"application/json": {"schema": schema}}})
}

/// The document.
pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "#/components/schemas/".into())
        .into_generator();
    let error = schema::<ErrorBody>(&mut generator);
    let mut paths = serde_json::Map::new();
    for (method, path, auth, summary) in ROUTES {
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let (request, answer) = typed(method, path);
        let mut responses = serde_json::Map::new();
        match answer {
            Some((status, answer)) => {
                let mut ok = json_body(answer(&mut generator));
                ok["description"] = "Success".into();
                responses.insert(status.into(), ok);
            }
            None => {
                responses.insert("200".into(), json!({"description": "OK"}));
            }
        }
        let mut refused = json_body(error.clone());
        refused["description"] = "A refusal: a stable reason and a message".into();
        responses.insert("default".into(), refused);
        let mut operation = json!({
            "summary": summary,
            "parameters": params,
            "security": security(auth),
            "responses": responses,
        });
        if let Some(request) = request {
            let mut body = json_body(request(&mut generator));
            body["required"] = true.into();
            operation["requestBody"] = body;
        }
        let entry = paths.entry((*path).to_owned()).or_insert_with(|| json!({}));
        if let Some(map) = entry.as_object_mut() {
            map.insert((*method).to_owned(), operation);
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Moat control plane", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "adminToken": {"type": "http", "scheme": "bearer", "description": "The admin token (`moat serve --admin-token-file`)."},
                "apiToken": {"type": "http", "scheme": "bearer", "description": "An org's admin token (`POST /v1/orgs`)."},
                "agentToken": {"type": "http", "scheme": "bearer", "description": "An agent token of the org (`POST /v1/agent-tokens`): runs, operations, events and artifacts only."},
                "bootstrapToken": {"type": "http", "scheme": "bearer", "description": "A single-use runner bootstrap token."},
                "toolToken": {"type": "http", "scheme": "bearer", "description": "A one-operation tool token, handed to a program on its stdin (exec_argv `toolToken`)."},
                "runnerSignature": {"type": "apiKey", "in": "header", "name": "x-moat-signature",
                    "description": "Ed25519 signature by the runner's per-boot key over method, path, x-moat-timestamp, x-moat-nonce and the body's SHA-256; with x-moat-runner."},
            },
            "schemas": generator.take_definitions(true),
        },
    })
}

pub async fn serve() -> Json<Value> {
    Json(document())
}
