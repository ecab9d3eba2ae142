//! `moat replay RUN_ID`: the run's recorded operations again, in a fresh
//! sandbox, against the same inputs (checked by hash) and under the same
//! permission envelope (the manifest it ran under, the policy it was decided
//! by), with a divergence report per operation.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use base64::Engine as _;
use clap::Args;
use moat_core::SignedManifest;
use moat_store::{OpState, Store};
use serde_json::{Value, json};

use moat_runner::workspace::write_inputs;
use moat_shell::child::ShellChild;
use moat_volume::{ChunkRef, VolumeError};

const ABOUT: &str = "\
Reads the run from the control plane's database: its inputs (by hash), its
operations and the manifest and policy hashes they were decided under. It
refuses if the policy file or the environment's current manifest is no
longer the one the run had (--allow-changed replays anyway, and says so).
Each volume the run attached is restored first from the snapshot the run
started from (its hash recorded; every chunk checked), read from the
control plane's output store (--outputs, as `moat serve` was given it).
Then it runs every operation that ran before (denied ones were never run),
in order, through a fresh `moat shell` in a new workspace under the
recorded manifest, and compares each with its record: status, exit code and
a hash of the outputs (content, stdout and stderr, artifacts; timings and
enforcement details excluded). Exits 0 if nothing diverged, 3 if something
did, 1 on an error.

  moat replay demo-1a2b3c4d                       # moat up's database and policy
  moat replay run-42 --db postgres://moat@db/moat --policy /etc/moat/policy.cedar --json";

/// Re-run a run's operations in a fresh sandbox and report divergences.
#[derive(Args)]
#[command(after_long_help = ABOUT)]
pub struct ReplayArgs {
    /// The run.
    run: String,
    /// The control plane's database.
    #[arg(long, value_name = "URL", default_value = "sqlite:moat-up/moat.db")]
    db: String,
    /// The policy the control plane decides by now.
    #[arg(long, value_name = "FILE", default_value = "moat-up/policy.cedar")]
    policy: PathBuf,
    /// The control plane's public key: the recorded manifest must verify
    /// with it (a manifest naming its own key proves nothing).
    #[arg(long, value_name = "FILE", default_value = "moat-up/control-plane.pub")]
    trusted_key: PathBuf,
    /// Replay even if the policy or the manifest changed since the run (or
    /// the manifest was revoked).
    #[arg(long)]
    allow_changed: bool,
    /// Also replay operations that reach the network (a direct
    /// `http_request`, a program with network): they repeat their effects
    /// on the world.
    #[arg(long)]
    allow_network: bool,
    /// Where the control plane keeps volumes' bytes, as `moat serve
    /// --outputs` (default: as `moat serve` defaults for --db).
    #[arg(long, value_name = "STORE")]
    outputs: Option<String>,
    /// One JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Run as root, the replayed sandboxes take a host uid/gid of their own
    /// from this block (BASE:COUNT). Default: the `moat-sandboxes` entries
    /// of /etc/subuid and /etc/subgid, added on first use.
    #[arg(long, value_name = "BASE:COUNT", env = "MOAT_UID_RANGE")]
    uid_range: Option<moat_sandbox::hostid::IdRange>,
}

pub fn main(args: ReplayArgs) -> ExitCode {
    match run(&args) {
        Ok(false) => ExitCode::SUCCESS,
        Ok(true) => ExitCode::from(3),
        Err(e) => {
            eprintln!("moat replay: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// What is compared: status, exit code, and a hash of the outputs.
fn fingerprint(result: &Value) -> Value {
    let status = result["status"].clone();
    let r = &result["result"];
    let mut outputs = serde_json::Map::new();
    for key in [
        "stdout",
        "stderr",
        "content",
        "sha256",
        "entries",
        "path",
        "body",
        "timedOut",
        "oomKilled",
    ] {
        if !r[key].is_null() {
            outputs.insert(key.into(), r[key].clone());
        }
    }
    let artifacts: Vec<Value> = result["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| json!([a["label"], a["sha256"]]))
        .collect();
    outputs.insert("artifacts".into(), Value::Array(artifacts));
    outputs.insert("reason".into(), result["reason"].clone());
    let canonical = moat_core::hash::canonical_json(&Value::Object(outputs)).unwrap_or_default();
    json!({
        "status": status,
        "exitCode": r["exitCode"],
        "outputHash": moat_core::hash::sha256_hex(&canonical),
    })
}

/// Why an operation is not replayed, if it is not.
fn skip_reason(op: &moat_store::OpRow, allow_network: bool) -> Option<&'static str> {
    let finished = matches!(op.state, OpState::Succeeded | OpState::Failed);
    // A result the shell wrote names its op; one the control plane wrote
    // when the run ended or its lease was lost does not.
    let ran = finished
        && op
            .result
            .as_ref()
            .is_some_and(|r| r["id"].as_str() == Some(op.id.as_str()));
    let args = &op.envelope["args"];
    if args["profile"] == moat_api::runner::TOOL_PROFILE {
        return Some("a tool call (made by the control plane, not in a sandbox)");
    }
    if !ran {
        return Some("never ran (denied, not approved, or ended with its run)");
    }
    // Replayed without its capability, a program would get the weakest
    // class the manifest lists: never weaker than it ran. A worker
    // component (a queue's delivery) is run as a worker again, with the
    // message and kv snapshot its envelope carries; its effects are not
    // made.
    if op.decision["class"]
        .as_str()
        .is_some_and(|c| c != "namespace" && c != "worker")
    {
        return Some("ran in a stronger workload class than replay gives (a microvm guest)");
    }
    let network = op.op == "http_request"
        || [&args["network"], &op.envelope["network"]]
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n != "off"));
    if network && !allow_network {
        return Some("reaches the network (--allow-network to repeat it)");
    }
    None
}

/// A volume's chunks and snapshots, read from the control plane's database
/// and output store: only those its org stored, and only snapshots of
/// that volume. Read-only.
struct StoredChunks<'a> {
    store: &'a Store,
    outputs: &'a moat_store::Outputs,
    runtime: &'a tokio::runtime::Runtime,
    org: &'a str,
    volume_id: &'a str,
}

impl StoredChunks<'_> {
    fn bytes(&self, sha: &str, found: moat_store::Found) -> Result<Vec<u8>, VolumeError> {
        match found {
            None => Err(VolumeError::Missing(sha.to_owned())),
            Some(Some(bytes)) => Ok(bytes),
            Some(None) => self
                .runtime
                .block_on(self.outputs.get_volume_bytes(sha))
                .map_err(|e| VolumeError::Store(e.to_string()))?
                .ok_or_else(|| VolumeError::Missing(sha.to_owned())),
        }
    }
}

fn read_only() -> VolumeError {
    VolumeError::Store("replay never writes to the control plane's store".into())
}

impl moat_volume::ChunkStore for StoredChunks<'_> {
    fn missing(&self, chunks: &[&ChunkRef]) -> Result<Vec<ChunkRef>, VolumeError> {
        let asked: Vec<String> = chunks.iter().map(|c| c.sha256.to_string()).collect();
        let missing = self
            .store
            .missing_chunks(self.org, &asked)
            .map_err(|e| VolumeError::Store(e.to_string()))?;
        Ok(chunks
            .iter()
            .filter(|c| missing.iter().any(|m| m == c.sha256.as_str()))
            .map(|c| (*c).clone())
            .collect())
    }

    fn put(&self, _: &ChunkRef, _: &[u8]) -> Result<(), VolumeError> {
        Err(read_only())
    }

    fn sync(&self) -> Result<(), VolumeError> {
        Ok(())
    }

    fn get(&self, chunk: &ChunkRef) -> Result<Vec<u8>, VolumeError> {
        let sha = chunk.sha256.as_str();
        let found = self
            .store
            .chunk(self.org, sha)
            .map_err(|e| VolumeError::Store(e.to_string()))?;
        self.bytes(sha, found)
    }

    fn put_snapshot(&self, _: &moat_core::ids::Sha256, _: &[u8]) -> Result<(), VolumeError> {
        Err(read_only())
    }

    fn get_snapshot(&self, id: &moat_core::ids::Sha256) -> Result<Vec<u8>, VolumeError> {
        let found = self
            .store
            .snapshot(self.org, self.volume_id, id.as_str())
            .map_err(|e| VolumeError::Store(e.to_string()))?;
        self.bytes(id.as_str(), found)
    }
}

/// Restores each volume the run attached, from the snapshot it started
/// from, into the replay's workspace; what was restored, for the report.
fn restore_volumes(
    store: &Store,
    args: &ReplayArgs,
    run: &moat_store::RunRow,
    workspace: &Path,
) -> anyhow::Result<Vec<Value>> {
    if run.volumes.is_empty() {
        return Ok(Vec::new());
    }
    let outputs = match &args.outputs {
        Some(spec) => {
            moat_store::Outputs::parse(spec).with_context(|| format!("--outputs {spec}"))?
        }
        None => crate::serve::default_outputs(&args.db)?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the output store's client")?;
    let mut restored = Vec::new();
    for v in &run.volumes {
        let rel: moat_core::ids::RelPath = v
            .path
            .parse()
            .with_context(|| format!("volume {}: its recorded path", v.volume))?;
        let dir = workspace.join(rel.as_str());
        std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
        let (files, bytes) = match &v.start_snapshot {
            None => (0, 0),
            Some(id) => {
                let id: moat_core::ids::Sha256 = id
                    .parse()
                    .with_context(|| format!("volume {}: its recorded snapshot", v.volume))?;
                let chunks = StoredChunks {
                    store,
                    outputs: &outputs,
                    runtime: &runtime,
                    org: &run.org_id,
                    volume_id: &v.volume_id,
                };
                let done = moat_volume::Tracker::new()
                    .restore(&chunks, &id, &dir)
                    .with_context(|| format!("volume {}: restoring snapshot {id}", v.volume))?;
                (done.files, done.bytes)
            }
        };
        restored.push(json!({
            "volume": v.volume, "path": v.path, "snapshot": v.start_snapshot,
            "files": files, "bytes": bytes,
        }));
    }
    Ok(restored)
}

/// A fresh directory of our own under the system's temporary directory.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Scratch> {
        let dir = std::env::temp_dir().join(moat_core::random::new_id("moat-replay-"));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(args: &ReplayArgs) -> anyhow::Result<bool> {
    if let Some(path) = args.db.strip_prefix("sqlite:")
        && !Path::new(path).exists()
    {
        bail!("--db {}: no such database", args.db);
    }
    let store = Store::open(&args.db)
        .with_context(|| format!("--db {}", moat_store::redact_url(&args.db)))?;
    let run = store
        .run_by_id(&args.run)
        .context("reading the run")?
        .with_context(|| format!("no run {} in this database", args.run))?;
    let ops = store.ops(&run.org_id, &run.id)?;

    // The envelope it had, and the one in force now.
    let recorded_policy = ops
        .iter()
        .find_map(|o| o.decision["policyHash"].as_str())
        .map(str::to_owned);
    let recorded_manifest = run
        .manifest_hash
        .clone()
        .or_else(|| {
            ops.iter()
                .find_map(|o| o.decision["manifestHash"].as_str().map(str::to_owned))
        })
        .context("the run was never claimed or decided under a manifest: nothing to replay")?;
    let policy_text = std::fs::read(&args.policy)
        .with_context(|| format!("--policy {}", args.policy.display()))?;
    let policy_now = moat_core::hash::sha256_hex(&policy_text);
    let manifest_now = store
        .current_manifest(&run.org_id, &run.environment)?
        .map(|m| m.hash);
    let mut changes = Vec::new();
    if recorded_policy.as_deref().is_some_and(|p| p != policy_now) {
        changes.push(format!(
            "the policy changed ({} then, {policy_now} now)",
            recorded_policy.as_deref().unwrap_or("-")
        ));
    }
    if manifest_now.as_deref() != Some(recorded_manifest.as_str()) {
        changes.push(format!(
            "the manifest changed ({recorded_manifest} then, {} now)",
            manifest_now.as_deref().unwrap_or("none")
        ));
    }
    if !changes.is_empty() && !args.allow_changed {
        bail!(
            "{}: the replay would not run under the same permissions (--allow-changed to replay anyway)",
            changes.join("; ")
        );
    }
    let manifest = store
        .manifest(&run.org_id, &recorded_manifest)?
        .with_context(|| format!("manifest {recorded_manifest} is not in the database"))?;
    if manifest.revoked && !args.allow_changed {
        bail!("manifest {recorded_manifest} has been revoked (--allow-changed to replay anyway)");
    }
    let signed: SignedManifest =
        serde_json::from_str(&manifest.signed).context("the recorded manifest")?;
    let trusted = crate::manifest::read_public_key(&args.trusted_key)
        .with_context(|| format!("--trusted-key {}", args.trusted_key.display()))?;
    signed
        .verify(&trusted)
        .context("the recorded manifest does not verify with --trusted-key")?;

    // A fresh workspace with the inputs, checked against their hashes.
    let scratch = Scratch::new()?;
    let workspace = scratch.0.join("workspace");
    let state = scratch.0.join("state");
    std::fs::create_dir_all(workspace.join("output"))?;
    std::fs::create_dir_all(workspace.join("input"))?;
    std::fs::create_dir_all(&state)?;
    let mut inputs: Vec<moat_api::RunInput> =
        serde_json::from_value(run.inputs.clone()).context("the run's recorded inputs")?;
    for input in &mut inputs {
        let bytes = store
            .artifact_bytes(&run.org_id, &input.sha256)?
            .with_context(|| {
                format!(
                    "input {} ({}) is no longer stored",
                    input.path, input.sha256
                )
            })?;
        input.content_base64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    let volumes = restore_volumes(&store, args, &run, &workspace)?;
    write_inputs(&workspace, &inputs)?;
    let manifest_file = scratch.0.join("manifest.json");
    std::fs::write(&manifest_file, &manifest.signed)?;
    let key_file = scratch.0.join("trusted.pub");
    std::fs::write(&key_file, trusted.to_base64())?;
    let me = std::env::current_exe().context("finding this binary")?;
    let mut shell = ShellChild::start(
        &me,
        &state,
        &workspace,
        &[
            "--manifest".into(),
            manifest_file.into_os_string(),
            "--trusted-key".into(),
            key_file.into_os_string(),
        ],
        args.uid_range,
    )?;

    let mut report = Vec::new();
    let mut diverged = false;
    for op in &ops {
        let recorded = op.result.clone().unwrap_or(Value::Null);
        let why_not = skip_reason(op, args.allow_network);
        if let Some(why) = why_not {
            report.push(json!({
                "op": op.id, "kind": op.op, "replayed": false, "why": why,
                "recorded": {"state": op.state.as_str()},
            }));
            continue;
        }
        let mut envelope = op.envelope.clone();
        if let Some(map) = envelope.as_object_mut() {
            map.remove("capability");
        }
        let again = serde_json::to_value(shell.ask_json(&envelope, &op.id)?)?;
        let (then, now) = (fingerprint(&recorded), fingerprint(&again));
        let same = then == now;
        diverged |= !same;
        report.push(json!({
            "op": op.id, "kind": op.op, "replayed": true, "same": same,
            "recorded": then, "replay": now,
        }));
    }
    drop(shell);
    let doc = json!({
        "run": run.id, "manifestHash": recorded_manifest, "policyHash": recorded_policy,
        "changed": changes, "diverged": diverged, "volumes": volumes, "ops": report,
    });
    if args.json {
        outln!("{doc:#}");
    } else {
        print_text(&doc);
    }
    Ok(diverged)
}

fn print_text(doc: &Value) {
    outln!(
        "replay of run {} under manifest {} and policy {}",
        doc["run"].as_str().unwrap_or("?"),
        doc["manifestHash"].as_str().unwrap_or("?"),
        doc["policyHash"].as_str().unwrap_or("-")
    );
    for change in doc["changed"].as_array().into_iter().flatten() {
        outln!("  WARNING: {}", change.as_str().unwrap_or(""));
    }
    for v in doc["volumes"].as_array().into_iter().flatten() {
        outln!(
            "  volume {} at {}: restored {} ({} files, {} bytes)",
            v["volume"].as_str().unwrap_or("?"),
            v["path"].as_str().unwrap_or("?"),
            v["snapshot"].as_str().unwrap_or("empty"),
            v["files"],
            v["bytes"]
        );
    }
    for op in doc["ops"].as_array().into_iter().flatten() {
        let id = op["op"].as_str().unwrap_or("?");
        let kind = op["kind"].as_str().unwrap_or("?");
        if op["replayed"] != true {
            outln!(
                "  {id:<12} {kind:<15} not replayed: {}",
                op["why"].as_str().unwrap_or("")
            );
            continue;
        }
        let (r, n) = (&op["recorded"], &op["replay"]);
        let verdict = if op["same"] == true {
            "same"
        } else {
            "DIVERGED"
        };
        outln!(
            "  {id:<12} {kind:<15} {verdict}: status {} -> {}, exit {} -> {}, outputs {} -> {}",
            r["status"].as_str().unwrap_or("-"),
            n["status"].as_str().unwrap_or("-"),
            r["exitCode"],
            n["exitCode"],
            &r["outputHash"].as_str().unwrap_or("-")
                [..12.min(r["outputHash"].as_str().unwrap_or("-").len())],
            &n["outputHash"].as_str().unwrap_or("-")
                [..12.min(n["outputHash"].as_str().unwrap_or("-").len())],
        );
    }
    outln!(
        "{}",
        if doc["diverged"] == true {
            "diverged"
        } else {
            "no divergence"
        }
    );
}
