//! The OpenAPI document of the API, served at `/openapi.json`. Every route
//! of the router is listed in [`ROUTES`]; a test checks the two agree in
//! both directions (against `super::routes()`, which builds the router).
//! Every request and answer body carries its JSON Schema, generated from
//! the `moat-api` types under `components/schemas`.

use axum::Json;
use moat_api::org::{
    ApprovalList, ApprovalView, ArtifactCheck, ArtifactList, Capacity, Drained, EventPage,
    IssuedToken, LedgerCheck, ManifestPublished, NewBootstrapToken, NewOrg, NewRun, NewRunnerBuild,
    NewRunnerEnrolment, NewSecret, NewVolume, OpList, OpRefused, OpSubmission, OpView, OrgCreated,
    QuotaView, Resolution, RevokeKey, Revoked, RunList, RunnerBuild, RunnerBuilds, RunnerEnrolment,
    RunnerEnrolments, Runners, SecretList, SecretView, TokenCall, ToolAnswer, ToolResult,
    VolumeList, VolumeView,
};
use moat_api::queues::{
    KvNamespace, MessageList, MessageSent, MessageView, PutQueue, QueueList, QueueView, SendMessage,
};
use moat_api::runner::{
    ChunkNames, Claim, ElementBody, ElementDecision, EventsBody, EventsRecorded, FinishBody,
    Heartbeat, IngressDials, Janitor, ManifestRefreshed, Next, Recorded, Registered, Registration,
    Released, Reported, ResultBody, ShellEnded, TornDown,
};
use moat_api::{ErrorBody, ManifestView, RunView};
use moat_core::SignedManifest;
use moat_core::event_data::RunResumed;
use moat_core::quota::Quota;

use crate::tools::{ToolDef, ToolList};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Value, json};

/// `(method, path, auth, summary)` of every route.
pub const ROUTES: &[(&str, &str, &str, &str)] = &[
    (
        "get",
        "/healthz",
        "none",
        "Liveness: 200 `ok` while the process serves (the database is not asked).",
    ),
    (
        "get",
        "/readyz",
        "none",
        "Readiness: 200 `ready` when the database answers a statement, else 503.",
    ),
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
        "get",
        "/v1/runner-enrolments",
        "org-admin",
        "Runner enrolments: the identity providers whose tokens register the org's runners.",
    ),
    (
        "post",
        "/v1/runner-enrolments",
        "org-admin",
        "Enrol an identity provider: `{name, issuer, subject, jwks}`. The answer's `audience` (made by the control plane) is the one its tokens must be issued for; such tokens (RS256 or ES256, with an expiry of at most 24 h) then register runners at `/v1/runner/register`, any number of times, e.g. a Kubernetes pod's projected service-account token. 409 if the org has an enrolment of that name.",
    ),
    (
        "post",
        "/v1/runner-enrolments/{id}/revoke",
        "org-admin",
        "Revoke an enrolment: its tokens register no runner, and runners registered with them are refused from their next request (`enrolment_refused`).",
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
        "post",
        "/v1/runners/{runner}/drain",
        "admin-or-org-admin",
        "Drain a runner: it claims nothing new, finishes the runs it holds, then stops (the deployment's admin token, or the admin token of the runner's org).",
    ),
    (
        "get",
        "/v1/capacity",
        "admin-or-org-admin",
        "Per host and runner: slots, CPU and memory (what it may hand out and what runs reserve), classes, labels, draining, tenants present; per org, runs held against the concurrent-run quota. The deployment's admin sees every org; an org's admin sees its own runners and only how many other orgs share their hosts.",
    ),
    (
        "get",
        "/v1/orgs/{org}/quota",
        "admin-or-org-admin",
        "An org's quotas and its use in the current period (an org's admin may read its own).",
    ),
    (
        "put",
        "/v1/orgs/{org}/quota",
        "admin",
        "Set an org's quotas: `{concurrentRuns, cpuSeconds, storageBytes, egressBytes, period: day|month, over: wait|refuse}`, each limit optional; `{}` removes them. Over a quota, new runs wait in the queue (reason `quota_exceeded: ...`), or with `over: refuse` are refused with 429.",
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
        "post",
        "/v1/runs/{run}/cancel",
        "org",
        "Cancel a run (an agent or the admin of its org): it ends `cancelled` at once, its pending operations fail `run_ended`; the runner stops the operation in flight within about two seconds and tears the run down. 409 `not_cancellable` once it has ended.",
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
        "Download an artifact's bytes. A file the export boundary rejected is no artifact: 404, reason `quarantined`, with the run, the path and every broken rule.",
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
        "Register a sealed runner (hashes, manifest, version, environment, ops, sandbox mode, boot time, per-boot public key), with a single-use bootstrap token or an enrolment's token (`/v1/runner-enrolments`).",
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
        "/v1/runner/runs/{run}/ops/{op}/element",
        "runner",
        "Decide a dispatched acting browser step (`click`, `type`, `select`, `fill_secret`) on the element its browser found: `act` with a capability bound to that element, or `held` (it now waits for a person, or was denied). 409 `op_not_dispatched` if the runner is not taking it.",
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
        "End a run: `{state: succeeded|failed, error?, events?, teardown?, thenClaimMs?}`. With `thenClaimMs`, the runner's next run is claimed after the end is recorded, waiting up to that long, as `POST /v1/runner/claim` would: the answer's `claim` (absent when none came in time, or when the runner may claim nothing now: its own claim then says why). One request per run where there were two.",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/shell-ended",
        "runner",
        "What a run's shell recorded as it ended between operations (a refreshed manifest, a drain): the browser sessions it closed. 409 `lease_lost` if the runner no longer holds the run.",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/release",
        "runner",
        "Give a held run back unfinished, at an operation boundary (the runner is stopping): it is queued again and the claim does not count as an attempt (`run.released`). 409 `not_releasable` if the runner does not hold it or an operation of it is dispatched.",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/destroyed",
        "runner",
        "Report the run's teardown on the runner's host: each check (`processes`, `mounts`, `files`, `cgroups`) and its outcome, recorded as `run.destroyed` (a run of the runner's org, whoever holds it now: one whose lease it lost may be another runner's). With `thenClaimMs`, the run's last report, it then claims the slot's next run as a finish does.",
    ),
    (
        "post",
        "/v1/runner/janitor",
        "runner",
        "Report the leftovers of runs this runner no longer holds, torn down at its start, recorded as `runner.janitor`.",
    ),
    (
        "get",
        "/v1/volumes",
        "org",
        "The org's volumes: persistent work areas, each with its newest snapshot (`head`) and the live run attached read-write (`writer`).",
    ),
    (
        "post",
        "/v1/volumes",
        "org",
        "Create an empty volume: `{name}` (lower-case letters, digits, `.`, `_`, `-`). A run attaches it with `volumes: [{volume, path, readOnly?}]` at a persistent root of its manifest. 409 if the org has one of that name.",
    ),
    (
        "get",
        "/v1/volumes/{volume}",
        "org",
        "One volume of the org (404 for any other org's).",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/volumes/{volume}/missing",
        "runner",
        "Which of these chunks the org has not stored (at most 4096 asked at once). Only for a volume attached to a run the runner holds.",
    ),
    (
        "put",
        "/v1/runner/runs/{run}/volumes/{volume}/chunks/{sha256}",
        "runner",
        "Store a chunk of a volume attached read-write to a run the runner holds.",
    ),
    (
        "get",
        "/v1/runner/runs/{run}/volumes/{volume}/chunks/{sha256}",
        "runner",
        "A chunk the org stored, for a volume attached to a run the runner holds (404 for a chunk only another org stored).",
    ),
    (
        "put",
        "/v1/runner/runs/{run}/volumes/{volume}/snapshots/{id}",
        "runner",
        "Store a snapshot of a volume attached read-write: it must parse, pass the restore checks and name only chunks the org stored (409 `chunks_missing` otherwise). It becomes the head only with the result that names it.",
    ),
    (
        "get",
        "/v1/runner/runs/{run}/volumes/{volume}/snapshots/{id}",
        "runner",
        "A snapshot stored for this volume.",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/resumed",
        "runner",
        "The runner that took over a lost run restored its volumes: recorded as `run.resumed` when they are the run's snapshots as it stands.",
    ),
    (
        "get",
        "/v1/queues",
        "org",
        "The org's queues, each with the worker component that consumes it.",
    ),
    (
        "get",
        "/v1/queues/{name}",
        "org",
        "One queue of the org and its consumer.",
    ),
    (
        "put",
        "/v1/queues/{name}",
        "org-admin",
        "Create or replace a queue's consumer: a WebAssembly component (`moduleBase64`, WASI 0.2) invoked once per message in a run of its own (workload class `worker`, on a runner that offers it), with its `args`, `inputs` (files under `input/`, read through its `inputs` binding), the kv namespaces it may read and write (`kv`), the queues it may send to (`sendTo`), `maxAttempts` (1 to 20, default 3) and `backoffMs` (default 1000, doubled per retry). The body may be up to 64 MiB.",
    ),
    (
        "get",
        "/v1/queues/{name}/messages",
        "org",
        "The queue's messages, oldest first (`?state=ready|running|done|dead`; at most 1000).",
    ),
    (
        "post",
        "/v1/queues/{name}/messages",
        "org",
        "Send a message (`body`: any JSON, at most 256 KiB): 201, delivered to a run of the queue's worker. It is acknowledged only when that invocation exits 0 (then its kv writes and sends are made); a failed one is retried after the backoff and dead-lettered after `maxAttempts`. With an `idempotencyKey` already taken in the queue, 200 with the first message and `duplicate: true`: it is not queued again. Each step is a `queue.message` event.",
    ),
    (
        "get",
        "/v1/queues/{name}/messages/{id}",
        "org",
        "One message: its state, attempts, last error and the run of its latest delivery.",
    ),
    (
        "post",
        "/v1/queues/{name}/messages/{id}/redrive",
        "org-admin",
        "Queue a dead-lettered message again, its attempts reset (`queue.message` `redriven`); 409 `not_dead` for any other.",
    ),
    (
        "get",
        "/v1/kv/{namespace}",
        "org",
        "A kv namespace of the org: every key and its value (base64).",
    ),
    (
        "get",
        "/v1/kv/{namespace}/{key}",
        "org",
        "A key's value, as bytes (404 if unset).",
    ),
    (
        "put",
        "/v1/kv/{namespace}/{key}",
        "org",
        "Set a key to the body's bytes (at most 64 KiB). Workers granted the namespace read it from their next delivery.",
    ),
    ("delete", "/v1/kv/{namespace}/{key}", "org", "Delete a key."),
    (
        "any",
        "/v1/runs/{run}/ports/{port}",
        "org",
        "The run's program, listening on `port`: the request (any method; a WebSocket through an upgrade) is carried to it through its runner, without the `Authorization` header, as `/` with its query, `Host: localhost:PORT` and `X-Forwarded-Prefix`. Only while an operation of the run in `ingress-only` exposes the port (else 409 `port_not_exposed`); 504 `runner_unreachable` if the runner opens no tunnel in 15 s. Recorded per connection as `network.ingress` with the operation's result.",
    ),
    (
        "any",
        "/v1/runs/{run}/ports/{port}/",
        "org",
        "As `/v1/runs/{run}/ports/{port}`.",
    ),
    (
        "any",
        "/v1/runs/{run}/ports/{port}/{*path}",
        "org",
        "As `/v1/runs/{run}/ports/{port}`, for the program's path `/PATH`.",
    ),
    (
        "get",
        "/v1/runner/runs/{run}/ingress",
        "runner",
        "Requests to the run's ports waiting for a tunnel (`wait_ms`: long poll, at most 30 s). Only the runner that holds the run.",
    ),
    (
        "post",
        "/v1/runner/runs/{run}/ingress/{conn}",
        "runner",
        "The tunnel for one waiting request: `Connection: upgrade`, `Upgrade: moat-ingress`; after `101` the connection carries that request to the port's socket as HTTP/1.1.",
    ),
];

fn security(auth: &str) -> Value {
    match auth {
        "none" => json!([]),
        "admin" => json!([{"adminToken": []}]),
        "org" => json!([{"apiToken": []}, {"agentToken": []}]),
        "org-admin" => json!([{"apiToken": []}]),
        "admin-or-org-admin" => json!([{"adminToken": []}, {"apiToken": []}]),
        "bootstrap" => json!([{"bootstrapToken": []}, {"enrolmentToken": []}]),
        "tool-token" => json!([{"toolToken": []}]),
        _ => json!([{"runnerSignature": []}]),
    }
}

/// A body's schema, as a `$ref` into `components/schemas`.
type SchemaOf = fn(&mut SchemaGenerator) -> Schema;

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// What an answer carries.
#[derive(Clone, Copy)]
enum Answer {
    Json(SchemaOf),
    /// Another media type, with a plain schema and what it holds.
    Other(&'static str, &'static str),
    /// No body at all (204), and what that means.
    Empty(&'static str),
}

/// What a request carries.
enum Request {
    /// JSON of this schema, and whether a body must be sent.
    Json(SchemaOf, bool),
    /// Raw bytes (required), and what they are.
    Octets(&'static str),
    /// Anything or nothing (a program's own request), and what it is.
    Any(&'static str),
}

/// The request body and the answers of one route.
struct Bodies {
    request: Option<Request>,
    /// `(status, answer)`, success first.
    answers: Vec<(&'static str, Answer)>,
}

fn answers(status: &'static str, answer: SchemaOf) -> Bodies {
    Bodies {
        request: None,
        answers: vec![(status, Answer::Json(answer))],
    }
}

fn takes(request: SchemaOf, status: &'static str, answer: SchemaOf) -> Bodies {
    Bodies {
        request: Some(Request::Json(request, true)),
        answers: vec![(status, Answer::Json(answer))],
    }
}

/// The request body and the answers of `method path`; `None` for a route
/// the document does not know (the router test refuses that).
fn bodies(method: &str, path: &str) -> Option<Bodies> {
    Some(match (method, path) {
        ("get", "/healthz") => Bodies {
            request: None,
            answers: vec![("200", Answer::Other("text/plain", "`ok`"))],
        },
        ("get", "/readyz") => Bodies {
            request: None,
            answers: vec![("200", Answer::Other("text/plain", "`ready`"))],
        },
        ("get", "/openapi.json") => Bodies {
            request: None,
            answers: vec![(
                "200",
                Answer::Other("application/json", "An OpenAPI 3.1 document"),
            )],
        },
        ("post", "/v1/orgs") => takes(schema::<NewOrg>, "201", schema::<OrgCreated>),
        ("post", "/v1/bootstrap-tokens") => {
            takes(schema::<NewBootstrapToken>, "201", schema::<IssuedToken>)
        }
        ("post", "/v1/agent-tokens") => answers("201", schema::<IssuedToken>),
        ("get", "/v1/runner-builds") => answers("200", schema::<RunnerBuilds>),
        ("get", "/v1/runner-enrolments") => answers("200", schema::<RunnerEnrolments>),
        ("post", "/v1/runner-enrolments") => takes(
            schema::<NewRunnerEnrolment>,
            "201",
            schema::<RunnerEnrolment>,
        ),
        ("post", "/v1/runner-enrolments/{id}/revoke") => answers("200", schema::<RunnerEnrolment>),
        ("post", "/v1/runner-builds") => {
            takes(schema::<NewRunnerBuild>, "201", schema::<RunnerBuild>)
        }
        ("post", "/v1/runner-builds/{sha256}/revoke") | ("post", "/v1/manifests/{hash}/revoke") => {
            answers("200", schema::<Revoked>)
        }
        ("post", "/v1/signing-keys/revoke") => takes(schema::<RevokeKey>, "200", schema::<Revoked>),
        ("post", "/v1/manifests") => {
            takes(schema::<SignedManifest>, "201", schema::<ManifestPublished>)
        }
        ("get", "/v1/runner/manifest") | ("get", "/v1/manifests/current") => {
            answers("200", schema::<ManifestView>)
        }
        ("get", "/v1/runners") => answers("200", schema::<Runners>),
        ("post", "/v1/runners/{runner}/drain") => answers("200", schema::<Drained>),
        ("get", "/v1/capacity") => answers("200", schema::<Capacity>),
        ("get", "/v1/orgs/{org}/quota") => answers("200", schema::<QuotaView>),
        ("put", "/v1/orgs/{org}/quota") => takes(schema::<Quota>, "200", schema::<QuotaView>),
        ("get", "/v1/ledger/verify") => answers("200", schema::<LedgerCheck>),
        ("get", "/v1/runs") => answers("200", schema::<RunList>),
        ("post", "/v1/runs") => takes(schema::<NewRun>, "201", schema::<RunView>),
        ("get", "/v1/runs/{run}")
        | ("post", "/v1/runs/{run}/finish")
        | ("post", "/v1/runs/{run}/cancel") => answers("200", schema::<RunView>),
        ("get", "/v1/runs/{run}/ops") => answers("200", schema::<OpList>),
        ("post", "/v1/runs/{run}/ops") => Bodies {
            request: Some(Request::Json(schema::<OpSubmission>, true)),
            answers: vec![
                ("201", Answer::Json(schema::<OpView>)),
                ("200", Answer::Json(schema::<OpView>)),
                ("202", Answer::Json(schema::<OpView>)),
                ("403", Answer::Json(schema::<OpRefused>)),
            ],
        },
        ("get", "/v1/runs/{run}/ops/{op}") => answers("200", schema::<OpView>),
        ("get", "/v1/approvals") => answers("200", schema::<ApprovalList>),
        ("get", "/v1/approvals/{id}") => answers("200", schema::<ApprovalView>),
        ("post", "/v1/approvals/{id}/approve") | ("post", "/v1/approvals/{id}/deny") => Bodies {
            request: Some(Request::Json(schema::<Resolution>, false)),
            answers: vec![("200", Answer::Json(schema::<ApprovalView>))],
        },
        ("get", "/v1/secrets") => answers("200", schema::<SecretList>),
        ("put", "/v1/secrets/{name}") => takes(schema::<NewSecret>, "201", schema::<SecretView>),
        ("get", "/v1/tools") => answers("200", schema::<ToolList>),
        ("post", "/v1/tools") => takes(schema::<ToolDef>, "201", schema::<ToolDef>),
        ("get", "/v1/runs/{run}/events") => answers("200", schema::<EventPage>),
        ("get", "/v1/runs/{run}/events/stream") => Bodies {
            request: None,
            answers: vec![(
                "200",
                Answer::Other(
                    "text/event-stream",
                    "Server-sent events: `id` is the event's `seq`, `data` one `EventView` as JSON",
                ),
            )],
        },
        ("get", "/v1/runs/{run}/artifacts") => answers("200", schema::<ArtifactList>),
        ("get", "/v1/artifacts/{sha256}") => Bodies {
            request: None,
            answers: vec![(
                "200",
                Answer::Other("application/octet-stream", "The artifact's bytes"),
            )],
        },
        ("get", "/v1/artifacts/{sha256}/verify") => answers("200", schema::<ArtifactCheck>),
        ("post", "/v1/tool-tokens/call") => takes(schema::<TokenCall>, "200", schema::<ToolAnswer>),
        ("post", "/v1/runner/register") => {
            takes(schema::<Registration>, "201", schema::<Registered>)
        }
        ("post", "/v1/runner/events") => {
            takes(schema::<EventsBody>, "200", schema::<EventsRecorded>)
        }
        ("post", "/v1/runner/claim") => Bodies {
            request: None,
            answers: vec![
                ("200", Answer::Json(schema::<Claim>)),
                ("204", Answer::Empty("No run is waiting")),
            ],
        },
        ("post", "/v1/runner/manifest") => takes(
            schema::<ManifestRefreshed>,
            "200",
            schema::<ManifestRefreshed>,
        ),
        ("post", "/v1/runner/runs/{run}/next") => Bodies {
            request: None,
            answers: vec![
                ("200", Answer::Json(schema::<Next>)),
                ("204", Answer::Empty("Nothing to do yet: ask again")),
            ],
        },
        ("post", "/v1/runner/runs/{run}/heartbeat") => answers("200", schema::<Heartbeat>),
        ("post", "/v1/runner/runs/{run}/ops/{op}/result") => {
            takes(schema::<ResultBody>, "200", schema::<Recorded>)
        }
        ("post", "/v1/runner/runs/{run}/ops/{op}/element") => {
            takes(schema::<ElementBody>, "200", schema::<ElementDecision>)
        }
        ("post", "/v1/runner/runs/{run}/ops/{op}/tool") => answers("200", schema::<ToolResult>),
        ("post", "/v1/runner/runs/{run}/finish") => {
            takes(schema::<FinishBody>, "200", schema::<Reported>)
        }
        ("post", "/v1/runner/runs/{run}/shell-ended") => {
            takes(schema::<ShellEnded>, "200", schema::<Recorded>)
        }
        ("post", "/v1/runner/runs/{run}/release") => answers("200", schema::<Released>),
        ("post", "/v1/runner/runs/{run}/destroyed") => {
            takes(schema::<TornDown>, "200", schema::<Reported>)
        }
        ("post", "/v1/runner/janitor") => takes(schema::<Janitor>, "200", schema::<Recorded>),
        ("get", "/v1/volumes") => answers("200", schema::<VolumeList>),
        ("post", "/v1/volumes") => takes(schema::<NewVolume>, "201", schema::<VolumeView>),
        ("get", "/v1/volumes/{volume}") => answers("200", schema::<VolumeView>),
        ("post", "/v1/runner/runs/{run}/volumes/{volume}/missing") => {
            takes(schema::<ChunkNames>, "200", schema::<ChunkNames>)
        }
        ("put", "/v1/runner/runs/{run}/volumes/{volume}/chunks/{sha256}") => Bodies {
            request: Some(Request::Octets(
                "The chunk's bytes (1 byte to 2 MiB), which must hash to its name",
            )),
            answers: vec![("200", Answer::Json(schema::<Recorded>))],
        },
        ("put", "/v1/runner/runs/{run}/volumes/{volume}/snapshots/{id}") => Bodies {
            request: Some(Request::Octets(
                "The snapshot's canonical JSON, which must hash to its id",
            )),
            answers: vec![("200", Answer::Json(schema::<Recorded>))],
        },
        ("get", "/v1/runner/runs/{run}/volumes/{volume}/chunks/{sha256}") => Bodies {
            request: None,
            answers: vec![(
                "200",
                Answer::Other("application/octet-stream", "The chunk's bytes"),
            )],
        },
        ("get", "/v1/runner/runs/{run}/volumes/{volume}/snapshots/{id}") => Bodies {
            request: None,
            answers: vec![(
                "200",
                Answer::Other("application/octet-stream", "The snapshot's canonical JSON"),
            )],
        },
        ("post", "/v1/runner/runs/{run}/resumed") => {
            takes(schema::<RunResumed>, "200", schema::<Recorded>)
        }
        ("get", "/v1/queues") => answers("200", schema::<QueueList>),
        ("get", "/v1/queues/{name}") => answers("200", schema::<QueueView>),
        ("put", "/v1/queues/{name}") => takes(schema::<PutQueue>, "200", schema::<QueueView>),
        ("get", "/v1/queues/{name}/messages") => answers("200", schema::<MessageList>),
        ("post", "/v1/queues/{name}/messages") => {
            takes(schema::<SendMessage>, "201", schema::<MessageSent>)
        }
        ("get", "/v1/queues/{name}/messages/{id}") => answers("200", schema::<MessageView>),
        ("post", "/v1/queues/{name}/messages/{id}/redrive") => {
            answers("200", schema::<MessageView>)
        }
        ("get", "/v1/kv/{namespace}") => answers("200", schema::<KvNamespace>),
        ("get", "/v1/kv/{namespace}/{key}") => Bodies {
            request: None,
            answers: vec![(
                "200",
                Answer::Other("application/octet-stream", "The value's bytes"),
            )],
        },
        ("put", "/v1/kv/{namespace}/{key}") => Bodies {
            request: Some(Request::Octets("The value's bytes (at most 64 KiB)")),
            answers: vec![("200", Answer::Json(schema::<serde_json::Value>))],
        },
        ("delete", "/v1/kv/{namespace}/{key}") => answers("200", schema::<serde_json::Value>),
        (
            "any",
            "/v1/runs/{run}/ports/{port}"
            | "/v1/runs/{run}/ports/{port}/"
            | "/v1/runs/{run}/ports/{port}/{*path}",
        ) => Bodies {
            request: Some(Request::Any(
                "Whatever the program takes, passed on as it is",
            )),
            answers: vec![(
                "200",
                Answer::Other("*/*", "Whatever the program answers, as it answers it"),
            )],
        },
        ("get", "/v1/runner/runs/{run}/ingress") => answers("200", schema::<IngressDials>),
        ("post", "/v1/runner/runs/{run}/ingress/{conn}") => Bodies {
            request: None,
            answers: vec![(
                "101",
                Answer::Empty("Switching to the tunnel (`Upgrade: moat-ingress`)"),
            )],
        },
        _ => return None,
    })
}

fn json_body(schema: Schema) -> Value {
    json!({"content": {"application/json": {"schema": schema}}})
}

fn answer_body(answer: Answer, generator: &mut SchemaGenerator) -> Value {
    match answer {
        Answer::Json(schema) => {
            let mut body = json_body(schema(generator));
            body["description"] = "Success".into();
            body
        }
        Answer::Empty(what) => json!({"description": what}),
        Answer::Other(media, what) => {
            let kind = if media == "application/json" {
                "object"
            } else {
                "string"
            };
            json!({
                "description": what,
                "content": {media: {"schema": {"type": kind, "description": what}}},
            })
        }
    }
}

/// The document.
pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "#/components/schemas/".into())
        .into_generator();
    let error = schema::<ErrorBody>(&mut generator);
    let mut paths = serde_json::Map::new();
    for (method, path, auth, summary) in ROUTES {
        // `{*path}` (the rest of the path, slashes and all) is written
        // `{path}` in the document.
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name.trim_start_matches('*'), "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let Bodies { request, answers } = bodies(method, path).unwrap_or(Bodies {
            request: None,
            answers: Vec::new(),
        });
        let mut responses = serde_json::Map::new();
        for (status, answer) in answers {
            responses.insert(status.into(), answer_body(answer, &mut generator));
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
        match request {
            Some(Request::Json(request, required)) => {
                let mut body = json_body(request(&mut generator));
                body["required"] = required.into();
                operation["requestBody"] = body;
            }
            Some(Request::Octets(what)) => {
                operation["requestBody"] = json!({
                    "required": true,
                    "content": {"application/octet-stream": {"schema": {"type": "string", "description": what}}},
                });
            }
            Some(Request::Any(what)) => {
                operation["requestBody"] = json!({
                    "required": false,
                    "content": {"*/*": {"schema": {"type": "string", "description": what}}},
                });
            }
            None => {}
        }
        let entry = paths
            .entry(path.replace("{*", "{"))
            .or_insert_with(|| json!({}));
        let methods: &[&str] = match *method {
            "any" => &["get", "head", "post", "put", "delete", "patch", "options"],
            one => &[one],
        };
        if let Some(map) = entry.as_object_mut() {
            for method in methods {
                map.insert((*method).to_owned(), operation.clone());
            }
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
                "enrolmentToken": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT", "description": "A token from an enrolled identity provider (e.g. a Kubernetes projected service-account token), reusable until it expires."},
                "toolToken": {"type": "http", "scheme": "bearer", "description": "A one-operation tool token, handed to a program on its stdin (exec_argv `toolToken`)."},
                "runnerSignature": {"type": "apiKey", "in": "header", "name": "x-moat-signature",
                    "description": "Ed25519 signature by the runner's per-boot key over method, path, x-moat-timestamp, x-moat-nonce and the body's SHA-256; with x-moat-runner."},
            },
            "schemas": generator.take_definitions(true),
        },
    })
}

/// Routes the document has no bodies for (the test wants none).
pub fn undocumented() -> Vec<(&'static str, &'static str)> {
    ROUTES
        .iter()
        .filter(|(method, path, _, _)| bodies(method, path).is_none())
        .map(|(method, path, _, _)| (*method, *path))
        .collect()
}

pub async fn serve() -> Json<Value> {
    Json(document())
}
