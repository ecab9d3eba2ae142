//! The `worker` class's sandbox: a WebAssembly component run by
//! `moat-worker` (wasmtime) inside a namespace sandbox of its own, for
//! `moat exec --class worker MODULE.wasm` and for the shell's `exec_argv`
//! in the `worker` class (how a queue's messages are delivered).
//!
//! Two boundaries: the component reaches only what the worker runtime
//! links (no files, no sockets: each attempt refused and recorded), and the
//! wasmtime process is a sandboxed program like any other (read-only
//! root, no network, seccomp, cgroup). The guest's outcome comes back on a
//! pipe (descriptor 3) and is folded into the sandbox's report and events.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use moat_core::event_data::{NetworkDenied, ProcessTimeout, SandboxViolation, WorkerBinding};
use moat_core::{
    Event, EventData, EventSink, EventType, SandboxReport, Violation, WorkerReport, WorkloadClass,
};
use moat_sandbox::{BindMount, SandboxSpec};
use moat_worker_api::{Denial, Outcome, WorkerExit};

/// Where the sandbox sees the runtime and the component.
const BIN_INSIDE: &str = "/moat/moat-worker";
const MODULE_INSIDE: &str = "/moat/module.wasm";
/// Where `--input` and `--output` are, for the `inputs` and `outputs`
/// bindings.
const INPUTS_INSIDE: &str = "/moat/inputs";
const OUTPUTS_INSIDE: &str = "/moat/outputs";
/// A directory of the host's, writable by the runtime alone: the `kv`
/// binding's snapshot and the queue message are written there for it,
/// and it writes there the effects it was asked for.
const BINDINGS_INSIDE: &str = "/moat/bindings";
const KV_FILE: &str = "kv.json";
const MESSAGE_FILE: &str = "message.json";
const EFFECTS_FILE: &str = "effects.json";

/// Most bytes of effects read back: every write and send at its limit,
/// in base64 and JSON, fits.
const MAX_EFFECTS_BYTES: u64 = 128 << 20;

/// What the wasmtime process may use beyond the guest's own memory:
/// the engine, the compiled code, the compiler's working set on a cold
/// start.
const RUNTIME_MEMORY: u64 = 512 << 20;

/// How long compiling a component on its first use may take; the guest's
/// --timeout starts when it is instantiated.
const COMPILE_ALLOWANCE_MS: u64 = 300_000;

/// What the worker runtime grants every component (WASI's), reported.
const GRANTED: &[&str] = &["stdout", "stderr", "clocks", "random", "args"];

/// Why a worker's sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum WorkerSetupError {
    /// What was asked cannot run as a worker; says why.
    #[error("{0}")]
    Refused(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn refused(message: impl Into<String>) -> WorkerSetupError {
    WorkerSetupError::Refused(message.into())
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkerSetupError {
    let what = what.into();
    move |source| WorkerSetupError::Io { what, source }
}

/// The `moat-worker` binary: next to this `moat` (one build makes both).
pub fn runtime_binary() -> Result<PathBuf, WorkerSetupError> {
    let moat = std::env::current_exe().map_err(io("finding the moat binary"))?;
    let worker = moat.with_file_name("moat-worker");
    if !worker.is_file() {
        return Err(refused(format!(
            "{} is missing: the worker class runs components with the moat-worker binary built \
             with moat (cargo build --release builds both)",
            worker.display()
        )));
    }
    Ok(worker)
}

/// Where the runtime keeps compiled code: a directory of the host's for
/// one component (by SHA-256), writable by the invocation that fills it,
/// read-only once it was filled.
#[derive(Debug, Clone)]
pub struct CompileCache {
    pub dir: PathBuf,
    pub writable: bool,
}

/// Where the sandbox sees the compile cache.
const CACHE_INSIDE: &str = "/moat/cache";

/// The directories a worker's bindings are granted.
#[derive(Default)]
pub struct BindingDirs {
    /// Compiled code kept across invocations (`None`: compiled each time).
    pub cache: Option<CompileCache>,
    pub inputs: Option<PathBuf>,
    pub outputs: Option<PathBuf>,
    /// Bytes all outputs together may hold.
    pub max_write: Option<u64>,
    /// Grant the `http` binding (the sandbox's network goes through the
    /// egress proxy).
    pub http: bool,
    /// Grant the `kv` binding over this snapshot's namespaces (JSON:
    /// `{"namespaces": {NAME: {KEY: BASE64}}}`).
    pub kv: Option<Vec<u8>>,
    /// The queues `queue.send` may send to.
    pub queues: Vec<String>,
    /// The message (JSON) `queue.message` returns.
    pub message: Option<Vec<u8>>,
    /// Bring back the kv writes and queue sends the guest asked for
    /// ([`OutcomeReader::finish`] returns them).
    pub effects: bool,
}

/// Turns `spec` (whose argv is the component and its arguments) into the
/// sandbox that runs `moat-worker` on it, with the channel its outcome
/// comes back on.
pub fn prepare(
    spec: &mut SandboxSpec,
    dirs: &BindingDirs,
) -> Result<OutcomeReader, WorkerSetupError> {
    let Some(module) = spec.argv.first().map(PathBuf::from) else {
        return Err(refused(
            "--class worker needs the component to run: moat exec --class worker -- MODULE.wasm",
        ));
    };
    let meta =
        std::fs::metadata(&module).map_err(io(format!("the component {}", module.display())))?;
    if !meta.is_file() {
        return Err(refused(format!(
            "the component {}: not a regular file",
            module.display()
        )));
    }
    let mut magic = [0u8; 8];
    std::fs::File::open(&module)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map_err(io(format!("reading {}", module.display())))?;
    // A component's preamble: "\0asm", version 0x0d, layer 1. A core module
    // (layer 0) is refused here with a message that says what to do.
    if &magic[..4] != b"\0asm" {
        return Err(refused(format!(
            "{}: not WebAssembly (no \\0asm header)",
            module.display()
        )));
    }
    if magic[6..8] != [1, 0] {
        return Err(refused(format!(
            "{}: a core WebAssembly module, not a component: a worker is a WASI 0.2 component \
             (wasm-tools component new, componentize-py or jco make one)",
            module.display()
        )));
    }
    let binary = runtime_binary()?;
    let limits = spec.limits.clone();
    let guest_args: Vec<String> = spec.argv.iter().skip(1).cloned().collect();
    let mut argv = vec![
        BIN_INSIDE.to_owned(),
        "run".to_owned(),
        MODULE_INSIDE.to_owned(),
        "--timeout-ms".to_owned(),
        limits.timeout_ms.to_string(),
        "--memory".to_owned(),
        limits.memory_bytes.to_string(),
        "--max-output".to_owned(),
        limits.max_output_bytes.to_string(),
        "--result-fd".to_owned(),
        "3".to_owned(),
    ];
    for (dir, inside, flag, writable) in [
        (&dirs.inputs, INPUTS_INSIDE, "--inputs", false),
        (&dirs.outputs, OUTPUTS_INSIDE, "--outputs", true),
    ] {
        if let Some(dir) = dir {
            spec.mounts.push(BindMount {
                host: dir.clone(),
                inside: PathBuf::from(inside),
                writable,
            });
            argv.extend([flag.to_owned(), inside.to_owned()]);
        }
    }
    if dirs.http {
        argv.push("--http".to_owned());
    }
    if let Some(cache) = &dirs.cache {
        spec.mounts.push(BindMount {
            host: cache.dir.clone(),
            inside: PathBuf::from(CACHE_INSIDE),
            writable: cache.writable,
        });
        argv.extend(["--cache".to_owned(), CACHE_INSIDE.to_owned()]);
    }
    for queue in &dirs.queues {
        if !moat_worker_api::valid_name(queue) {
            return Err(refused(format!(
                "--queue {queue:?}: not a queue's name (1 to 64 of a-z 0-9 _ . -)"
            )));
        }
        argv.extend(["--queue".to_owned(), queue.clone()]);
    }
    if (dirs.kv.is_some() || !dirs.queues.is_empty()) && !dirs.effects {
        return Err(refused(
            "--kv and --queue need --effects FILE: where the guest's writes and sends go",
        ));
    }
    let bindings = if dirs.kv.is_some() || dirs.message.is_some() || dirs.effects {
        let dir = BindingsDir::make()?;
        for (bytes, file, flag) in [
            (&dirs.kv, KV_FILE, "--kv"),
            (&dirs.message, MESSAGE_FILE, "--message"),
        ] {
            if let Some(bytes) = bytes {
                std::fs::write(dir.0.join(file), bytes).map_err(io(format!("writing {file}")))?;
                argv.extend([flag.to_owned(), format!("{BINDINGS_INSIDE}/{file}")]);
            }
        }
        if dirs.effects {
            argv.extend([
                "--effects".to_owned(),
                format!("{BINDINGS_INSIDE}/{EFFECTS_FILE}"),
            ]);
        }
        spec.mounts.push(BindMount {
            host: dir.0.clone(),
            inside: PathBuf::from(BINDINGS_INSIDE),
            writable: true,
        });
        Some(dir)
    } else {
        None
    };
    if let Some(max) = dirs.max_write {
        argv.extend(["--max-write".to_owned(), max.to_string()]);
    }
    argv.push("--".to_owned());
    // The guest's own argument count is what its start event reports.
    let runtime_argc = argv.len() as u64 - 1;
    argv.extend(guest_args);
    spec.argv = argv;
    spec.mounts.push(BindMount {
        host: binary,
        inside: PathBuf::from(BIN_INSIDE),
        writable: false,
    });
    spec.mounts.push(BindMount {
        host: module.clone(),
        inside: PathBuf::from(MODULE_INSIDE),
        writable: false,
    });
    spec.limits.timeout_ms = limits.timeout_ms.saturating_add(COMPILE_ALLOWANCE_MS);
    spec.limits.memory_bytes = limits.memory_bytes.saturating_add(RUNTIME_MEMORY);
    // The guest's output passes through the runtime's: room for both
    // streams' caps and nothing more.
    // Read once the sandbox is gone (the launcher must stay single-
    // threaded, so no reader thread): the runtime keeps an outcome within
    // a pipe's buffer, so its write never waits for us.
    let (reader, writer) = std::io::pipe().map_err(io("making the worker's outcome pipe"))?;
    spec.pass_fds.push(Arc::new(OwnedFd::from(writer)));
    Ok(OutcomeReader {
        argc: spec.argv.len() as u64 - runtime_argc,
        reader,
        module,
        timeout_ms: limits.timeout_ms,
        memory_limit: limits.memory_bytes,
        bindings: bindings.filter(|_| dirs.effects),
    })
}

/// The runtime's bindings directory on the host (private to root, idmapped
/// into the sandbox as its user's), removed with what is in it.
pub struct BindingsDir(PathBuf);

impl BindingsDir {
    fn make() -> Result<BindingsDir, WorkerSetupError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("moat-worker-{}", moat_core::random::hex(8)));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(io(format!("making {}", path.display())))?;
        Ok(BindingsDir(path))
    }

    /// The effects the runtime wrote, checked; none if it wrote none (it
    /// did not get to run the guest).
    fn take(&self) -> Result<moat_worker_api::Effects, WorkerSetupError> {
        let path = self.0.join(EFFECTS_FILE);
        // The sandbox is gone by now: what is there stays what it is.
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => return Err(refused("the worker's effects are not a regular file")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(moat_worker_api::Effects::default());
            }
            Err(e) => return Err(io("looking at the worker's effects")(e)),
        }
        let file = std::fs::File::open(&path).map_err(io("opening the worker's effects"))?;
        let mut text = Vec::new();
        file.take(MAX_EFFECTS_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(io("reading the worker's effects"))?;
        if text.len() as u64 > MAX_EFFECTS_BYTES {
            return Err(refused(format!(
                "the worker's effects are over {MAX_EFFECTS_BYTES} bytes"
            )));
        }
        serde_json::from_slice(&text)
            .map_err(|e| refused(format!("the worker's effects are not what it writes: {e}")))
    }
}

impl Drop for BindingsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The outcome on its way back from the sandbox.
pub struct OutcomeReader {
    /// The component and its arguments.
    argc: u64,
    reader: std::io::PipeReader,
    module: PathBuf,
    timeout_ms: u64,
    memory_limit: u64,
    /// The runtime's bindings directory, when its effects come back.
    bindings: Option<BindingsDir>,
}

impl OutcomeReader {
    /// Folds the guest's outcome into the sandbox's `report` and `events`
    /// (buffered while the sandbox ran) and sends them on to `sink`, in
    /// order: denials and a timeout before the run's end.
    pub fn finish(
        self,
        report: &mut SandboxReport,
        events: Vec<Event>,
        sink: &mut dyn EventSink,
    ) -> Result<Option<moat_worker_api::Effects>, WorkerSetupError> {
        let effects = self.bindings.as_ref().map(BindingsDir::take).transpose()?;
        // Every write end is closed once the sandbox is gone (the spec that
        // held ours was consumed by the run), so this ends.
        let mut text = String::new();
        let _ = (&self.reader)
            .take(moat_worker_api::MAX_OUTCOME_BYTES as u64)
            .read_to_string(&mut text);
        let outcome: Option<Outcome> = text
            .lines()
            .last()
            .and_then(|line| serde_json::from_str(line).ok());
        report.class = WorkloadClass::Worker;
        let mut added = Vec::new();
        if let Some(outcome) = &outcome {
            self.fold(outcome, report, &mut added);
        } else if report.setup_error.is_none() && !report.timed_out {
            // The runtime ended without an outcome: it could not load the
            // component (its message is on stderr) or was killed.
            report.worker = Some(WorkerReport {
                module_sha256: String::new(),
                compiled: false,
                ended: "notStarted".into(),
                trap: None,
                timeout_ms: self.timeout_ms,
                memory_limit_bytes: self.memory_limit,
                peak_memory_bytes: 0,
                invocation_us: 0,
                granted: Vec::new(),
            });
        }
        let program = self.module.display().to_string();
        for mut event in events {
            match event.event_type {
                EventType::SandboxExecStarted => {
                    if let Some(data) = event.data.as_object_mut() {
                        data.insert("program".into(), program.clone().into());
                        data.insert("argc".into(), self.argc.into());
                        data.insert("class".into(), "worker".into());
                    }
                    sink.emit(event);
                }
                EventType::SandboxExecFinished => {
                    let (at, run_id) = (event.at.clone(), event.run_id.clone());
                    for data in added.drain(..) {
                        sink.emit(Event::of(data, at.clone(), run_id.clone()));
                    }
                    if let Ok(mut data) = serde_json::to_value(&*report)
                        && let (Some(data), Some(old)) =
                            (data.as_object_mut(), event.data.as_object())
                    {
                        // The run's identities the launcher added stay.
                        for key in ["sandboxRunId", "runnerId", "runnerHash", "manifestHash"] {
                            if let Some(value) = old.get(key) {
                                data.insert(key.into(), value.clone());
                            }
                        }
                        event.data = serde_json::Value::Object(data.clone());
                    }
                    sink.emit(event);
                }
                _ => sink.emit(event),
            }
        }
        Ok(effects)
    }

    fn fold(&self, outcome: &Outcome, report: &mut SandboxReport, added: &mut Vec<EventData>) {
        let (ended, trap) = match &outcome.exit {
            WorkerExit::Exited { .. } => ("exited", None),
            WorkerExit::TimedOut => ("timedOut", None),
            WorkerExit::MemoryExceeded => ("memoryExceeded", None),
            WorkerExit::Trapped { message } => ("trapped", Some(first_lines(message))),
        };
        report.worker = Some(WorkerReport {
            module_sha256: outcome.module_hash.clone(),
            compiled: outcome.compiled,
            ended: ended.into(),
            trap,
            timeout_ms: self.timeout_ms,
            memory_limit_bytes: self.memory_limit,
            peak_memory_bytes: outcome.peak_memory_bytes,
            invocation_us: outcome.duration_us,
            granted: GRANTED.iter().map(|g| (*g).to_owned()).collect(),
        });
        for used in &outcome.bindings {
            added.push(EventData::WorkerBinding(WorkerBinding {
                binding: used.binding.clone(),
                call: used.call.clone(),
                name: used.name.clone(),
                bytes: used.bytes,
                outcome: used.outcome.clone(),
                sandbox_run_id: None,
                runner_id: None,
                runner_hash: None,
                manifest_hash: None,
            }));
        }
        report.stdout.truncated |= outcome.stdout_truncated;
        report.stderr.truncated |= outcome.stderr_truncated;
        for denial in &outcome.denials {
            let violation = violation_of(denial);
            let message = violation.describe();
            match denial {
                Denial::File { .. } => added.push(EventData::SandboxViolation(SandboxViolation {
                    layer: violation.layer.clone(),
                    access: violation.access.clone(),
                    object: violation.object.clone(),
                    errno: "not-permitted".into(),
                    message,
                    sandbox_run_id: None,
                    runner_id: None,
                    runner_hash: None,
                    manifest_hash: None,
                })),
                Denial::Socket { address, purpose } => {
                    added.push(EventData::NetworkDenied(NetworkDenied {
                        reason: Some(moat_core::DenialReason::NetworkNotAllowed),
                        detail: Some(purpose.clone()),
                        message: Some(message),
                        address: Some(address.clone()),
                        layer: Some(violation.layer.clone()),
                        errno: Some("access-denied".into()),
                        ..NetworkDenied::default()
                    }))
                }
            }
            merge(&mut report.violations, violation);
        }
        if outcome.exit == WorkerExit::TimedOut {
            report.timed_out = true;
            added.push(EventData::ProcessTimeout(ProcessTimeout {
                timeout_ms: self.timeout_ms,
                killed: "worker invocation".into(),
                sandbox_run_id: None,
                runner_id: None,
                runner_hash: None,
                manifest_hash: None,
            }));
        }
    }
}

/// A denial as the report counts it: layer `wasi`.
fn violation_of(denial: &Denial) -> Violation {
    let (access, object) = match denial {
        Denial::File { path } => ("fs.open", path.clone()),
        Denial::Socket { address, purpose } if purpose == "resolve" => {
            ("net.resolve", address.clone())
        }
        Denial::Socket { address, purpose } => ("net.socket", format!("{purpose} ({address})")),
    };
    Violation {
        layer: "wasi".into(),
        access: access.into(),
        object: Some(object),
        count: 1,
    }
}

fn merge(list: &mut Vec<Violation>, violation: Violation) {
    match list.iter_mut().find(|v| {
        v.layer == violation.layer && v.access == violation.access && v.object == violation.object
    }) {
        Some(known) => known.count += 1,
        None => list.push(violation),
    }
}

fn first_lines(message: &str) -> String {
    message.lines().take(3).collect::<Vec<_>>().join("\n")
}

/// A worker gets no directories, network or environment: flags that
/// would give a program them are refused, not ignored.
pub fn refuse_program_flags(
    has_roots: bool,
    network_ok: bool,
    has_env: bool,
) -> Result<(), WorkerSetupError> {
    if has_roots {
        return Err(refused(
            "--class worker runs a WebAssembly component, which sees no directories: drop \
             --workspace, --ro and --rw (--input and --output grant its inputs and outputs \
             bindings)",
        ));
    }
    if !network_ok {
        return Err(refused(
            "--class worker runs a component, which has no network of its own: --network \
             allowlist (or proxy-only) grants its http binding, through the egress proxy; \
             off is the default",
        ));
    }
    if has_env {
        return Err(refused(
            "--class worker runs a component, which has no environment: drop --env",
        ));
    }
    Ok(())
}
