//! `moat runner start`: a sealed runner's life. It reads and checks its own
//! trailer, registers with a single-use bootstrap token and a fresh per-boot
//! key, reports its provenance, then claims runs and executes their
//! operations through a `moat shell --require-capabilities` child per run:
//! the shell checks every capability offline against the manifest's
//! control-plane key, and the sandbox is launched from that single-threaded
//! child, never from this process. Events the shell records and artifacts
//! it names go back with each result.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Condvar, Mutex, PoisonError, TryLockError};
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use base64::Engine as _;
use clap::Args;
use moat_core::EventType;
use moat_core::sign::PrivateKey;
use moat_ledger::Ledger;
use serde_json::{Value, json};

use super::client::{Client, error_text, stamp};
use super::refresh::Manifests;
use super::shell_child::{ShellChild, write_inputs};
use crate::seal;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Args)]
pub struct StartArgs {
    /// The control plane's base URL, e.g. http://127.0.0.1:7700.
    #[arg(long, value_name = "URL")]
    control_plane: String,
    /// File holding the single-use bootstrap token (`POST /v1/bootstrap-tokens`).
    /// Read once; never passed on to a child.
    #[arg(long, value_name = "FILE")]
    bootstrap_token_file: PathBuf,
    /// Where runs' workspaces, the ledger and artifacts are kept.
    #[arg(long, value_name = "DIR")]
    state_dir: PathBuf,
    /// Stop after this many runs (default: serve until killed).
    #[arg(long, value_name = "N")]
    max_runs: Option<u64>,
    /// Answer NAME with ADDRESS in the egress proxy's resolver (passed to the shell).
    #[arg(long = "resolve", value_name = "NAME=ADDRESS[,ADDRESS]")]
    resolve: Vec<String>,
    /// How many runs to serve at once, each with its own claim, lease,
    /// heartbeat and shell: a run that waits for a person's approval or for
    /// its agent's next operation never keeps another from starting.
    /// Default: twice the CPUs this process may use, at most as many as the
    /// host's memory holds at the manifest's per-run memory limit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    slots: Option<u16>,
    /// Run as root, each run's sandboxes take a host uid/gid of their own
    /// from this block (BASE:COUNT; passed to the shell). Default: the
    /// `moat-sandboxes` entries of /etc/subuid and /etc/subgid, added on first use.
    #[arg(long, value_name = "BASE:COUNT", env = "MOAT_UID_RANGE")]
    uid_range: Option<moat_sandbox::hostid::IdRange>,
}

/// The default number of slots: two runs per CPU (a run mostly waits: for
/// its agent, a person, the network), bounded by memory at `per_run` bytes
/// each, never less than one.
pub fn default_slots(per_run: u64) -> u16 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let by_cpu = cpus.saturating_mul(2);
    let by_memory = memory_total().map_or(usize::MAX, |total| {
        usize::try_from(total / per_run.max(1)).unwrap_or(usize::MAX)
    });
    let slots = by_cpu.min(by_memory).clamp(1, 256);
    u16::try_from(slots).unwrap_or(1)
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn memory_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

pub fn main(args: StartArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat runner: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--bootstrap-token-file {}", path.display()))?;
    let token = text.trim().to_owned();
    if token.is_empty() {
        bail!("--bootstrap-token-file {} is empty", path.display());
    }
    Ok(token)
}

/// What a running runner holds; its slots share it.
struct Runner {
    args: StartArgs,
    client: Client,
    manifests: Mutex<Manifests>,
    /// The manifest generation and its file (`None`: the sealed one), as of
    /// the last refresh check: what a slot uses while another slot's
    /// thread is busy refreshing (a network call) with `manifests` locked.
    manifest_now: Mutex<(u64, Option<PathBuf>)>,
    slots: Slots,
    /// The shells' state directory (ledger, artifacts, trusted key).
    shell_state: PathBuf,
    /// Heartbeat period while an operation runs: a third of the lease.
    heartbeat: Duration,
}

fn run(args: StartArgs) -> anyhow::Result<()> {
    let boot = SystemTime::now();
    let me = std::env::current_exe().context("finding this binary")?;
    let Some((signed, _)) = seal::read_trailer(&me)? else {
        bail!(
            "{} is not a sealed runner: build one with `moat runner build`",
            me.display()
        );
    };
    // The trailer must be what it claims; the control plane then checks
    // that its key signed it and that this build is allowed.
    let trusted =
        moat_core::sign::PublicKey::from_base64(&signed.manifest.control_plane_public_key)
            .context("the sealed manifest's controlPlanePublicKey")?;
    signed
        .verify(&trusted)
        .context("the sealed manifest does not verify")?;
    let runner_hash = seal::file_sha256(&me)?;
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("--state-dir {}", args.state_dir.display()))?;
    let shell_state = args.state_dir.join("shell");
    private_dir(&shell_state)?;
    std::fs::write(
        shell_state.join("trusted.pub"),
        &signed.manifest.control_plane_public_key,
    )?;

    let mut seed = moat_core::random::bytes::<32>();
    let mut client = Client::new(&args.control_plane, PrivateKey::from_seed(seed));
    seed.fill(0);
    let sandbox_mode = signed
        .manifest
        .sandbox_modes
        .first()
        .map_or("workspace-write", |m| m.as_str());
    let slots = args
        .slots
        .unwrap_or_else(|| default_slots(signed.manifest.limits.memory_bytes));
    let registration = json!({
        "runnerHash": runner_hash,
        "signedManifest": signed,
        "version": signed.manifest.runner_version,
        "environment": signed.manifest.environment,
        "ops": signed.manifest.allowed_ops,
        "sandboxMode": sandbox_mode,
        "bootTime": stamp(boot),
        "publicKey": client.key.public().to_base64(),
        "slots": slots,
    });
    let mut token = read_token(&args.bootstrap_token_file)?;
    let answer = client.register(&token, &registration);
    // The token is spent either way; do not keep it around.
    token.replace_range(.., &"0".repeat(token.len()));
    drop(token);
    let answer = answer?;
    if answer.status != 201 {
        bail!("registration refused: {}", error_text(&answer));
    }
    client.runner_id = answer.body["runnerId"]
        .as_str()
        .context("registration: no runnerId")?
        .to_owned();
    let lease = Duration::from_millis(answer.body["leaseMs"].as_u64().unwrap_or(30_000));
    eprintln!(
        "moat runner: registered as {} (build {runner_hash}, {slots} slots)",
        client.runner_id
    );
    let at = stamp(SystemTime::now());
    let provenance =
        |kind: EventType, data: Value| json!({"type": kind, "at": at, "runId": "", "data": data});
    let events = json!({"events": [
        provenance(EventType::RunnerSelected, json!({"runnerHash": runner_hash, "binary": me.display().to_string()})),
        provenance(EventType::RunnerStarted, json!({"bootTime": stamp(boot), "version": signed.manifest.runner_version, "sandboxMode": sandbox_mode})),
        provenance(EventType::RunnerPolicyLoaded, json!({"policyHash": signed.manifest.policy_hash})),
        provenance(EventType::RunnerManifestLoaded, json!({"manifestHash": signed.manifest_hash, "expiresAt": signed.manifest.expires_at})),
    ]});
    let answer = client.signed_retrying("POST", "/v1/runner/events", Some(&events))?;
    if answer.status != 200 {
        bail!("reporting provenance: {}", error_text(&answer));
    }
    let manifests = Manifests::new(signed, trusted, args.state_dir.clone())?;
    let runner = Runner {
        args,
        client,
        manifests: Mutex::new(manifests),
        manifest_now: Mutex::new((0, None)),
        slots: Slots::new(usize::from(slots)),
        shell_state,
        heartbeat: (lease / 3).max(Duration::from_millis(200)),
    };
    runner.serve()
}

/// A runner's slots: how many of its runs are in progress.
struct Slots {
    total: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn new(total: usize) -> Slots {
        Slots {
            total,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits for a free slot and takes it; how many are then in use.
    fn take(&self) -> usize {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        while *used >= self.total {
            used = self
                .freed
                .wait(used)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *used += 1;
        *used
    }

    fn give_back(&self) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        *used = used.saturating_sub(1);
        self.freed.notify_one();
    }
}

/// A taken slot, given back when the run's thread ends however it ends.
struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

impl Runner {
    /// Claims a run whenever a slot is free and serves each claimed run on
    /// a thread of its own, until `--max-runs` runs were claimed (then it
    /// waits for them to end) or the control plane refuses a claim.
    fn serve(&self) -> anyhow::Result<()> {
        std::thread::scope(|scope| {
            let mut claimed = 0u64;
            while self.args.max_runs.is_none_or(|max| claimed < max) {
                let in_use = self.slots.take();
                let slot = SlotGuard(&self.slots);
                self.refresh_manifest();
                let answer =
                    self.client
                        .signed_retrying("POST", "/v1/runner/claim?wait_ms=5000", None)?;
                match answer.status {
                    204 => continue,
                    200 => {
                        claimed += 1;
                        let run_id = answer.body["run"]["id"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned();
                        eprintln!(
                            "moat runner: claimed run {run_id} ({in_use} of {} slots in use)",
                            self.slots.total
                        );
                        scope.spawn(move || {
                            let _slot = slot;
                            self.serve_run(&run_id, &answer.body);
                        });
                    }
                    _ => bail!("claim refused: {}", error_text(&answer)),
                }
            }
            Ok(())
        })
    }

    /// The manifest refresh's turn (an operation boundary): one slot at a
    /// time fetches, swaps and reports, over the network; the others go on
    /// at once with the generation last seen rather than wait for it (a
    /// control plane slow to answer must not stall every run's lease).
    fn refresh_manifest(&self) -> (u64, Option<PathBuf>) {
        let turn = match self.manifests.try_lock() {
            Ok(manifests) => Some(manifests),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let checked = turn.map(|mut m| (m.tick(&self.client), m.file.clone()));
        let mut now = self
            .manifest_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Never back: another slot may have seen a newer one meanwhile.
        if let Some(checked) = checked.filter(|(generation, _)| *generation >= now.0) {
            *now = checked;
        }
        now.clone()
    }

    /// One claimed run to its end; a run that fails here is reported failed.
    fn serve_run(&self, run_id: &str, claim: &Value) {
        if let Err(e) = self.execute_run(claim) {
            eprintln!("moat runner: run {run_id}: {e:#}");
            let body = json!({"state": "failed", "error": format!("{e:#}")});
            let _ = self.client.signed_retrying(
                "POST",
                &format!("/v1/runner/runs/{run_id}/finish"),
                Some(&body),
            );
        }
    }

    fn execute_run(&self, claim: &Value) -> anyhow::Result<()> {
        let run_id = claim["run"]["id"]
            .as_str()
            .context("claim without a run id")?
            .to_owned();
        // It names a directory here and a URL path segment: never trust its shape.
        if !moat_core::op::is_plain_id(&run_id) {
            bail!("the claimed run id {run_id:?} is not a plain id");
        }
        let workspace = self.args.state_dir.join("runs").join(&run_id);
        if workspace.exists() {
            std::fs::remove_dir_all(&workspace)?;
        }
        // The runner's alone: another run's sandbox runs as another host
        // uid, which must find nothing here even if it got out.
        private_dir(&self.args.state_dir.join("runs"))?;
        private_dir(&workspace)?;
        std::fs::create_dir_all(workspace.join("output"))?;
        std::fs::create_dir_all(workspace.join("input"))?;
        write_inputs(&workspace, &claim["inputs"])?;
        // Started at the first operation: a run without any costs no process.
        // The manifest generation it serves under: a refresh (by any slot)
        // takes over at this run's next operation boundary, in a new shell.
        let mut shell: Option<(ShellChild, u64)> = None;
        // Read alongside the shell, which writes it (WAL: readers see each commit).
        let ledger = Ledger::open(&self.shell_state.join("ledger.db"))?;
        let mut ledger_seq = ledger.summary()?.0;
        let next = format!("/v1/runner/runs/{run_id}/next?wait_ms=5000");
        loop {
            // An operation boundary: a refreshed manifest takes over here,
            // in a new shell.
            let (generation, manifest_file) = self.refresh_manifest();
            if shell.as_ref().is_some_and(|(_, g)| *g != generation) {
                shell = None;
            }
            let answer = self.client.signed_retrying("POST", &next, None)?;
            match (answer.status, answer.body["action"].as_str()) {
                (204, _) => continue,
                (200, Some("op")) => {
                    let envelope = &answer.body["envelope"];
                    let op_id = envelope["id"].as_str().unwrap_or_default().to_owned();
                    if !moat_core::op::is_plain_id(&op_id) {
                        bail!("operation id {op_id:?} is not a plain id");
                    }
                    // A tool call is made by the control plane, which holds
                    // the credential: this runner only asks for it.
                    if envelope["op"] == "http_request"
                        && envelope["args"]["profile"] == moat_control::tools::PROFILE
                    {
                        let path = format!("/v1/runner/runs/{run_id}/ops/{op_id}/tool");
                        let answer = self.client.signed_retrying("POST", &path, None)?;
                        if answer.status != 200 {
                            bail!("tool call {op_id}: {}", error_text(&answer));
                        }
                        continue;
                    }
                    let shell = match &mut shell {
                        Some((shell, _)) => shell,
                        None => {
                            let started = start_shell(
                                &self.args,
                                &self.shell_state,
                                &workspace,
                                manifest_file.as_deref(),
                            )?;
                            &mut shell.insert((started, generation)).0
                        }
                    };
                    // A one-operation tool token travels beside the
                    // envelope; the shell hands it to the program's stdin.
                    let mut envelope = envelope.clone();
                    if let Some(token) = answer.body["toolToken"].as_str() {
                        envelope["toolToken"] = token.into();
                    }
                    let result = self.run_op(shell, &run_id, &op_id, &envelope)?;
                    let mut events = Vec::new();
                    loop {
                        let page = ledger.events(Some(&run_id), ledger_seq, 1000)?;
                        let Some(last) = page.last() else { break };
                        ledger_seq = last.seq;
                        events.extend(page);
                    }
                    let artifacts = collect_artifacts(&self.shell_state, &result)?;
                    let body = json!({
                        "result": result,
                        "events": events.iter().map(|e| &e.event).collect::<Vec<_>>(),
                        "artifacts": artifacts,
                    });
                    let path = format!("/v1/runner/runs/{run_id}/ops/{op_id}/result");
                    let answer = self.client.signed_retrying("POST", &path, Some(&body))?;
                    if answer.status != 200 {
                        bail!("reporting operation {op_id}: {}", error_text(&answer));
                    }
                }
                (200, Some("finish")) => {
                    drop(shell);
                    let body = json!({"state": "succeeded"});
                    let answer = self.client.signed_retrying(
                        "POST",
                        &format!("/v1/runner/runs/{run_id}/finish"),
                        Some(&body),
                    )?;
                    if answer.status != 200 {
                        bail!("finishing: {}", error_text(&answer));
                    }
                    return Ok(());
                }
                (200, _) => return Ok(()),
                _ => {
                    eprintln!("moat runner: run {run_id} stopped: {}", error_text(&answer));
                    return Ok(());
                }
            }
        }
    }

    /// One operation through the shell, with the run's lease kept alive by
    /// heartbeats while it runs (the shell child is what launches sandboxes,
    /// so this process may have a thread).
    fn run_op(
        &self,
        shell: &mut ShellChild,
        run_id: &str,
        op_id: &str,
        envelope: &Value,
    ) -> anyhow::Result<Value> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let beat = format!("/v1/runner/runs/{run_id}/heartbeat");
        std::thread::scope(|scope| {
            scope.spawn(move || {
                // Woken at once when the operation ends (the sender drops).
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(self.heartbeat) {
                    if let Err(e) = self.client.signed("POST", &beat, None) {
                        eprintln!("moat runner: heartbeat: {e:#}");
                    }
                }
            });
            let result = shell.ask(envelope, op_id);
            drop(stop);
            result
        })
    }
}

/// Makes `dir` (if missing) and leaves it to the runner's user alone: the
/// ledger, artifacts and workspaces of every run live under it.
/// One that exists must be a real directory of the runner's user (else its
/// owner could still open it), and is closed to everyone else.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("{}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("{}", dir.display()))?;
    // /proc/self belongs to this process's effective uid.
    let me = std::fs::metadata("/proc/self")?.uid();
    if !meta.is_dir() || meta.uid() != me {
        bail!(
            "{} must be a directory owned by this runner's user (uid {me}), not a link or \
             another user's (uid {})",
            dir.display(),
            meta.uid()
        );
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("{}", dir.display()))
}

/// `manifest`: a refreshed manifest's file (default: the sealed one).
fn start_shell(
    args: &StartArgs,
    state: &Path,
    workspace: &Path,
    manifest: Option<&Path>,
) -> anyhow::Result<ShellChild> {
    let mut extra: Vec<std::ffi::OsString> = vec!["--require-capabilities".into()];
    if let Some(manifest) = manifest {
        extra.push("--manifest".into());
        extra.push(manifest.into());
    }
    for entry in &args.resolve {
        extra.push("--resolve".into());
        extra.push(entry.into());
    }
    ShellChild::start(state, workspace, &extra, args.uid_range)
}

/// The artifacts a result names, with their bytes from the shell's store.
fn collect_artifacts(state: &Path, result: &Value) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for a in result["artifacts"].as_array().into_iter().flatten() {
        let sha = a["sha256"].as_str().unwrap_or_default();
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let path = state.join("artifacts").join(&sha[..2]).join(sha);
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .with_context(|| format!("artifact {sha}"))?;
        out.push(json!({
            "sha256": sha, "kind": a["kind"], "label": a["label"], "contentBase64": B64.encode(&bytes),
        }));
    }
    Ok(out)
}
