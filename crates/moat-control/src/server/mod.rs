//! `moat serve`: the control plane's HTTP API (axum) over the store.
//!
//! Three kinds of caller, three kinds of credential:
//! - an operator with the admin token creates orgs;
//! - an org's API token drives everything of that org (runs, ops, events,
//!   artifacts, runner builds, manifests, bootstrap tokens) — another org's
//!   objects answer 404, as if they did not exist;
//! - a runner registers once with a single-use bootstrap token, then signs
//!   every request with its per-boot key (see `moat_core::request_sig`).
//!
//! Replicas share nothing but the database: waiting requests (`wait_ms`)
//! are woken at once by changes made in the same process, and by changes
//! another replica announces over PostgreSQL `LISTEN`/`NOTIFY`
//! (`moat_store::ChangeFeed`); they re-check the database every second in
//! case an announcement was lost, and every 100 ms while the listener is
//! down (or on SQLite, where no other replica announces anything).

mod admin_api;
mod approvals;
mod approvals_api;
mod auth;
mod body;
pub(crate) mod capacity;
mod content;
mod element_api;
mod enrolments;
mod error;
mod event_stream;
mod ingress;
mod inputs;
mod inspector;
mod manifests;
mod openapi;
mod org_api;
mod quarantine;
mod queues_api;
mod refusals;
pub mod routes;
mod runner_api;
mod secrets;
mod sweep;
pub mod tls;
mod tools_api;
mod views;
mod volumes_api;
mod wake;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use moat_core::sign::PrivateKey;
use moat_store::{Store, StoreError};

use crate::clock::Clock;
use crate::policy::PolicyEngine;

pub use error::ApiError;
pub use openapi::{ROUTES, document as openapi_document, undocumented as openapi_undocumented};
pub use sweep::once as sweep_once;

/// What the server is configured with.
pub struct Config {
    pub store: Arc<Store>,
    /// Signs capabilities; its public half is what manifests name.
    pub key: PrivateKey,
    pub policy: PolicyEngine,
    /// SHA-256 (hex) of the admin token.
    pub admin_token_hash: String,
    /// The environment this control plane serves (`prod`, `staging`...).
    pub environment: String,
    pub clock: Arc<dyn Clock>,
    /// How long a claim lives without a renewal.
    pub lease: Duration,
    /// How long a capability lives (at most 60 s).
    pub capability_ttl: Duration,
    /// Claims a run gets before it is dead-lettered.
    pub max_attempts: i64,
    /// How long an approval request waits before its operation fails closed.
    pub approval_ttl: Duration,
    /// Seals the credential proxy's secrets (`None`: no secrets can be stored).
    pub vault: Option<crate::vault::Vault>,
    /// Tools may call loopback, private and link-local addresses.
    pub tools_allow_private: bool,
    /// A run with no operation and no approval pending for this long is
    /// finished (`idle_timeout`), freeing its runner's slot.
    pub run_idle_timeout: Duration,
    /// Where files promoted at the export boundary are kept.
    pub outputs: moat_store::Outputs,
    /// The least a runner's host must have to be registered.
    pub host_minimum: moat_core::host::HostMinimum,
    /// Which org's runs may go to which host (`moat serve --placement-policy`).
    pub placement: crate::placement::PlacementEngine,
    /// This replica's own URL for runners' tunnels (`moat serve
    /// --advertise-url`): requests to runs' ports are announced to the
    /// other replicas with it.
    pub advertise_url: Option<String>,
}

/// Shared state of the handlers.
pub struct AppState {
    pub config: Config,
    /// Wakes waiting requests on changes they may care about.
    wakes: Arc<wake::Wakes>,
    /// Other replicas' changes in, ours out (PostgreSQL only).
    feed: Option<moat_store::ChangeFeed>,
    /// The Inspector's last full ledger verification (rate-limited).
    ledger_check: tokio::sync::Mutex<Option<inspector::LedgerCheck>>,
    /// Counters for `/metrics`, fed by every event the store commits.
    pub metrics: Arc<moat_metrics::Metrics>,
    /// Manifests' lifetimes and grace by (org, hash), as every claim and
    /// every next step of a run reads them: what they come from (the
    /// signed manifest and the expiry it was published with) never changes
    /// for a hash; revocation is checked with the runner, not here.
    pub(crate) lifetimes:
        std::sync::Mutex<std::collections::HashMap<(String, String), runner_api::ManifestTerms>>,
    /// Requests to runs' ports waiting for their runners' tunnels.
    ingress: Arc<ingress::Ingress>,
    /// The key each runner last signed with (see `auth::runner`).
    runner_keys: auth::RunnerKeys,
}

impl AppState {
    pub fn new(config: Config) -> Arc<AppState> {
        let wakes = Arc::new(wake::Wakes::new());
        let heard = Arc::clone(&wakes);
        let ingress = Arc::new(ingress::Ingress::default());
        let dialled = Arc::clone(&ingress);
        let feed = config
            .store
            .change_feed(move |change| match change {
                moat_store::Change::All => heard.all(),
                moat_store::Change::Run(run) => heard.topic(&wake::Topic::Run(run)),
                moat_store::Change::Queue { org, environment } => {
                    heard.topic(&wake::Topic::Queue { org, environment })
                }
                moat_store::Change::Dial {
                    run,
                    conn,
                    port,
                    via,
                } => dialled.heard(&run, conn, port, via),
            })
            .unwrap_or_else(|e| {
                eprintln!("moat serve: {e}; other replicas' changes are polled for");
                None
            });
        let metrics = Arc::new(moat_metrics::Metrics::new(moat_metrics::Role::ControlPlane));
        let observer = Arc::clone(&metrics);
        config
            .store
            .observe_appends(Box::new(move |events| observer.observe(events)));
        Arc::new(AppState {
            config,
            wakes,
            feed,
            ledger_check: tokio::sync::Mutex::new(None),
            metrics,
            lifetimes: std::sync::Mutex::default(),
            ingress,
            runner_keys: auth::RunnerKeys::default(),
        })
    }

    /// `/metrics`: the counters, and what waits now (read at the scrape).
    pub async fn metrics_text(self: &Arc<Self>) -> Result<String, ApiError> {
        let waiting = self.db(|s| s.waiting()).await?;
        self.metrics
            .set_waiting(&waiting.queued_runs, waiting.pending_approvals);
        Ok(self.metrics.encode())
    }

    pub fn now(&self) -> i64 {
        self.config.clock.now_ms()
    }

    /// Something changed that any waiting request may care about.
    pub(crate) fn notify(&self) {
        self.wakes.all();
        if let Some(feed) = &self.feed {
            feed.publish(moat_store::Change::All);
        }
    }

    /// Run `run` changed (an operation queued, dispatched or answered):
    /// only the requests waiting on it look again.
    pub(crate) fn notify_run(&self, run: &str) {
        self.wakes.run(run);
        if let Some(feed) = &self.feed {
            feed.publish(moat_store::Change::Run(run.to_owned()));
        }
    }

    /// As [`AppState::notify_run`], by a request that will wait on the run
    /// with `watch` (taken before its change): its own change does not
    /// wake it, so it need not look before it waits.
    pub(crate) fn notify_run_past(&self, run: &str, watch: &mut wake::Watch<'_>) {
        if let Some(own) = self.wakes.run(run) {
            watch.saw(own);
        }
        if let Some(feed) = &self.feed {
            feed.publish(moat_store::Change::Run(run.to_owned()));
        }
    }

    /// A waiter's view of `topic` from now on (see [`AppState::wait_after`]).
    pub(crate) fn watch(&self, topic: wake::Topic) -> wake::Watch<'_> {
        self.wakes.watch(topic)
    }

    /// Org `org` has a run to claim in `environment` (created, or queued
    /// again): one claim of its runners there looks again, here and on
    /// every other replica.
    pub(crate) fn notify_queue(&self, org: &str, environment: &str) {
        self.pass_claim_turn(org, environment);
        if let Some(feed) = &self.feed {
            feed.publish(moat_store::Change::Queue {
                org: org.to_owned(),
                environment: environment.to_owned(),
            });
        }
    }

    /// A claim here got a run: the next waiting claim looks for another
    /// (runs queued while every claim was busy left one turn only).
    pub(crate) fn pass_claim_turn(&self, org: &str, environment: &str) {
        self.wakes.topic(&wake::Topic::Queue {
            org: org.to_owned(),
            environment: environment.to_owned(),
        });
    }

    /// Runs a store call (blocking) where it cannot stall other tasks. On
    /// the multi-threaded runtime `moat serve` runs, in place: the worker
    /// hands its other tasks to another thread and makes the call itself,
    /// rather than pass it to a blocking thread and wait to be woken with
    /// its answer (two thread wake-ups per call, measured at about a fifth
    /// of a millisecond per call on a busy two-core host). On a
    /// current-thread runtime, on the blocking pool.
    async fn db<T: Send + 'static>(
        self: &Arc<Self>,
        call: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let store = Arc::clone(&self.config.store);
        let flavor = tokio::runtime::Handle::current().runtime_flavor();
        let answer = if flavor == tokio::runtime::RuntimeFlavor::MultiThread {
            // A call that panics answers 500, as a blocking task's would,
            // rather than cut the connection.
            let call = std::panic::AssertUnwindSafe(move || call(&store));
            tokio::task::block_in_place(move || std::panic::catch_unwind(call))
                .map_err(|_| ApiError::internal("store task panicked"))?
        } else {
            tokio::task::spawn_blocking(move || call(&store))
                .await
                .map_err(|e| ApiError::internal(format!("store task: {e}")))?
        };
        answer.map_err(ApiError::from)
    }

    /// Calls `probe` until it yields something or `wait` passes; woken by
    /// changes (of `topic`, and general ones) made here or announced by
    /// another replica, and by a timer in case an announcement was lost
    /// (see the module's documentation).
    async fn wait_for<T: Send + 'static>(
        self: &Arc<Self>,
        wait: Duration,
        topic: wake::Topic,
        probe: impl Fn(&Store) -> Result<Option<T>, StoreError> + Send + Sync + Clone + 'static,
    ) -> Result<Option<T>, ApiError> {
        let changes = self.wakes.watch(topic);
        self.wait_after(changes, wait, true, probe).await
    }

    /// As [`AppState::wait_for`], with `changes` taken by the caller before
    /// it made or looked at what it waits on: with `look_first` false, it
    /// waits for a change before calling `probe` (the caller has just
    /// looked itself, or made the state `probe` would find wanting).
    async fn wait_after<T: Send + 'static>(
        self: &Arc<Self>,
        mut changes: wake::Watch<'_>,
        wait: Duration,
        look_first: bool,
        probe: impl Fn(&Store) -> Result<Option<T>, StoreError> + Send + Sync + Clone + 'static,
    ) -> Result<Option<T>, ApiError> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        let mut look = look_first;
        loop {
            if look {
                changes.mark_unchanged();
                let found = self.db(probe.clone()).await?;
                if found.is_some() {
                    return Ok(found);
                }
            }
            look = true;
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            let recheck = if self.feed.as_ref().is_some_and(|f| f.listening()) {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(100)
            };
            let tick = (tokio::time::Instant::now() + recheck).min(deadline);
            let _ = tokio::time::timeout_at(tick, changes.changed()).await;
        }
    }
}

/// Readiness (a load balancer's or Kubernetes' probe): the database answers.
async fn ready(
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
) -> error::ApiResult<&'static str> {
    state.db(|s| s.ping()).await?;
    Ok("ready")
}

/// The longest a request may wait for something to happen.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// The API's routes.
/// Every route of the API (the Inspector's pages are added by `router`).
pub fn routes() -> routes::Routes {
    use routes::{ANY, DELETE, GET, POST, PUT};
    routes::Routes::default()
        .on(GET, "/healthz", || async { "ok" })
        .on(GET, "/readyz", ready)
        .on(GET, "/openapi.json", openapi::serve)
        .on(POST, "/v1/orgs", admin_api::create_org)
        .on(
            POST,
            "/v1/bootstrap-tokens",
            admin_api::create_bootstrap_token,
        )
        .on(POST, "/v1/agent-tokens", admin_api::create_agent_token)
        .on(GET, "/v1/runner-builds", admin_api::list_builds)
        .on(POST, "/v1/runner-builds", admin_api::allow_build)
        .on(
            POST,
            "/v1/runner-builds/{sha256}/revoke",
            admin_api::revoke_build,
        )
        .on(GET, "/v1/runner-enrolments", enrolments::list)
        .on(POST, "/v1/runner-enrolments", enrolments::create)
        .on(
            POST,
            "/v1/runner-enrolments/{id}/revoke",
            enrolments::revoke,
        )
        .on(POST, "/v1/manifests", admin_api::publish_manifest)
        .on(GET, "/v1/manifests/current", admin_api::current_manifest)
        .on(
            POST,
            "/v1/manifests/{hash}/revoke",
            admin_api::revoke_manifest,
        )
        .on(POST, "/v1/signing-keys/revoke", admin_api::revoke_key)
        .on(GET, "/v1/runners", admin_api::list_runners)
        .on(POST, "/v1/runners/{runner}/drain", capacity::drain)
        .on(GET, "/v1/capacity", capacity::capacity)
        .on(GET, "/v1/orgs/{org}/quota", capacity::get_quota)
        .on(PUT, "/v1/orgs/{org}/quota", capacity::put_quota)
        .on(GET, "/v1/ledger/verify", admin_api::verify_ledger)
        .on(GET, "/v1/runs", org_api::list_runs)
        .on(POST, "/v1/runs", org_api::create_run)
        .on(GET, "/v1/runs/{run}", org_api::get_run)
        .on(POST, "/v1/runs/{run}/finish", org_api::finish_run)
        .on(POST, "/v1/runs/{run}/cancel", org_api::cancel_run)
        .on(GET, "/v1/runs/{run}/ops", org_api::list_ops)
        .on(POST, "/v1/runs/{run}/ops", org_api::post_op)
        .on(GET, "/v1/runs/{run}/ops/{op}", org_api::get_op)
        .on(GET, "/v1/runs/{run}/events", org_api::events)
        .on(GET, "/v1/runs/{run}/events/stream", org_api::event_stream)
        .on(GET, "/v1/runs/{run}/artifacts", org_api::list_artifacts)
        .on(GET, "/v1/artifacts/{sha256}", org_api::download_artifact)
        .on(
            GET,
            "/v1/artifacts/{sha256}/verify",
            org_api::verify_artifact,
        )
        .on(GET, "/v1/approvals", approvals_api::list)
        .on(GET, "/v1/approvals/{id}", approvals_api::show)
        .on(POST, "/v1/approvals/{id}/approve", approvals_api::approve)
        .on(POST, "/v1/approvals/{id}/deny", approvals_api::deny)
        .on(GET, "/v1/secrets", tools_api::list_secrets)
        .on(PUT, "/v1/secrets/{name}", tools_api::put_secret)
        .on(GET, "/v1/tools", tools_api::list_tools)
        .on(POST, "/v1/tools", tools_api::put_tool)
        .on(POST, "/v1/runner/runs/{run}/ops/{op}/tool", tools_api::call)
        .on(POST, "/v1/tool-tokens/call", tools_api::token_call)
        .on(POST, "/v1/runner/register", runner_api::register)
        .on(POST, "/v1/runner/events", runner_api::events)
        .on(POST, "/v1/runner/claim", runner_api::claim)
        .on(GET, "/v1/runner/manifest", runner_api::manifest)
        .on(POST, "/v1/runner/manifest", runner_api::refreshed)
        .on(POST, "/v1/runner/runs/{run}/next", runner_api::next)
        .on(
            POST,
            "/v1/runner/runs/{run}/heartbeat",
            runner_api::heartbeat,
        )
        .on(
            POST,
            "/v1/runner/runs/{run}/ops/{op}/result",
            runner_api::result,
        )
        .on(
            POST,
            "/v1/runner/runs/{run}/ops/{op}/element",
            element_api::element,
        )
        .on(POST, "/v1/runner/runs/{run}/finish", runner_api::finish)
        .on(
            POST,
            "/v1/runner/runs/{run}/shell-ended",
            runner_api::shell_ended,
        )
        .on(POST, "/v1/runner/runs/{run}/release", runner_api::release)
        .on(
            POST,
            "/v1/runner/runs/{run}/destroyed",
            runner_api::destroyed,
        )
        .on(POST, "/v1/runner/janitor", runner_api::janitor)
        .on(GET, "/v1/volumes", volumes_api::list)
        .on(POST, "/v1/volumes", volumes_api::create)
        .on(GET, "/v1/volumes/{volume}", volumes_api::show)
        .on(
            POST,
            "/v1/runner/runs/{run}/volumes/{volume}/missing",
            volumes_api::missing,
        )
        .on(
            PUT,
            "/v1/runner/runs/{run}/volumes/{volume}/chunks/{sha256}",
            volumes_api::put_chunk,
        )
        .on(
            GET,
            "/v1/runner/runs/{run}/volumes/{volume}/chunks/{sha256}",
            volumes_api::get_chunk,
        )
        .on(
            PUT,
            "/v1/runner/runs/{run}/volumes/{volume}/snapshots/{id}",
            volumes_api::put_snapshot,
        )
        .on(
            GET,
            "/v1/runner/runs/{run}/volumes/{volume}/snapshots/{id}",
            volumes_api::get_snapshot,
        )
        .on(POST, "/v1/runner/runs/{run}/resumed", volumes_api::resumed)
        .on(GET, "/v1/queues", queues_api::list_queues)
        .on(GET, "/v1/queues/{name}", queues_api::show_queue)
        .on(PUT, "/v1/queues/{name}", queues_api::put_queue)
        .on(GET, "/v1/queues/{name}/messages", queues_api::list_messages)
        .on(POST, "/v1/queues/{name}/messages", queues_api::send)
        .on(
            GET,
            "/v1/queues/{name}/messages/{id}",
            queues_api::show_message,
        )
        .on(
            POST,
            "/v1/queues/{name}/messages/{id}/redrive",
            queues_api::redrive,
        )
        .on(GET, "/v1/kv/{namespace}", queues_api::kv_list)
        .on(GET, "/v1/kv/{namespace}/{key}", queues_api::kv_get)
        .on(PUT, "/v1/kv/{namespace}/{key}", queues_api::kv_put)
        .on(DELETE, "/v1/kv/{namespace}/{key}", queues_api::kv_delete)
        .on(ANY, "/v1/runs/{run}/ports/{port}", ingress::port)
        .on(ANY, "/v1/runs/{run}/ports/{port}/", ingress::port)
        .on(ANY, "/v1/runs/{run}/ports/{port}/{*path}", ingress::port)
        .on(GET, "/v1/runner/runs/{run}/ingress", ingress::dials)
        .on(
            POST,
            "/v1/runner/runs/{run}/ingress/{conn}",
            ingress::tunnel,
        )
}

pub fn router(state: Arc<AppState>) -> Router {
    routes()
        .into_router()
        .merge(inspector::routes(Arc::clone(&state)))
        .layer(axum::extract::DefaultBodyLimit::max(SMALL_BODY))
        .with_state(state)
}

/// How long requests in flight get once a stop is asked for.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// The largest request body: a run with its inputs, or a runner's result
/// with its artifacts (they travel inline).
pub const MAX_BODY: usize = 64 << 20;

/// The largest body anywhere else (parsed before the token is checked, so
/// kept small).
pub const SMALL_BODY: usize = 1 << 20;

/// Serves `router` on `listener` with the background sweeps, until
/// `shutdown`; over TLS with `tls` (`moat serve --tls-cert --tls-key`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<()> {
    match tls {
        Some(config) => {
            let listener = tls::TlsListener::new(listener, config)?;
            serve_on(listener, state, shutdown).await
        }
        None => {
            use axum::serve::ListenerExt as _;
            // Small answers go out at once (no Nagle wait for the peer's ACK).
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            serve_on(listener, state, shutdown).await
        }
    }
}

/// Serves `GET /metrics` (Prometheus' text format) on `listener` until
/// `shutdown`: a listener of its own (`moat serve --metrics-listen`), so
/// that scrapes need no token and the API's port need not be open to them.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    async fn metrics(
        axum::extract::State(state): axum::extract::State<Arc<AppState>>,
    ) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        match state.metrics_text().await {
            Ok(text) => (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                text,
            )
                .into_response(),
            Err(e) => e.into_response(),
        }
    }
    let router = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .with_state(state);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn serve_on<L>(
    listener: L,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let sweeper = tokio::spawn(sweep::run(Arc::clone(&state)));
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
        shutdown.await;
        let _ = stopping.send(());
    });
    // Waiting requests (long polls) get a moment to finish, not their full wait.
    let result = tokio::select! {
        result = server => result,
        _ = async {
            let _ = stopped.await;
            tokio::time::sleep(STOP_GRACE).await;
        } => Ok(()),
    };
    sweeper.abort();
    result
}
