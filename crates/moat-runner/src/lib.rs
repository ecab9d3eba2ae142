//! A sealed runner's life, as a library (`moat runner start` is its
//! command line): it reads and checks its own trailer, registers with a
//! single-use bootstrap token and a fresh per-boot key, reports its
//! provenance, then claims runs — one per free slot, each on a thread of
//! its own with its own lease, heartbeats, workspace and `moat shell`
//! child — and executes their operations through that child: the shell
//! checks every capability offline against the manifest's control-plane
//! key, and the sandbox is launched from that single-threaded child, never
//! from this process. Events the shell records and artifacts it names go
//! back with each result.
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

mod claims;
mod error;
mod ingress;
mod manifests;
pub mod seal;
mod serve;
mod slots;
mod teardown;
mod volumes;
pub mod workspace;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use moat_api::runner::Registration;
use moat_client::{Retry, RunnerClient};
use moat_core::event_data::{
    RunnerManifestLoaded, RunnerPolicyLoaded, RunnerSelected, RunnerStarted,
};
use moat_core::host::HostFeatures;
use moat_core::sign::PrivateKey;
use moat_core::time::stamp;
use moat_core::{Accelerator, Event, EventData, Manifest, SandboxMode, WorkloadClass};
use moat_sandbox::hostid::IdRange;
use zeroize::Zeroizing;

pub use error::RunnerError;
pub use slots::default_slots;

use error::IoContext as _;
use manifests::Manifests;

/// What a runner is started with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The control plane's base URL.
    pub control_plane: String,
    /// Where the token it registers with is read from (once, at start;
    /// never passed on).
    pub token: TokenFile,
    /// Where runs' workspaces, the shells' ledger and artifacts are kept.
    pub state_dir: PathBuf,
    /// Stop after this many runs (`None`: serve until killed).
    pub max_runs: Option<u64>,
    /// `NAME=ADDRESS[,ADDRESS]` entries for the egress proxy's resolver.
    pub resolve: Vec<String>,
    /// Runs served at once (`None`: [`default_slots`]).
    pub slots: Option<u16>,
    /// The block of host ids the sandboxes of a root runner take theirs from.
    pub uid_range: Option<IdRange>,
    /// Host paths allowed as declared roots although the launch policy
    /// refuses them (passed to the shell).
    pub launch_allow: Vec<PathBuf>,
    /// The launch policy is not applied: every op's report says so.
    pub override_launch_policy: bool,
    /// Trust only the CAs in this PEM file for an `https://` control plane.
    pub ca_file: Option<PathBuf>,
    /// This sealed runner's own file: its trailer is its manifest, and its
    /// shell children run it.
    pub program: PathBuf,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (no token).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Workload classes to offer besides `namespace` (each must be in the
    /// manifest's `workloadClasses`).
    pub classes: Vec<WorkloadClass>,
    /// The `microvm` guest's kernel and modules (default: the host's newest).
    pub vm_kernel: Option<PathBuf>,
    pub vm_modules: Option<PathBuf>,
    /// The host it runs on (`/etc/machine-id` unless the operator named it).
    pub host_id: Option<String>,
    /// The operator's labels (`zone=a`).
    pub labels: std::collections::BTreeMap<String, String>,
    /// CPU (millicores) and memory (bytes) it may hand out to runs
    /// (default: what the host has).
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
}

/// The file a runner's registration token is in.
#[derive(Debug, Clone)]
pub enum TokenFile {
    /// A single-use bootstrap token (`POST /v1/bootstrap-tokens`): spent by
    /// this start, so the next start needs a new one.
    Bootstrap(PathBuf),
    /// A token from an identity provider the org enrolled
    /// (`POST /v1/runner-enrolments`), e.g. a Kubernetes pod's projected
    /// service-account token, which the kubelet keeps fresh in this file:
    /// every start registers with it, nothing is spent.
    Enrolment(PathBuf),
}

impl TokenFile {
    fn describe(&self) -> String {
        match self {
            TokenFile::Bootstrap(path) => format!("--bootstrap-token-file {}", path.display()),
            TokenFile::Enrolment(path) => format!("--enrolment-token-file {}", path.display()),
        }
    }

    fn path(&self) -> &Path {
        match self {
            TokenFile::Bootstrap(path) | TokenFile::Enrolment(path) => path,
        }
    }
}

fn read_token(file: &TokenFile) -> Result<Zeroizing<String>, RunnerError> {
    let text = Zeroizing::new(std::fs::read_to_string(file.path()).io(|| file.describe())?);
    let token = Zeroizing::new(text.trim().to_owned());
    if token.is_empty() {
        return Err(RunnerError::Setup(format!("{} is empty", file.describe())));
    }
    Ok(token)
}

/// An event about the runner itself, about no run.
fn provenance(data: EventData, at: &str) -> Event {
    Event::of(data, at.to_owned(), String::new())
}

/// A runner that starts holds no run: whatever runs left under its state
/// directory (it was killed, the host rebooted) is torn down, and reported
/// as `runner.janitor`. Best effort: a failure is reported, not fatal.
fn janitor(client: &RunnerClient, state_dir: &Path, shell_state: &Path) {
    let ledger = moat_ledger::Ledger::open(&shell_state.join("ledger.db")).ok();
    let (runs, checks) = teardown::janitor(&state_dir.join("runs"), ledger.as_ref());
    if runs.is_empty() {
        return;
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.detail.as_str())
        .collect();
    eprintln!(
        "moat runner: janitor: tore down what {} earlier run(s) left{}",
        runs.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!("; NOT CLEAN: {}", failed.join("; "))
        }
    );
    let body = moat_api::runner::Janitor { runs, checks };
    if let Err(e) = client.janitor(&body) {
        eprintln!("moat runner: janitor: reporting it failed: {e}");
    }
}

/// The classes this runner offers under `manifest`, and its host's
/// features: `namespace` where the manifest lists it, and each class asked
/// for, which must be listed and must work here (the microvm class boots a
/// probe guest: software emulation only where the manifest allows it).
fn offered_classes(
    config: &Config,
    manifest: &Manifest,
) -> Result<(Vec<WorkloadClass>, HostFeatures), RunnerError> {
    let listed = manifest.classes();
    let mut host = moat_sandbox::host::host_features();
    let mut offered: Vec<WorkloadClass> = listed
        .iter()
        .copied()
        .filter(|c| c.is_namespace())
        .collect();
    for class in &config.classes {
        if !listed.contains(class) {
            return Err(RunnerError::Setup(format!(
                "--class {class}: the manifest's workloadClasses lists {}",
                WorkloadClass::names(&listed)
            )));
        }
        if *class == WorkloadClass::Microvm {
            eprintln!(
                "moat runner: microvm: finding the guest's accelerator (may boot a probe guest)"
            );
            let vm = vm_options(config, manifest);
            let (accelerator, why) = moat_sandbox::microvm::accelerator(&vm, config.uid_range)
                .map_err(|e| RunnerError::Setup(format!("--class microvm: {e}")))?;
            if accelerator == Accelerator::Tcg && !manifest.allow_emulation {
                return Err(RunnerError::Setup(format!(
                    "--class microvm: hardware virtualization is not usable here ({}); the \
                     manifest does not allow software emulation (allowEmulation)",
                    why.as_deref().unwrap_or("unknown")
                )));
            }
            host.hardware_virtualization = accelerator == Accelerator::Kvm;
            host.accelerator = Some(accelerator);
            host.emulation_reason = why;
        }
        if *class == WorkloadClass::Worker {
            // Its components run in moat-worker, beside this binary.
            moat_shell::worker::runtime_binary()
                .map_err(|e| RunnerError::Setup(format!("--class worker: {e}")))?;
        }
        if !offered.contains(class) {
            offered.push(*class);
        }
    }
    if offered.is_empty() {
        return Err(RunnerError::Setup(format!(
            "the manifest's workloadClasses lists {}, none of which this runner was asked to \
             offer: add --class",
            WorkloadClass::names(&listed)
        )));
    }
    offered.sort_by_key(|c| c.bit());
    Ok((offered, host))
}

/// How this runner's shells start `microvm` guests: the sealed binary is
/// the guest's init.
fn vm_options(config: &Config, manifest: &Manifest) -> moat_sandbox::microvm::VmOptions {
    moat_sandbox::microvm::VmOptions {
        moat: config.program.clone(),
        kernel: config.vm_kernel.clone(),
        modules: config.vm_modules.clone(),
        qemu: None,
        allow_emulation: manifest.allow_emulation,
    }
}

/// Registers and serves runs until `max_runs` were served (or forever).
pub fn run(config: Config) -> Result<(), RunnerError> {
    let boot = SystemTime::now();
    // SIGTERM (a rollout, `systemctl stop`) drains: no new claims, the
    // operations in flight finish, held runs go back to the queue. Handled
    // from the start, so one during registration drains too. A second
    // SIGTERM stops at once (exit 143), as an unhandled one would.
    let draining = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let term = signal_hook::consts::SIGTERM;
    signal_hook::flag::register_conditional_shutdown(term, 143, std::sync::Arc::clone(&draining))
        .and_then(|_| signal_hook::flag::register(term, std::sync::Arc::clone(&draining)))
        .map_err(|e| RunnerError::Setup(format!("handling SIGTERM: {e}")))?;
    let me = config.program.clone();
    let Some((signed, _)) = seal::read_trailer(&me)? else {
        return Err(RunnerError::Setup(format!(
            "{} is not a sealed runner: build one with `moat runner build`",
            me.display()
        )));
    };
    // The trailer must be what it claims; the control plane then checks
    // that its key signed it and that this build is allowed.
    let trusted =
        moat_core::sign::PublicKey::from_base64(&signed.manifest.control_plane_public_key)
            .map_err(|e| {
                RunnerError::Setup(format!("the sealed manifest's controlPlanePublicKey: {e}"))
            })?;
    signed
        .verify(&trusted)
        .map_err(|e| RunnerError::Setup(format!("the sealed manifest does not verify: {e}")))?;
    // Per-run cgroups where the runner was handed a delegated cgroup v2 of
    // its own (systemd Delegate=yes): it moves itself to a leaf now, while
    // it is alone there, so that the sandboxes its shells launch get
    // cgroups beside it. systemd >= 254 can start it in a leaf
    // (DelegateSubgroup=); 252 (Debian 12, RHEL 9) cannot.
    match moat_sandbox::settle_in_own_cgroup() {
        Ok(Ok(supervisor)) => eprintln!(
            "moat runner: moved itself to {}: each run gets a cgroup beside it",
            supervisor.display()
        ),
        Ok(Err(why)) => eprintln!("moat runner: cgroup: left where it is ({why})"),
        // Not fatal: each sandbox then finds no cgroup to make and is
        // refused at the cgroup layer (unless its manifest says the
        // deployment bounds runs), and says so, run by run.
        Err(e) => eprintln!("moat runner: cgroup: taking over its delegated cgroup failed: {e}"),
    }
    let runner_hash = seal::file_sha256(&me)?;
    std::fs::create_dir_all(&config.state_dir)
        .io(|| format!("--state-dir {}", config.state_dir.display()))?;
    // One runner per state directory: a second would tear down the first's
    // runs at its start (the janitor) and share its workspaces. Held until
    // this process exits.
    let lock_path = config.state_dir.join("runner.lock");
    let _state_lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .io(|| lock_path.display().to_string())?;
    if !moat_sandbox::process::try_lock(&_state_lock).io(|| lock_path.display().to_string())? {
        return Err(RunnerError::Setup(format!(
            "another runner uses --state-dir {} (it holds {})",
            config.state_dir.display(),
            lock_path.display()
        )));
    }
    let shell_state = config.state_dir.join("shell");
    workspace::private_dir(&shell_state)?;
    std::fs::write(
        shell_state.join("trusted.pub"),
        &signed.manifest.control_plane_public_key,
    )
    .io(|| format!("{}/trusted.pub", shell_state.display()))?;

    let seed = Zeroizing::new(moat_core::random::bytes::<32>());
    let key = PrivateKey::from_seed(*seed);
    let roots = config
        .ca_file
        .as_deref()
        .map(|path| moat_client::CaRoots::for_control_plane(path, &config.control_plane))
        .transpose()
        .map_err(|e| RunnerError::Setup(e.to_string()))?;
    let mut client = RunnerClient::with_roots(
        &config.control_plane,
        key,
        Box::new(|error, delay| eprintln!("moat runner: {error}; retrying in {delay:?}")),
        roots.as_ref(),
    );
    client.stop_retrying_when(std::sync::Arc::clone(&draining));
    let mode = signed
        .manifest
        .sandbox_modes
        .first()
        .copied()
        .unwrap_or(SandboxMode::WorkspaceWrite);
    let sandbox_mode = mode.as_str().to_owned();
    let slots = config
        .slots
        .unwrap_or_else(|| default_slots(signed.manifest.limits.memory_bytes));
    let (classes, host) = offered_classes(&config, &signed.manifest)?;
    let registration = Registration {
        runner_hash: runner_hash.clone(),
        signed_manifest: signed.clone(),
        version: signed.manifest.runner_version.clone(),
        environment: signed.manifest.environment.clone(),
        ops: signed.manifest.allowed_ops.clone(),
        sandbox_mode: sandbox_mode.clone(),
        boot_time: stamp(boot),
        public_key: client.public_key().to_base64(),
        slots: i64::from(slots),
        workload_classes: classes.clone(),
        host: Some(host.clone()),
        host_id: config.host_id.clone(),
        labels: config.labels.clone(),
        cpu_millis: Some(config.cpu_millis.unwrap_or_else(slots::host_cpu_millis)),
        memory_bytes: config.memory_bytes.or_else(slots::memory_total),
    };
    if draining.load(std::sync::atomic::Ordering::Relaxed) {
        // Stopped before it registered: nothing to give back, no token spent.
        eprintln!("moat runner: stopped (SIGTERM) before registering");
        return Ok(());
    }
    let token = read_token(&config.token)?;
    let registered = client.register(&token, &registration);
    // A bootstrap token is spent either way, an enrolment token is the
    // kubelet's to renew: wiped now, not kept around.
    drop(token);
    let registered = registered?;
    let lease = Duration::from_millis(registered.lease_ms);
    eprintln!(
        "moat runner: registered as {} (build {runner_hash}, {slots} slots, classes: {}{})",
        registered.runner_id,
        WorkloadClass::names(&classes),
        match (host.accelerator, &host.emulation_reason) {
            (Some(Accelerator::Tcg), Some(why)) => format!("; microvm under TCG: {why}"),
            (Some(accelerator), _) => format!("; microvm under {}", accelerator.as_str()),
            _ => String::new(),
        }
    );
    let at = moat_core::time::now_stamp();
    // The control plane stamps the runner's id, hash and manifest on each.
    let events = vec![
        provenance(
            EventData::RunnerSelected(RunnerSelected {
                runner_hash: runner_hash.clone(),
                binary: me.display().to_string(),
                runner_id: None,
                manifest_hash: None,
            }),
            &at,
        ),
        provenance(
            EventData::RunnerStarted(RunnerStarted {
                boot_time: stamp(boot),
                version: signed.manifest.runner_version.clone(),
                sandbox_mode: mode,
                runner_id: None,
                runner_hash: None,
                manifest_hash: None,
            }),
            &at,
        ),
        provenance(
            EventData::RunnerPolicyLoaded(RunnerPolicyLoaded {
                policy_hash: signed.manifest.policy_hash.clone(),
                runner_id: None,
                runner_hash: None,
                manifest_hash: None,
            }),
            &at,
        ),
        provenance(
            EventData::RunnerManifestLoaded(RunnerManifestLoaded {
                manifest_hash: signed.manifest_hash.clone(),
                expires_at: signed.manifest.expires_at.clone(),
                runner_id: None,
                runner_hash: None,
            }),
            &at,
        ),
    ];
    client.report_events(events, Retry::WhileUnavailable)?;
    janitor(&client, &config.state_dir, &shell_state);
    let manifests = Manifests::new(signed, trusted, config.state_dir.clone(), classes.clone())?;

    let metrics = Arc::new(moat_metrics::Metrics::new(moat_metrics::Role::Runner));
    if let Some(address) = config.metrics_listen {
        let bound = moat_metrics::serve(address, Arc::clone(&metrics))
            .map_err(|e| RunnerError::Setup(e.to_string()))?;
        eprintln!("moat runner: metrics at http://{bound}/metrics");
    }
    let claims = claims::Claims::new(config.max_runs);
    let runner = serve::Runner {
        metrics,
        config,
        client,
        manifests: Mutex::new(manifests),
        manifest_now: Mutex::new((0, None)),
        slots: slots::Slots::new(usize::from(slots)),
        shell_state,
        heartbeat: (lease / 3).max(Duration::from_millis(200)),
        draining,
        claims,
        serving: Mutex::new(std::collections::HashSet::new()),
        served: std::sync::Condvar::new(),
        finish_takes_teardown: registered.finish_takes_teardown,
        last_report_takes_claim: registered.last_report_takes_claim,
    };
    runner.serve()
}
