//! Ports of a managed run's program (`ingress-only`), reached by the org
//! through `/v1/runs/{run}/ports/{port}/...` (HTTP, and WebSocket through
//! an upgrade). The runner holds no listening socket and the control plane
//! never connects to it: for each request the control plane puts a *dial*
//! in the run's queue, the runner that holds the run takes it (a long poll,
//! `GET /v1/runner/runs/{run}/ingress`) and opens a tunnel back
//! (`POST /v1/runner/runs/{run}/ingress/{conn}`, signed, upgraded to
//! `moat-ingress`), which it joins to the port's socket in its sandbox's
//! network namespace. The request then travels through that tunnel as
//! HTTP/1.1, one connection per request.
//!
//! Only a port of the operation in flight that asked for it (an
//! `exec_argv` in `ingress-only` with `expose`) is routed; the caller's
//! `Authorization` never reaches the program. Dials and waiting requests
//! live in this replica's memory: the runner's poll and tunnel must reach
//! the replica that holds the request (one replica, or sticky routing of
//! `/v1/runner/runs/{run}/ingress*` and `/v1/runs/{run}/ports/*` by run),
//! or, on PostgreSQL, each replica started with `--advertise-url` (its own
//! address as runners reach it): a request is then announced to every
//! replica (`moat_store::Change::Dial`), and the runner opens its tunnel to
//! the replica that holds it, wherever it asked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequest as _, Path, Query, Request, State};
use axum::http::Method;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Redirect;
use axum::response::{IntoResponse, Response};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use moat_api::runner::{IngressDial, IngressDials};
use moat_core::NetworkMode;
use moat_core::op::ExecArgvArgs;
use moat_egress::idle::{Activity, Watched, copy_until_idle};
use tokio::sync::{Notify, oneshot};

use super::AppState;
use super::auth;
use super::auth::SignedRunner;
use super::error::{ApiError, ApiResult};

/// How long a request waits for the runner's tunnel.
const TUNNEL_WAIT: Duration = Duration::from_secs(15);

/// Requests waiting for a tunnel, per run: more are refused (503).
const MAX_WAITING_PER_RUN: usize = 256;

/// Added to every answer of a program (besides any policy of its own).
const PAGE_POLICY: &str = "sandbox allow-scripts";

/// A tunnel, or a caller's connection switched through one, with nothing
/// moving either way for this long is closed.
const IDLE: Duration = Duration::from_secs(300);

/// The protocol a runner's tunnel is upgraded to.
pub const TUNNEL_PROTOCOL: &str = "moat-ingress";

/// Dials waiting for their runner, and requests waiting for their tunnel.
#[derive(Default)]
pub struct Ingress {
    hub: Mutex<Hub>,
}

#[derive(Default)]
struct Hub {
    runs: HashMap<String, RunDials>,
    waiting: HashMap<String, Waiting>,
}

#[derive(Default)]
struct RunDials {
    /// Each with when it was queued: one nobody took in time is dropped.
    dials: Vec<(IngressDial, tokio::time::Instant)>,
    ready: Arc<Notify>,
}

struct Waiting {
    run: String,
    tunnel: oneshot::Sender<Upgraded>,
}

/// A request's place in the hub, given up when it is done or abandoned
/// (its caller went away): a dial nobody waits for is not handed out.
struct Placed<'a> {
    ingress: &'a Ingress,
    run: String,
    conn: String,
}

impl Drop for Placed<'_> {
    fn drop(&mut self) {
        let mut hub = self.ingress.lock();
        hub.waiting.remove(&self.conn);
        if let Some(run) = hub.runs.get_mut(&self.run) {
            run.dials.retain(|(d, _)| d.conn != self.conn);
        }
        hub.forget_idle(&self.run);
    }
}

impl Hub {
    /// Hands `dial` to `run`'s runner at its next ask. A run's queue is
    /// bounded: past it, the oldest dial goes (its request will time out).
    fn queue(&mut self, run: &str, dial: IngressDial) {
        let dials = self.runs.entry(run.to_owned()).or_default();
        if dials.dials.len() >= MAX_WAITING_PER_RUN {
            dials.dials.remove(0);
        }
        dials.dials.push((dial, tokio::time::Instant::now()));
        dials.ready.notify_one();
    }

    fn forget_idle(&mut self, run: &str) {
        let idle = self
            .runs
            .get(run)
            .is_some_and(|r| r.dials.is_empty() && Arc::strong_count(&r.ready) == 1)
            && !self.waiting.values().any(|w| w.run == run);
        if idle {
            self.runs.remove(run);
        }
    }
}

impl Ingress {
    fn lock(&self) -> std::sync::MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a dial of `port` for `run`'s runner; the tunnel comes
    /// through the receiver.
    fn place(&self, run: &str, port: u16) -> ApiResult<(Placed<'_>, oneshot::Receiver<Upgraded>)> {
        let conn = moat_core::random::hex(16);
        let (send, receive) = oneshot::channel();
        let mut hub = self.lock();
        let queued = hub.waiting.values().filter(|w| w.run == run).count();
        if queued >= MAX_WAITING_PER_RUN {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                format!("{queued} requests to run {run}'s ports wait for its runner already"),
            ));
        }
        hub.waiting.insert(
            conn.clone(),
            Waiting {
                run: run.to_owned(),
                tunnel: send,
            },
        );
        hub.queue(
            run,
            IngressDial {
                conn: conn.clone(),
                port,
                via: None,
            },
        );
        drop(hub);
        Ok((
            Placed {
                ingress: self,
                run: run.to_owned(),
                conn,
            },
            receive,
        ))
    }

    /// The dials of `run` waiting now, or the first to come within `wait`.
    async fn take(&self, run: &str, wait: Duration) -> Vec<IngressDial> {
        /// Forgets the run's queue when empty once the ask ends, however it
        /// ends (its caller may go away mid-wait).
        struct Asking<'a>(&'a Ingress, &'a str);
        impl Drop for Asking<'_> {
            fn drop(&mut self) {
                self.0.lock().forget_idle(self.1);
            }
        }
        let _asking = Asking(self, run);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let ready = {
                let mut hub = self.lock();
                let dials = hub.runs.entry(run.to_owned()).or_default();
                dials.dials.retain(|(_, at)| at.elapsed() < TUNNEL_WAIT);
                if !dials.dials.is_empty() {
                    return std::mem::take(&mut dials.dials)
                        .into_iter()
                        .map(|(dial, _)| dial)
                        .collect();
                }
                Arc::clone(&dials.ready)
            };
            let woken = tokio::time::timeout_at(deadline, ready.notified()).await;
            drop(ready);
            if woken.is_err() {
                return Vec::new();
            }
        }
    }

    /// Another replica holds a request to `port` of `run`, waiting for a
    /// tunnel to `via`: handed to the runner if it asks here.
    pub fn heard(&self, run: &str, conn: String, port: u16, via: String) {
        self.lock().queue(
            run,
            IngressDial {
                conn,
                port,
                via: Some(via),
            },
        );
    }

    /// The request waiting on `conn`, if it is `run`'s.
    fn claim(&self, run: &str, conn: &str) -> Option<oneshot::Sender<Upgraded>> {
        let mut hub = self.lock();
        if hub.waiting.get(conn).is_none_or(|w| w.run != run) {
            return None;
        }
        hub.waiting.remove(conn).map(|w| w.tunnel)
    }
}

/// The port of `run` the org asked for, checked: the run is the org's and
/// an operation in flight exposes the port.
async fn exposed(state: &Arc<AppState>, org: &str, run: &str, port: &str) -> ApiResult<u16> {
    let port: u16 = port
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{port:?} is not a port (1-65535)")))?;
    let (o, r) = (org.to_owned(), run.to_owned());
    let Some(_) = state.db(move |s| s.run(&o, &r)).await? else {
        return Err(ApiError::not_found(format!("run {run}")));
    };
    let (o, r) = (org.to_owned(), run.to_owned());
    let ops = state.db(move |s| s.dispatched_ops(&o, &r)).await?;
    let serves = ops.iter().any(|op| {
        let Ok(envelope) = serde_json::from_value::<moat_core::Envelope>(op.envelope.clone())
        else {
            return false;
        };
        let Ok(args) = serde_json::from_value::<ExecArgvArgs>(envelope.args.clone()) else {
            return false;
        };
        let network = args.network.or(envelope.network);
        envelope.op == "exec_argv"
            && network == Some(NetworkMode::IngressOnly)
            && args.expose.contains(&port)
    });
    if !serves {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "port_not_exposed",
            format!(
                "no operation of run {run} exposes port {port} now (an exec_argv in network \
                 ingress-only with \"expose\": [{port}], while it runs)"
            ),
        ));
    }
    Ok(port)
}

/// `ANY /v1/runs/{run}/ports/{port}` (and with a slash and a path). The
/// run, the port and the path below it are read from the path as the
/// caller sent it: the program decodes its own path, whatever bytes it
/// escapes.
pub async fn port(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    request: Request,
) -> Response {
    let raw = request.uri().path().to_owned();
    let mut segments = raw.splitn(7, '/');
    let (Some(run), Some(port)) = (segments.nth(3), segments.nth(1)) else {
        return ApiError::bad_request("a run's port is /v1/runs/RUN/ports/PORT/...")
            .into_response();
    };
    let rest = segments.next();
    // `/ports/8000` is the program's `/`: relative links on its pages
    // resolve against `/ports/8000/`, where a browser-like caller is sent.
    if rest.is_none() && matches!(*request.method(), Method::GET | Method::HEAD) {
        let query = request
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        return Redirect::permanent(&format!("{raw}/{query}")).into_response();
    }
    match relayed(&state, &org, run, port, rest.unwrap_or_default(), request).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn relayed(
    state: &Arc<AppState>,
    org: &str,
    run: &str,
    port: &str,
    path: &str,
    mut request: Request,
) -> ApiResult<Response> {
    let port = exposed(state, org, run, port).await?;
    let upgrade = wants_upgrade(request.headers()).then(|| hyper::upgrade::on(&mut request));
    let (placed, tunnel) = state.ingress.place(run, port)?;
    // The run's runner may ask another replica: tell them where to send it.
    if let (Some(via), Some(feed)) = (&state.config.advertise_url, &state.feed) {
        feed.publish(moat_store::Change::Dial {
            run: run.to_owned(),
            conn: placed.conn.clone(),
            port,
            via: via.clone(),
        });
    }
    let tunnel = match tokio::time::timeout(TUNNEL_WAIT, tunnel).await {
        Ok(Ok(tunnel)) => tunnel,
        Ok(Err(_)) => {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "runner_unreachable",
                format!("run {run}'s runner's tunnel to port {port} failed as it opened"),
            ));
        }
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "runner_unreachable",
                format!(
                    "run {run}'s runner did not open a tunnel to port {port} within {} s",
                    TUNNEL_WAIT.as_secs()
                ),
            ));
        }
    };
    drop(placed);
    let bad_gateway = |e: hyper::Error| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "bad_gateway",
            format!(
                "port {port} of run {run}: the program closed the connection or does not \
                 listen on the port ({e})"
            ),
        )
    };
    // A runner or program that goes silent frees the connection in time.
    let activity = Activity::new();
    let watched = Watched::new(TokioIo::new(tunnel), activity.clone());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(watched))
        .await
        .map_err(bad_gateway)?;
    let watchdog = activity.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = connection.with_upgrades() => {}
            () = watchdog.idle(IDLE) => {}
        }
    });
    let forwarded = forwarded_request(request, run, port, path)?;
    let mut response = sender.send_request(forwarded).await.map_err(bad_gateway)?;
    if let (Some(client), StatusCode::SWITCHING_PROTOCOLS) = (upgrade, response.status()) {
        let program = hyper::upgrade::on(&mut response);
        tokio::spawn(join_upgraded(client, program));
        let (mut parts, _) = response.into_parts();
        guard_answer(&mut parts.headers, true);
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = response.into_parts();
    guard_answer(&mut parts.headers, false);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Answer headers a program may not set on the control plane's origin:
/// cookies (the Inspector's session is a cookie), site data, transport
/// and caching rules for the whole host, and a front proxy's internal
/// redirects.
const WITHHELD_ANSWER_HEADERS: &[&str] = &[
    "set-cookie",
    "set-cookie2",
    "clear-site-data",
    "strict-transport-security",
    "alt-svc",
    "public-key-pins",
    "public-key-pins-report-only",
    "expect-ct",
    "x-sendfile",
    "x-lighttpd-send-file",
    "origin-agent-cluster",
    "service-worker-allowed",
];

/// The program's answer headers as the caller gets them: one hop's and
/// the withheld ones gone, never stored by a shared cache (the answer is
/// an org's), and a page a browser shows runs as a sandboxed document of
/// an origin of its own, which cannot script the API or the Inspector.
fn guard_answer(headers: &mut HeaderMap, switching: bool) {
    strip_hop_by_hop(headers, switching);
    for name in WITHHELD_ANSWER_HEADERS {
        headers.remove(*name);
    }
    let internal: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("x-accel-"))
        .cloned()
        .collect();
    for name in internal {
        headers.remove(name);
    }
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    headers.append(header::VARY, HeaderValue::from_static("authorization"));
    headers.append(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PAGE_POLICY),
    );
}

/// Copies both ways between the caller's upgraded connection and the
/// program's, until either side closes or both go silent.
async fn join_upgraded(client: OnUpgrade, program: OnUpgrade) {
    let (Ok(client), Ok(program)) = (client.await, program.await) else {
        return;
    };
    let _ = copy_until_idle(TokioIo::new(client), TokioIo::new(program), IDLE).await;
}

/// Whether the caller asks to switch protocols (a WebSocket).
fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Headers that belong to one hop (RFC 9110 7.6.1), and the ones named in
/// `Connection`; `keep_upgrade` keeps `Connection: upgrade` and `Upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::try_from(t.trim()).ok())
        .collect();
    for name in named {
        if !(keep_upgrade && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
    if !keep_upgrade {
        headers.remove(header::UPGRADE);
    } else if headers.contains_key(header::UPGRADE) {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The caller's request as the program gets it: its path below the port,
/// its query, its headers less the caller's credentials and hop-by-hop
/// ones, `Host: localhost:PORT` and the prefix it was reached under.
fn forwarded_request(
    request: Request,
    run: &str,
    port: u16,
    path: &str,
) -> ApiResult<axum::http::Request<Body>> {
    let (mut parts, body) = request.into_parts();
    let target = match parts.uri.query() {
        Some(query) => format!("/{path}?{query}"),
        None => format!("/{path}"),
    };
    parts.uri = target
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{target:?} is not a request target")))?;
    parts.version = axum::http::Version::HTTP_11;
    let upgrade = wants_upgrade(&parts.headers);
    strip_hop_by_hop(&mut parts.headers, upgrade);
    // The caller's credentials, and what proxies in front said about it.
    for name in [
        "authorization",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-forwarded-port",
        "x-real-ip",
    ] {
        parts.headers.remove(name);
    }
    parts.headers.insert(
        header::HOST,
        HeaderValue::from_str(&format!("localhost:{port}"))
            .map_err(|_| ApiError::internal("a Host header"))?,
    );
    if let Ok(prefix) = HeaderValue::from_str(&format!("/v1/runs/{run}/ports/{port}")) {
        parts
            .headers
            .insert(HeaderName::from_static("x-forwarded-prefix"), prefix);
    }
    parts.extensions = axum::http::Extensions::new();
    Ok(axum::http::Request::from_parts(parts, body))
}

/// The run `run` if the signing runner holds it now.
async fn held(state: &Arc<AppState>, runner: &moat_store::RunnerRow, run: &str) -> ApiResult<()> {
    let (org, id) = (runner.org_id.clone(), run.to_owned());
    state
        .db(move |s| s.run(&org, &id))
        .await?
        .filter(|r| r.runner_id.as_deref() == Some(runner.id.as_str()) && !r.state.is_final())
        .map(|_| ())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "lease_lost",
                format!("this runner does not hold run {run}"),
            )
        })
}

#[derive(serde::Deserialize)]
pub struct WaitQuery {
    wait_ms: Option<u64>,
}

/// `GET /v1/runner/runs/{run}/ingress`.
pub async fn dials(
    State(state): State<Arc<AppState>>,
    Path(run): Path<String>,
    Query(q): Query<WaitQuery>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Json<IngressDials>> {
    held(&state, &runner, &run).await?;
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(0)).min(super::MAX_WAIT);
    let dials = state.ingress.take(&run, wait).await;
    Ok(Json(IngressDials { dials }))
}

/// `POST /v1/runner/runs/{run}/ingress/{conn}`: the runner's tunnel for one
/// dial, upgraded to [`TUNNEL_PROTOCOL`].
pub async fn tunnel(
    State(state): State<Arc<AppState>>,
    Path((run, conn)): Path<(String, String)>,
    mut request: Request,
) -> ApiResult<Response> {
    let asks_tunnel = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(TUNNEL_PROTOCOL));
    if !asks_tunnel || !wants_upgrade(request.headers()) {
        return Err(ApiError::bad_request(format!(
            "a tunnel is asked with Connection: upgrade and Upgrade: {TUNNEL_PROTOCOL}"
        )));
    }
    let upgraded = hyper::upgrade::on(&mut request);
    let SignedRunner { runner, .. } = SignedRunner::from_request(request, &state).await?;
    held(&state, &runner, &run).await?;
    let waiting = state.ingress.claim(&run, &conn).ok_or_else(|| {
        ApiError::not_found(format!(
            "request {conn} waiting for run {run} (it gave up, or was served)"
        ))
    })?;
    tokio::spawn(async move {
        if let Ok(tunnel) = upgraded.await {
            let _ = waiting.send(tunnel);
        }
    });
    Ok((
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, "upgrade"),
            (header::UPGRADE, TUNNEL_PROTOCOL),
        ],
    )
        .into_response())
}
