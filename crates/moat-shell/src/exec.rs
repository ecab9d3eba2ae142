//! `exec_argv`: an allowed executable, run through the OS sandbox.

use std::path::{Path, PathBuf};

use moat_core::op::{ArtifactRef, ExecArgvArgs};
use moat_core::{
    DenialReason, Envelope, Event, EventSink, Manifest, NetworkMode, OpStatus, SandboxMode,
};
use moat_egress::{Egress, EgressPolicy};

use crate::egress::SandboxEgress;
use moat_sandbox::microvm::VmOptions;
use moat_sandbox::{BindMount, ExposedPort, OutputMode, SANDBOX_PATH, SandboxSpec};

use crate::workspace::{PathError, Refusal, Workspace};

/// Output kept inline in the result; beyond it the full (capped) stream is
/// saved as an artifact.
pub const INLINE_OUTPUT: usize = 16 << 10;

/// The checked parameters of one run.
pub struct Plan {
    pub spec: SandboxSpec,
}

fn refuse(reason: DenialReason, message: impl Into<String>) -> Refusal {
    Refusal::new(reason, message)
}

/// Where an inside path lives on the host: `/workspace/...` maps into the
/// workspace; system paths are the host's own (the minimal root binds them).
fn host_path(workspace: &Path, inside: &str) -> PathBuf {
    match inside.strip_prefix("/workspace") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            workspace.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(inside),
    }
}

/// How much of the outside a mode reaches: `ingress-only` reaches nothing
/// (it is only reached).
fn network_rank(mode: NetworkMode) -> u8 {
    match mode {
        NetworkMode::Off | NetworkMode::IngressOnly => 0,
        NetworkMode::ProxyOnly => 1,
        NetworkMode::Allowlist => 2,
        NetworkMode::Full => 3,
    }
}

/// Resolves and checks the executable against the manifest's allowlist
/// (path, and content hash when pinned). Returns the inside path to run.
///
/// `exact`: the operation carries a capability, whose decision (the policy's
/// rules on `Moat::Executable`, the workload class of the entry's origin)
/// was made on the name as given: it must then be an entry's path as
/// listed, not a bare name found on `PATH` or another name of the same file.
fn allowed_executable(
    manifest: &Manifest,
    workspace: &Path,
    program: &str,
    exact: bool,
) -> Result<String, Refusal> {
    let named = manifest
        .allowed_executables
        .iter()
        .find(|allowed| allowed.path == program);
    if exact && named.is_none() {
        return Err(refuse(
            DenialReason::ExecutableNotAllowed,
            format!(
                "{program}: a managed operation names its program exactly as the manifest's \
                 allowedExecutables lists it (the policy decided on that name)"
            ),
        ));
    }
    let candidates: Vec<String> = if program.starts_with('/') {
        vec![program.to_owned()]
    } else if program.contains('/') {
        return Err(refuse(
            DenialReason::ExecutableNotAllowed,
            format!("{program}: give an absolute path or a bare name"),
        ));
    } else {
        SANDBOX_PATH
            .split(':')
            .map(|dir| format!("{dir}/{program}"))
            .collect()
    };
    let resolved = candidates
        .into_iter()
        .find(|c| host_path(workspace, c).is_file())
        .ok_or_else(|| {
            refuse(
                DenialReason::ExecutableNotAllowed,
                format!("{program}: not found"),
            )
        })?;
    let canonical = std::fs::canonicalize(host_path(workspace, &resolved)).map_err(|e| {
        refuse(
            DenialReason::ExecutableNotAllowed,
            format!("{program}: {e}"),
        )
    })?;
    let entry = named
        .filter(|_| exact)
        .or_else(|| {
            manifest.allowed_executables.iter().find(|allowed| {
                std::fs::canonicalize(host_path(workspace, &allowed.path))
                    .ok()
                    .as_ref()
                    == Some(&canonical)
            })
        })
        .ok_or_else(|| {
            refuse(
                DenialReason::ExecutableNotAllowed,
                format!(
                    "{program} ({}) is not in the manifest's allowedExecutables",
                    resolved
                ),
            )
        })?;
    if let Some(expected) = &entry.sha256 {
        let content = std::fs::read(&canonical).map_err(|e| {
            refuse(
                DenialReason::ExecutableNotAllowed,
                format!("{program}: {e}"),
            )
        })?;
        let actual = moat_core::hash::sha256_hex(&content);
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(refuse(
                DenialReason::ExecutableNotAllowed,
                format!("{program}: content hash {actual} is not the pinned {expected}"),
            ));
        }
    }
    Ok(resolved)
}

/// The program's working directory, inside the sandbox. Both the
/// operation's and the envelope's are checked: an escape is refused and
/// recorded even where the other one would have been used.
fn working_directory(
    workspace: &Workspace,
    envelope: &Envelope,
    args: &ExecArgvArgs,
) -> Result<PathBuf, PathError> {
    let mut cwd = PathBuf::from("/workspace");
    for given in [envelope.cwd.as_deref(), args.cwd.as_deref()]
        .into_iter()
        .flatten()
    {
        cwd = Path::new("/workspace").join(workspace.directory(given)?);
    }
    Ok(cwd)
}

/// Checks `args` against the manifest and builds the sandbox spec.
///
/// `expose_dir`: where the runtime reaches an `ingress-only` program's
/// ports (one socket per port; `moat shell --expose-dir`). Without one, an
/// operation that asks for `ingress-only` is refused.
pub fn plan(
    manifest: &Manifest,
    workspace: &Workspace,
    mode: SandboxMode,
    envelope: &Envelope,
    args: &ExecArgvArgs,
    sandbox_run_id: String,
    expose_dir: Option<&Path>,
) -> Result<Plan, PathError> {
    let cwd = working_directory(workspace, envelope, args)?;
    Ok(checked(
        &Asked {
            manifest,
            workspace,
            mode,
            envelope,
            args,
            expose_dir,
        },
        sandbox_run_id,
        cwd,
    )?)
}

/// What an `exec_argv` is checked against.
struct Asked<'a> {
    manifest: &'a Manifest,
    workspace: &'a Workspace,
    mode: SandboxMode,
    envelope: &'a Envelope,
    args: &'a ExecArgvArgs,
    expose_dir: Option<&'a Path>,
}

/// The sockets an `ingress-only` operation's ports are reached through:
/// each port the manifest's `networkPolicy.expose` lists, at
/// `DIR/PORT.sock` in the runtime's directory. A socket left there by an
/// operation that ended badly is removed first (the directory is the
/// runtime's alone, and one operation runs at a time).
fn exposed_ports(asked: &Asked<'_>, network: NetworkMode) -> Result<Vec<ExposedPort>, Refusal> {
    let ports = &asked.args.expose;
    if network != NetworkMode::IngressOnly {
        if !ports.is_empty() {
            return Err(refuse(
                DenialReason::InvalidArgs,
                format!("expose needs network ingress-only, not {network}"),
            ));
        }
        return Ok(Vec::new());
    }
    let Some(dir) = asked.expose_dir else {
        return Err(refuse(
            DenialReason::NetworkNotAllowed,
            "network ingress-only: this shell has no directory to reach exposed ports through \
             (moat shell --expose-dir; a managed runner gives one)",
        ));
    };
    moat_sandbox::spec::check_ports(ports)
        .map_err(|e| refuse(DenialReason::InvalidArgs, e.to_string()))?;
    let allowed = &asked.manifest.network_policy.expose;
    let mut exposed = Vec::with_capacity(ports.len());
    for port in ports {
        if !allowed.contains(port) {
            return Err(refuse(
                DenialReason::NetworkNotAllowed,
                format!("port {port} is not in the manifest's networkPolicy.expose"),
            ));
        }
        let socket = dir.join(format!("{port}.sock"));
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(refuse(
                    DenialReason::NetworkNotAllowed,
                    format!("port {port}: {}: {e}", socket.display()),
                ));
            }
        }
        exposed.push(ExposedPort {
            port: *port,
            socket,
        });
    }
    Ok(exposed)
}

/// The rest of [`plan`], once the working directory is known.
fn checked(asked: &Asked<'_>, sandbox_run_id: String, cwd: PathBuf) -> Result<Plan, Refusal> {
    let Asked {
        manifest,
        workspace,
        mode,
        envelope,
        args,
        ..
    } = *asked;
    let Some(program) = args.argv.first() else {
        return Err(refuse(DenialReason::InvalidArgs, "argv is empty"));
    };
    if args.argv.iter().any(|a| a.contains('\0')) {
        return Err(refuse(
            DenialReason::InvalidArgs,
            "an argument contains a NUL byte",
        ));
    }
    let exact = envelope.capability.is_some();
    let resolved = allowed_executable(manifest, &workspace.path, program, exact)?;
    for name in args.env.keys() {
        if !manifest
            .env_passthrough
            .iter()
            .any(|allowed| allowed == name)
        {
            return Err(refuse(
                DenialReason::EnvNotAllowed,
                format!("{name} is not in the manifest's envPassthrough"),
            ));
        }
    }
    let (network, limits) = asked_limits(manifest, envelope, args)?;
    let expose = exposed_ports(asked, network)?;
    let mut argv = args.argv.clone();
    argv[0] = resolved;
    let mut spec = SandboxSpec::new(sandbox_run_id, argv);
    // The shell's stdin carries the next requests (and their capabilities):
    // never the program's. A tool token is the program's stdin instead.
    spec.stdin_null = true;
    if !args.tool_token.is_empty() {
        let Some(token) = envelope.tool_token.as_deref() else {
            return Err(refuse(
                DenialReason::Unsupported,
                "toolToken: tokens are issued by a control plane to a managed runner, with the operation",
            ));
        };
        spec.stdin_data = Some(format!("{token}\n").into_bytes());
    }
    spec.mode = mode;
    spec.network = network;
    spec.expose = expose;
    spec.without_cgroup = manifest.cgroup_limits == moat_core::manifest::CgroupLimits::Deployment;
    spec.cwd = Some(cwd);
    spec.env = args
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    spec.limits = limits;
    let (read, write) = workspace.roots();
    for (rels, writable) in [(read, false), (write, true)] {
        for rel in rels {
            // An artifact-only root is the program's to read, not to
            // write: mounted read-only, over a writable parent too.
            let writable = writable && !manifest.filesystem.is_artifact_only(&rel);
            spec.mounts.push(BindMount {
                host: workspace.path.join(&rel),
                // Components, not join: the whole workspace (`rel` empty) is "/workspace".
                inside: Path::new("/workspace").join(&rel).components().collect(),
                writable,
            });
        }
    }
    // The same root may be both readable and writable: keep the writable one.
    spec.mounts
        .sort_by(|a, b| a.inside.cmp(&b.inside).then(b.writable.cmp(&a.writable)));
    spec.mounts
        .dedup_by(|later, earlier| later.inside == earlier.inside);
    Ok(Plan { spec })
}

/// The network and limits an `exec_argv` asks for (its own, else its
/// envelope's, else the manifest's), held to the manifest's ceilings.
pub(crate) fn asked_limits(
    manifest: &Manifest,
    envelope: &Envelope,
    args: &ExecArgvArgs,
) -> Result<(NetworkMode, moat_core::Limits), Refusal> {
    let network = args
        .network
        .or(envelope.network)
        .unwrap_or(NetworkMode::Off);
    if network_rank(network) > network_rank(manifest.network_policy.mode) {
        return Err(refuse(
            DenialReason::NetworkNotAllowed,
            format!(
                "network {network} asked, the manifest grants {}",
                manifest.network_policy.mode
            ),
        ));
    }
    let ceiling = &manifest.limits;
    let timeout_ms = args
        .timeout_ms
        .or(envelope.timeout_ms)
        .unwrap_or(ceiling.timeout_ms);
    let max_output = args
        .max_output_bytes
        .or(envelope.max_output_bytes)
        .unwrap_or(ceiling.max_output_bytes);
    if timeout_ms > ceiling.timeout_ms || max_output > ceiling.max_output_bytes {
        return Err(refuse(
            DenialReason::LimitExceeded,
            format!(
                "timeout {timeout_ms} ms / output {max_output} B asked; the manifest allows {} ms / {} B",
                ceiling.timeout_ms, ceiling.max_output_bytes
            ),
        ));
    }
    Ok((
        network,
        moat_core::Limits {
            timeout_ms,
            max_output_bytes: max_output,
            ..ceiling.clone()
        },
    ))
}

/// Events from the sandbox, re-labelled with the agent's run and op ids.
pub struct Relabel<'a> {
    pub events: &'a mut Vec<Event>,
    pub run_id: &'a str,
    pub op_id: &'a str,
    pub correlation_id: &'a str,
}

impl EventSink for Relabel<'_> {
    fn emit(&mut self, mut event: Event) {
        if let Some(map) = event.data.as_object_mut() {
            map.insert("sandboxRunId".into(), event.run_id.clone().into());
        }
        event.run_id = self.run_id.to_owned();
        event.op_id = Some(self.op_id.to_owned());
        event.correlation_id = Some(self.correlation_id.to_owned());
        self.events.push(event);
    }
}

/// What the shell reports of a finished run.
pub struct Finished {
    pub status: OpStatus,
    pub result: serde_json::Value,
    pub message: Option<String>,
    pub outputs: Vec<(&'static str, Vec<u8>)>,
    pub artifacts: Vec<ArtifactRef>,
}

pub fn inline(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(INLINE_OUTPUT)]).into_owned()
}

/// Runs the plan (the shell process is single-threaded, as the launcher
/// requires), in a virtual machine when `vm` says how.
pub fn run(
    plan: Plan,
    sink: &mut dyn EventSink,
    vm: Option<&VmOptions>,
) -> Result<Finished, String> {
    let outcome = match vm {
        None => moat_sandbox::run(plan.spec, OutputMode::Capture, sink),
        Some(vm) => moat_sandbox::microvm::run(plan.spec, vm, OutputMode::Capture, sink, None),
    }
    .map_err(|e| e.to_string())?;
    Ok(finished(outcome))
}

/// Runs a plan whose network goes through `egress` under `policy`; the
/// proxy's events come before `sandbox.exec.finished`.
pub fn run_proxied(
    plan: Plan,
    sink: &mut dyn EventSink,
    egress: &mut Egress,
    policy: &EgressPolicy,
    op_id: &str,
    vm: Option<&VmOptions>,
) -> Result<Finished, String> {
    let mut hook = SandboxEgress::new(egress, policy, Some(op_id));
    let outcome = match vm {
        None => {
            moat_sandbox::run_with_egress(plan.spec, OutputMode::Capture, sink, Some(&mut hook))
        }
        Some(vm) => {
            moat_sandbox::microvm::run(plan.spec, vm, OutputMode::Capture, sink, Some(&mut hook))
        }
    }
    .map_err(|e| e.to_string())?;
    Ok(finished(outcome))
}

/// Runs a `worker` class plan: the sandbox's events wait until the guest's
/// outcome is read (`reader`), so that its denials and binding calls come
/// before the run's end; the effects it asked for come back with it.
pub fn run_worker(
    plan: Plan,
    reader: crate::worker::OutcomeReader,
    sink: &mut dyn EventSink,
    egress: Option<(&mut Egress, &EgressPolicy, &str)>,
) -> Result<(Finished, Option<moat_worker_api::Effects>), String> {
    let mut buffered = Vec::new();
    let mut outcome = match egress {
        None => moat_sandbox::run(plan.spec, OutputMode::Capture, &mut buffered),
        Some((egress, policy, op_id)) => {
            let mut hook = SandboxEgress::new(egress, policy, Some(op_id));
            moat_sandbox::run_with_egress(
                plan.spec,
                OutputMode::Capture,
                &mut buffered,
                Some(&mut hook),
            )
        }
    }
    .map_err(|e| e.to_string())?;
    let effects = reader
        .finish(&mut outcome.report, buffered, sink)
        .map_err(|e| e.to_string())?;
    Ok((finished(outcome), effects))
}

fn finished(outcome: moat_sandbox::RunOutcome) -> Finished {
    let report = &outcome.report;
    let status = if report.setup_error.is_some() {
        OpStatus::Error
    } else if report.timed_out {
        OpStatus::Timeout
    } else {
        OpStatus::Ok
    };
    let result = serde_json::json!({
        "exitCode": report.exit_code,
        "exit": report.exit,
        "stdout": inline(&outcome.stdout),
        "stderr": inline(&outcome.stderr),
        "stdoutBytes": outcome.stdout.len(),
        "stderrBytes": outcome.stderr.len(),
        "stdoutTruncated": report.stdout.truncated || outcome.stdout.len() > INLINE_OUTPUT,
        "stderrTruncated": report.stderr.truncated || outcome.stderr.len() > INLINE_OUTPUT,
        "timedOut": report.timed_out,
        "oomKilled": report.oom_killed,
        "wallMs": report.wall_ms,
        "deniedSyscalls": report.denied_syscalls,
        "violations": report.violations,
        // The blocked-access result, one line per refusal, for the agent
        // and whoever reads its transcript.
        "blocked": report.violations.iter().map(moat_core::Violation::describe).collect::<Vec<_>>(),
        "enforcement": report.enforcement,
        // The class it ran in and, for a virtual machine, how (accelerator,
        // memory, vCPUs, what was degraded).
        "class": report.class,
        "vm": report.vm,
    });
    let mut result = result;
    if let Some(worker) = &report.worker {
        result["worker"] = serde_json::json!(worker);
    }
    Finished {
        status,
        message: report.setup_error.clone(),
        result,
        outputs: vec![("stdout", outcome.stdout), ("stderr", outcome.stderr)],
        artifacts: Vec::new(),
    }
}
