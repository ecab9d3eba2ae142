//! `moat serve`: the control plane.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use moat_control::PolicyEngine;
use moat_control::clock::SystemClock;
use moat_control::placement::PlacementEngine;
use moat_control::server::{self, AppState, Config};
use moat_store::{Outputs, Store};

use crate::manifest;

const ABOUT: &str = "\
Serves the control plane's HTTP API: orgs and API tokens, runs and their
operations (each decided by the Cedar policy; an allow becomes a signed,
60-second capability bound to the operation), events (also as server-sent
events), artifacts, the runner-build allowlist, manifests, runner
registration and signed runner requests. The API is described at
/openapi.json; docs/control-plane.md walks through it.

Storage is one SQLite file by default; with a PostgreSQL URL several
replicas can serve the same database (runs are claimed with
FOR UPDATE SKIP LOCKED). The PostgreSQL password, if any, comes from
--db-password-file or PGPASSWORD, never from the command line. TLS to PostgreSQL is libpq's
sslmode and sslrootcert in the URL, e.g.
postgres://moat@db/moat?sslmode=verify-full&sslrootcert=/etc/moat/db-ca.pem
(sslrootcert=system: the machine's trust store). GET /healthz is liveness,
GET /readyz readiness (503 while the database does not answer).

With --tls-cert and --tls-key it serves HTTPS (TLS 1.2 and 1.3, HTTP/1.1);
a runner or operator command that should trust only your own CA
takes --ca-file.

  moat manifest keygen --out cp            # cp.key, cp.pub
  head -c 32 /dev/urandom | base64 > admin-token
  moat serve --key cp.key --policy policy.cedar --admin-token-file admin-token";

/// Run the control plane (HTTP API).
#[derive(Args)]
#[command(after_long_help = ABOUT)]
pub struct ServeArgs {
    /// `sqlite:PATH` or `postgres://USER@HOST/DB` (or a libpq key=value string).
    #[arg(long, value_name = "URL", default_value = "sqlite:moat-control.db")]
    db: String,
    /// Where files promoted at the export boundary are kept (the trusted
    /// output store), by content: a directory (an absolute path or
    /// file:///DIR), s3://BUCKET[/PREFIX] (credentials, region and endpoint
    /// from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, and
    /// AWS_ENDPOINT for an S3-compatible server, with AWS_ALLOW_HTTP=true
    /// for one without TLS), or `database`. Default: the directory
    /// PATH-outputs beside an SQLite database; the database itself over
    /// PostgreSQL, which every replica shares. Checked at start-up with a
    /// small probe object (moat/probe).
    #[arg(long, value_name = "WHERE")]
    outputs: Option<String>,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700")]
    listen: String,
    /// This replica's own URL, as runners reach it directly (not through
    /// the load balancer): with several replicas on PostgreSQL, a request
    /// to a run's port that arrives here is announced to the others, and
    /// the run's runner opens its tunnel to URL, wherever it polls. Same
    /// scheme as the runners' --control-plane.
    #[arg(long, value_name = "URL")]
    advertise_url: Option<String>,
    /// Also serve Prometheus metrics at http://ADDR/metrics, without a token
    /// (runs finished, operations by kind and status, refusals by layer,
    /// teardowns, programs' CPU and egress, queued runs, pending approvals):
    /// counts and names of environments and operation kinds, nothing else.
    /// Bind it where only your Prometheus reaches, e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (the server's certificate
    /// first; with --tls-key). Runners and operator commands trust a private
    /// CA with --ca-file.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// File holding the PostgreSQL password (instead of PGPASSWORD; the
    /// URL must then hold none). It must not be readable by every user; one
    /// trailing newline is ignored.
    #[arg(long, value_name = "FILE")]
    db_password_file: Option<PathBuf>,
    /// The control plane's private key (`moat manifest keygen`): signs capabilities.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// The Cedar policy set operations are decided by.
    #[arg(long, value_name = "FILE")]
    policy: PathBuf,
    /// File holding the admin token (creates orgs). Never on the command line.
    #[arg(long, value_name = "FILE")]
    admin_token_file: PathBuf,
    /// The environment this control plane serves; manifests must name it.
    #[arg(long, value_name = "NAME", default_value = "default")]
    environment: String,
    /// How long a runner's claim on a run lives without renewal.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// How long a capability lives (at most 60s).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    capability_ttl: Duration,
    /// Claims a run gets (lost leases) before it is dead-lettered.
    #[arg(long, value_name = "N", default_value_t = 3)]
    max_attempts: i64,
    /// How long an approval request waits for a person; then its operation
    /// fails closed (`approval_expired`).
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = humantime::parse_duration)]
    approval_ttl: Duration,
    /// File holding the key that seals the credential proxy's secrets (32
    /// bytes, base64). Keep it outside the database's backups. Without it,
    /// secrets cannot be stored or used.
    #[arg(long, value_name = "FILE")]
    secrets_key: Option<PathBuf>,
    /// Let tools call loopback, private, link-local and other non-public
    /// addresses (an internal API). Off: an org's tool cannot reach the
    /// control plane's own network.
    #[arg(long)]
    tools_allow_private_addresses: bool,
    /// Finish a run (reason `idle_timeout`) when nothing has happened in it
    /// for this long: no operation submitted, running or answered, and no
    /// approval pending. It frees the runner's slot an abandoned run holds.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = humantime::parse_duration)]
    run_idle_timeout: Duration,
    /// Turn away runners whose host's kernel is older than this (e.g. 6.1):
    /// registration fails with `host_below_minimum`, naming the kernel.
    #[arg(long, value_name = "VERSION", value_parser = parse_kernel)]
    min_kernel: Option<(u32, u32, u32)>,
    /// Turn away runners whose host offers a lower Landlock ABI than this
    /// (`host_below_minimum`).
    #[arg(long, value_name = "N")]
    min_landlock_abi: Option<u32>,
    /// The placement policy (Cedar): which org's runs may go to which host
    /// (dedicated hosts, orgs that never share one, label requirements).
    /// Default: every org's runs on every host (policies/placement.cedar,
    /// which shows how to write one).
    #[arg(long, value_name = "FILE")]
    placement_policy: Option<PathBuf>,
}

/// `MAJOR.MINOR[.PATCH]`, as `--min-kernel` takes it.
fn parse_kernel(text: &str) -> Result<(u32, u32, u32), String> {
    let plain = !text.is_empty()
        && text.split('.').count() <= 3
        && text
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    plain
        .then(|| moat_core::host::kernel_version(text))
        .flatten()
        .ok_or_else(|| format!("{text:?}: give MAJOR.MINOR[.PATCH], e.g. 6.1"))
}

/// A password file's content, without one trailing newline; refused when
/// every user may read it, when empty, or when it holds a NUL or a line
/// break inside.
fn read_password(path: &std::path::Path) -> anyhow::Result<zeroize::Zeroizing<String>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        bail!("not a regular file");
    }
    if meta.mode() & 0o004 != 0 {
        bail!("every user may read it: chmod o-r it (a Kubernetes Secret: defaultMode 0440)");
    }
    let text = zeroize::Zeroizing::new(std::fs::read_to_string(path)?);
    let password = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if password.is_empty() {
        bail!("it is empty");
    }
    if password.contains(['\0', '\n', '\r']) {
        bail!("a password is one line without NUL");
    }
    Ok(zeroize::Zeroizing::new(password.to_owned()))
}

/// The output store when `--outputs` is not given: `PATH-outputs` beside
/// an SQLite file at PATH (named like SQLite's own `-wal` and `-shm`), the
/// database over PostgreSQL (a directory would be one replica's).
pub(crate) fn default_outputs(db: &str) -> anyhow::Result<Outputs> {
    let Some(path) = db.strip_prefix("sqlite:") else {
        return Ok(Outputs::database());
    };
    let path = std::path::absolute(path).with_context(|| format!("--db {db}"))?;
    let mut dir = path.into_os_string();
    dir.push("-outputs");
    Outputs::directory(std::path::Path::new(&dir)).context("the default --outputs")
}

pub fn main(args: ServeArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat serve: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.capability_ttl > moat_core::capability::MAX_LIFETIME || args.capability_ttl.is_zero() {
        bail!("--capability-ttl: more than 0 and at most 60s");
    }
    if args.run_idle_timeout < Duration::from_secs(1) {
        bail!("--run-idle-timeout: at least 1s");
    }
    if !(1..=100).contains(&args.max_attempts) {
        bail!("--max-attempts: 1 to 100");
    }
    if args.lease < Duration::from_secs(1) {
        bail!("--lease: at least 1s");
    }
    let key = manifest::read_private_key(&args.key)?;
    let source = std::fs::read_to_string(&args.policy)
        .with_context(|| format!("--policy {}", args.policy.display()))?;
    let policy = PolicyEngine::new(&source)
        .with_context(|| format!("--policy {}", args.policy.display()))?;
    let placement = match &args.placement_policy {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--placement-policy {}", path.display()))?;
            PlacementEngine::new(&text)
                .with_context(|| format!("--placement-policy {}", path.display()))?
        }
        None => PlacementEngine::new(moat_control::placement::DEFAULT_PLACEMENT)
            .context("the default placement policy")?,
    };
    let admin = std::fs::read_to_string(&args.admin_token_file)
        .with_context(|| format!("--admin-token-file {}", args.admin_token_file.display()))?;
    let admin = admin.trim();
    if admin.len() < 16 {
        bail!("the admin token must be at least 16 characters");
    }
    let outputs = match &args.outputs {
        Some(spec) => Outputs::parse(spec).with_context(|| format!("--outputs {spec}"))?,
        None => default_outputs(&args.db)?,
    };
    let password = match &args.db_password_file {
        Some(path) => Some(
            read_password(path)
                .with_context(|| format!("--db-password-file {}", path.display()))?,
        ),
        None => None,
    };
    let store = Store::open_with_password(&args.db, password.as_deref().map(String::as_str))
        .with_context(|| format!("--db {}", moat_store::redact_url(&args.db)))?;
    drop(password);
    let vault = match &args.secrets_key {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--secrets-key {}", path.display()))?;
            Some(
                moat_control::vault::Vault::from_base64(&text)
                    .with_context(|| format!("--secrets-key {}", path.display()))?,
            )
        }
        None => None,
    };
    let backend = store.backend();
    let advertise_url = match args.advertise_url {
        Some(url) => {
            let lower = url.to_ascii_lowercase();
            if !(lower.starts_with("http://") || lower.starts_with("https://"))
                || url.len() > 512
                || url.chars().any(char::is_whitespace)
            {
                bail!("--advertise-url {url:?}: an http:// or https:// URL without spaces");
            }
            Some(url.trim_end_matches('/').to_owned())
        }
        None => None,
    };
    // Kept here so the store is dropped after the runtime, on this thread:
    // PostgreSQL's client blocks on its own runtime when dropped, which
    // must not happen on one of tokio's threads.
    let store = Arc::new(store);
    let state = AppState::new(Config {
        store: Arc::clone(&store),
        key,
        policy,
        admin_token_hash: moat_core::hash::sha256_hex(admin.as_bytes()),
        environment: args.environment,
        clock: Arc::new(SystemClock),
        lease: args.lease,
        capability_ttl: args.capability_ttl,
        max_attempts: args.max_attempts,
        approval_ttl: args.approval_ttl,
        vault,
        tools_allow_private: args.tools_allow_private_addresses,
        run_idle_timeout: args.run_idle_timeout,
        outputs,
        host_minimum: moat_core::host::HostMinimum {
            kernel: args.min_kernel,
            landlock_abi: args.min_landlock_abi,
        },
        placement,
        advertise_url,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(server::tls::server_config(cert, key).context("--tls-cert / --tls-key")?)
        }
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    runtime
        .block_on(state.config.outputs.check())
        .with_context(|| format!("--outputs {}", state.config.outputs.describe()))?;
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("--listen {}", args.listen))?;
        let local = listener.local_addr()?;
        eprintln!(
            "moat serve: listening on {scheme}://{local} ({backend}; policy {}; promoted files in {})",
            state.config.policy.hash(),
            state.config.outputs.describe()
        );
        let (stop_metrics, metrics_stopped) = tokio::sync::watch::channel(false);
        if let Some(address) = &args.metrics_listen {
            let metrics = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("--metrics-listen {address}"))?;
            eprintln!(
                "moat serve: metrics at http://{}/metrics",
                metrics.local_addr()?
            );
            let mut stopped = metrics_stopped.clone();
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let until = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                if let Err(e) = server::serve_metrics(metrics, state, until).await {
                    eprintln!("moat serve: metrics: {e}");
                }
            });
        }
        let shutdown = async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            let _ = stop_metrics.send(true);
        };
        server::serve(listener, state, shutdown, tls).await?;
        eprintln!("moat serve: stopped");
        anyhow::Ok(())
    });
    drop(runtime);
    drop(store);
    served
}
