//! `moat exec`: run one program in the OS sandbox.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use moat_core::size::parse_size;
use moat_core::{
    Event, EventSink, ExitStatus, Limits, NetworkMode, RootView, SandboxMode, WorkloadClass,
};
use moat_egress::{EgressConfig, EgressLimits, EgressPolicy, parse_resolve};
use moat_sandbox::hostid::IdRange;
use moat_sandbox::microvm::VmOptions;
use moat_sandbox::{BindMount, LaunchPolicy, OutputMode, SandboxSpec};
use moat_shell::egress::OneRunEgress;

const EXAMPLES: &str = "\
Examples:
  moat exec -- /bin/echo hello
  moat exec --workspace ./project -- make test
  moat exec --mode read-only --input ./data --output ./out -- python3 /workspace/input/job.py
  moat exec --memory 128M --pids 64 --timeout 10s --report - -- ./build.sh
  moat exec --network allowlist --allow-domain pypi.org --allow-domain '*.pythonhosted.org' \
      --events - -- pip download requests
  moat exec --class microvm --workspace ./project -- ./third-party-tool
  moat exec --class worker --timeout 5s --memory 64M -- ./job.wasm ARG
  moat exec --network ingress-only --expose 8000 -- python3 -m http.server 8000

With --class microvm the program runs in a disposable virtual machine with a
kernel of its own (QEMU's microvm machine, moat as its init), and QEMU in a
sandbox as below: same flags, exit codes and report (which names the
accelerator). Without usable KVM it needs --allow-degraded to run under
software emulation.

With --class worker PROGRAM is a WebAssembly component (WASI 0.2; built from
Python with componentize-py, from JavaScript with jco, or any other). It gets
its arguments, stdout, stderr, clocks and randomness: no directories,
sockets or environment (--workspace, --ro, --rw, --env and --network full or
ingress-only are refused). Each file it opens and each socket it asks for is
refused and recorded (sandbox.violation, network.denied, layer wasi). Beyond
that it has Moat's bindings where granted: --input DIR its `inputs` (read
files under DIR), --output DIR its `outputs` (write files there, --max-write
bytes in all, 64M by default), --network allowlist its `http` (requests sent
through the egress proxy, with the --allow-domain rules and events as
below), --kv FILE its `kv` (the namespaces of a JSON snapshot) and --queue
NAME its `queue` sends, both written to --effects FILE (JSON) once it ended
rather than made (a control plane makes them when an invocation succeeds),
--message FILE the message `queue.message` returns; every call is a
worker.binding event. --timeout is its
deadline (exit 124, process.timeout; compiling it first is not counted),
--memory its linear memory (exit 137 when it runs out), --max-output its
streams. The wasmtime process runs in a read-only namespace sandbox as below.

Inside the sandbox the program sees only the system directories (/usr, /bin,
/lib...), a private /tmp, /proc and a minimal /dev, plus the roots you declare:
--workspace at /workspace, --input at /workspace/input (read-only), --output at
/workspace/output. It has no network but its own loopback unless --network says
otherwise: with allowlist, HTTP_PROXY/HTTPS_PROXY point at Moat's egress proxy,
which lets through only the allowed domains (checking the TLS server name, and
refusing names that resolve to private addresses), records every request as a
network.request event, and is the only address the program can connect to. With
ingress-only, the program can connect nowhere (no proxy, no DNS) and bind only the
--expose ports; each is reached through a unix socket on the host (printed at
start, removed at the end), and every connection to it is a network.ingress event
(method, path, status, bytes; never bodies). No capabilities, a
scrubbed environment (PATH, HOME, TMPDIR, LANG, RUN_ID and --env names only), and
runs as an unprivileged host user even when moat runs as root.

Before anything is mounted, the declared roots pass the launch policy: none may
be, be under or hold a host system path (/proc, /sys, /dev, /run, /boot, /etc),
a container runtime's state (/var/lib/docker...), a credential path in any home
(~/.ssh, ~/.aws, ~/.kube, ~/.docker, ~/.config/gcloud...) or a person's whole
home directory (a project inside it is fine), and none may hold a unix socket,
FIFO or device node. A refusal exits 125 naming the layer launch_policy.
--launch-allow PATH exempts what is under PATH; --override-launch-policy skips
the policy (an escalation, recorded in the report).

Exit status: the program's own; 128+N if killed by signal N; 124 on timeout;
125 if the sandbox could not be set up (the message names the layer); 126 if the
program is not executable; 127 if it is not found; 2 for bad flags or paths.";

/// Run a program in a fresh sandbox and wait for it.
#[derive(Args)]
#[command(after_long_help = EXAMPLES, after_help = "Run `moat exec --help` for examples.")]
pub struct ExecArgs {
    /// What the program may write: read-only, workspace-write or danger-full-access.
    #[arg(long, value_name = "MODE", default_value = "workspace-write")]
    mode: SandboxMode,

    /// Workload class: namespace (Moat's Linux sandbox on the host's kernel),
    /// microvm (a disposable QEMU virtual machine with a kernel of its
    /// own, whose emulator runs inside a namespace sandbox) or worker (a
    /// WebAssembly component, WASI 0.2, run by wasmtime inside a namespace
    /// sandbox: PROGRAM is the component's .wasm file). microvm needs
    /// qemu-system-x86 and a guest kernel (linux-image-amd64); without usable
    /// hardware virtualization it needs --allow-degraded to run under
    /// software emulation, and the report says which accelerator ran.
    #[arg(long, value_name = "CLASS", default_value = "namespace")]
    class: WorkloadClass,

    /// microvm: the guest kernel (default: the newest /boot/vmlinuz-* whose
    /// modules are installed).
    #[arg(long, value_name = "FILE")]
    vm_kernel: Option<PathBuf>,

    /// microvm: the guest kernel's modules directory (default:
    /// /lib/modules/VERSION, VERSION from the kernel's file name).
    #[arg(long, value_name = "DIR")]
    vm_modules: Option<PathBuf>,

    /// Network: off (only loopback), allowlist (only --allow-domain names, through
    /// Moat's egress proxy), proxy-only (the same proxy; for the tool proxy's
    /// host), ingress-only (no way out; the --expose ports are reached from the
    /// host through unix sockets) or full (the host's network: development only).
    #[arg(long, value_name = "MODE", default_value = "off")]
    network: NetworkMode,

    /// With --network ingress-only: a TCP port (1024-65535) the program may
    /// listen on, reached from the host through a unix socket whose path moat
    /// prints (`curl --unix-socket PATH http://localhost/`). No other port can
    /// be bound. Repeatable.
    #[arg(long = "expose", value_name = "PORT")]
    expose: Vec<u16>,

    /// Put the --expose sockets in DIR (an existing directory: keep it yours
    /// alone), as PORT.sock. By default they go in a new directory (mode
    /// 0700) in $XDG_RUNTIME_DIR or /tmp, removed at the end.
    #[arg(long, value_name = "DIR")]
    expose_dir: Option<PathBuf>,

    /// With --network allowlist/proxy-only: a domain the program may reach,
    /// `api.example.com` or `*.example.com` (subdomains), optionally `:PORT`
    /// (without it: ports 80 and 443). Repeatable.
    #[arg(long = "allow-domain", value_name = "DOMAIN[:PORT]")]
    allow_domains: Vec<String>,

    /// A domain refused even if --allow-domain matches it. Repeatable.
    #[arg(long = "deny-domain", value_name = "DOMAIN[:PORT]")]
    deny_domains: Vec<String>,

    /// A non-public address range the proxy may still dial (it refuses loopback,
    /// private, link-local, CGNAT, unique-local and metadata addresses). Repeatable.
    #[arg(long = "allow-address", value_name = "CIDR")]
    allow_addresses: Vec<String>,

    /// Answer NAME with ADDRESS in the proxy's resolver (like curl --resolve). Repeatable.
    #[arg(long = "resolve", value_name = "NAME=ADDRESS[,ADDRESS]")]
    resolve: Vec<String>,

    /// Egress budget of the run: requests, bytes (both ways) and open connections.
    #[arg(long, value_name = "N", default_value_t = EgressLimits::default().max_requests)]
    egress_max_requests: u64,
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size)]
    egress_max_bytes: u64,
    #[arg(long, value_name = "N", default_value_t = EgressLimits::default().max_connections)]
    egress_max_connections: u64,

    /// Mount DIR at /workspace (writable only in workspace-write).
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,

    /// Mount DIR read-only at /workspace/input.
    #[arg(long, value_name = "DIR")]
    input: Option<PathBuf>,

    /// Mount DIR writable at /workspace/output (read-only in read-only mode).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,

    /// --class worker: grant the `kv` binding over the namespaces of FILE
    /// (JSON: {"namespaces": {NAME: {KEY: BASE64}}}); needs --effects.
    #[arg(long, value_name = "FILE")]
    kv: Option<PathBuf>,

    /// --class worker: let `queue.send` send to NAME (repeatable); needs
    /// --effects.
    #[arg(long = "queue", value_name = "NAME")]
    queues: Vec<String>,

    /// --class worker: the message (a JSON file) `queue.message` returns.
    #[arg(long, value_name = "FILE")]
    message: Option<PathBuf>,

    /// --class worker: write the kv writes and queue sends the component
    /// asked for to FILE (JSON) once it ended.
    #[arg(long, value_name = "FILE")]
    effects: Option<PathBuf>,

    /// Mount HOST read-only at INSIDE (default: the same path). Repeatable.
    #[arg(long = "ro", value_name = "HOST[:INSIDE]")]
    read_only: Vec<String>,

    /// Mount HOST writable at INSIDE (default: the same path). Repeatable.
    #[arg(long = "rw", value_name = "HOST[:INSIDE]")]
    read_write: Vec<String>,

    /// Root filesystem: minimal (system dirs only) or host-ro (the host, read-only,
    /// with credentials and sockets masked).
    #[arg(long, value_name = "VIEW", default_value = "minimal")]
    root: RootView,

    /// Wall-clock limit (e.g. 500ms, 30s, 5m); the whole process tree is killed.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    timeout: Duration,

    /// Memory limit for the whole tree (e.g. 128M, 2G).
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = parse_size)]
    memory: u64,

    /// Most processes and threads alive at once.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pids: u64,

    /// CPU bandwidth in CPUs (e.g. 0.5, 1.5). Default: unlimited.
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    cpus: Option<u64>,

    /// Bytes of stdout and of stderr kept (each); the stream is closed past it.
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_size)]
    max_output: u64,

    /// Size of the private /tmp.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    tmp_size: u64,

    /// A budget for what the program writes into its writable roots, all
    /// together (e.g. 100M): past it, writes fail with ENOSPC and the host's
    /// disk is not touched. The writes go to a size-capped tmpfs over each
    /// root (counted in the memory limit) and reach the roots when the
    /// program ends; renaming a directory there fails with EXDEV.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_write: Option<u64>,

    /// Pass NAME from moat's environment (or set NAME=VALUE). Repeatable.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    env: Vec<String>,

    /// Run even if a protection cannot be applied (e.g. no cgroups for an
    /// unprivileged user); the report says what was enforced.
    #[arg(long)]
    allow_degraded: bool,

    /// Run without a cgroup of the program's own when none can be made,
    /// because where this runs the deployment's limits bound it instead (a
    /// Kubernetes pod's resources.limits). Only the cgroup layer: every
    /// other protection still fails closed. The report says cgroup
    /// not_enforced, and why.
    #[arg(long)]
    without_cgroup_limits: bool,

    /// Allow PATH (and what is under it) as a declared root although the
    /// launch policy refuses it: a system, credential or container-runtime
    /// path, or a directory holding a socket, FIFO or device. Repeatable.
    /// The report lists what it exempted.
    #[arg(long = "launch-allow", value_name = "PATH")]
    launch_allow: Vec<PathBuf>,

    /// Do not apply the launch policy to any declared root. An escalation:
    /// the report says the layer was not enforced, and `moat audit` lists it.
    #[arg(long)]
    override_launch_policy: bool,

    /// Launched by root, the program runs as a host uid/gid of its own taken
    /// from this block of ids (BASE:COUNT; e.g. 1879048192:65536), held for
    /// this run alone. Default: the `moat-sandboxes` entries of /etc/subuid and
    /// /etc/subgid, which moat adds on first use. Ignored when not root.
    #[arg(long, value_name = "BASE:COUNT", env = "MOAT_UID_RANGE")]
    uid_range: Option<IdRange>,

    /// Write the JSON report to FILE (`-` = standard error).
    #[arg(long, value_name = "FILE")]
    report: Option<String>,

    /// Write the events as JSON lines to FILE (`-` = standard error).
    #[arg(long, value_name = "FILE")]
    events: Option<String>,

    /// Capture the program's output and print one JSON document (exit code,
    /// stdout, stderr, report) on standard output instead.
    #[arg(long)]
    json: bool,

    /// The program and its arguments (no shell is involved).
    #[arg(last = true, required = true, value_name = "PROGRAM [ARGS]")]
    command: Vec<String>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 500ms, 30s, 5m)"))
}

fn parse_cpus(text: &str) -> Result<u64, String> {
    let cpus: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of CPUs (examples: 0.5, 2)"))?;
    if !(0.01..=1024.0).contains(&cpus) {
        return Err("CPUs must be between 0.01 and 1024".into());
    }
    Ok((cpus * 1000.0).round() as u64)
}

pub fn main(args: ExecArgs) -> ExitCode {
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("moat exec: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: ExecArgs) -> anyhow::Result<u8> {
    moat_sandbox::hold_interrupts();
    let mut spec = build_spec(&args)?;
    let mut events = EventWriter::open(args.events.as_deref())?;
    let mut report_out = match args.report.as_deref() {
        None => None,
        Some("-") => Some(Output::Stderr),
        Some(path) => Some(Output::File(
            File::create(path).with_context(|| format!("--report {path}"))?,
        )),
    };
    if spec.mode == SandboxMode::DangerFullAccess {
        eprintln!(
            "moat: WARNING: danger-full-access: the host root is writable from inside the \
             sandbox (as the run's host uid). Use it on a development machine only."
        );
    }
    let output = if args.json {
        OutputMode::Capture
    } else {
        OutputMode::Forward
    };
    if spec.launch_policy.overridden {
        eprintln!(
            "moat: WARNING: --override-launch-policy: declared roots are not checked for system, \
             credential or container-runtime paths, sockets or devices."
        );
    }
    if spec.network == NetworkMode::Full {
        eprintln!(
            "moat: WARNING: --network full: the sandbox shares the host's network (every \
             address, every port, no proxy, no record of connections). Development use only."
        );
    }
    let sockets = ExposeDir::make(&args, &mut spec)?;
    let memory = spec.limits.memory_bytes;
    let timeout = spec.limits.timeout_ms;
    let worker = match args.class {
        WorkloadClass::Worker => {
            let dirs = moat_shell::worker::BindingDirs {
                cache: None,
                inputs: args.input.clone(),
                outputs: args.output.clone(),
                max_write: args.max_write,
                http: args.network.uses_egress_proxy(),
                kv: read_binding_file(args.kv.as_deref(), "--kv")?,
                queues: args.queues.clone(),
                message: read_binding_file(args.message.as_deref(), "--message")?,
                effects: args.effects.is_some(),
            };
            Some(moat_shell::worker::prepare(&mut spec, &dirs)?)
        }
        _ => None,
    };
    let mut egress = egress_setup(&args, &spec.run_id)?;
    let hook = egress
        .as_mut()
        .map(|hook| hook as &mut dyn moat_sandbox::EgressHook);
    let outcome = match args.class {
        WorkloadClass::Namespace => moat_sandbox::run_with_egress(spec, output, &mut events, hook)?,
        WorkloadClass::Microvm => {
            let vm = VmOptions {
                moat: std::env::current_exe()
                    .context("finding the moat binary (the guest's init)")?,
                kernel: args.vm_kernel.clone(),
                modules: args.vm_modules.clone(),
                qemu: None,
                allow_emulation: false,
            };
            moat_sandbox::microvm::run(spec, &vm, output, &mut events, hook)?
        }
        WorkloadClass::Worker => {
            // The sandbox's events wait until the guest's outcome is read,
            // so that its denials come before the run's end.
            let mut buffered = Vec::new();
            let mut outcome = moat_sandbox::run_with_egress(spec, output, &mut buffered, hook)?;
            if let Some(worker) = worker {
                let effects = worker.finish(&mut outcome.report, buffered, &mut events)?;
                if let (Some(effects), Some(target)) = (effects, &args.effects) {
                    let text = serde_json::to_vec_pretty(&effects)?;
                    std::fs::write(target, text)
                        .with_context(|| format!("writing the effects to {}", target.display()))?;
                }
            }
            outcome
        }
    };
    drop(sockets);
    let report = &outcome.report;
    if let Some(out) = &mut report_out {
        let text = serde_json::to_string_pretty(report)?;
        out.write_line(&text).context("writing the report")?;
    }
    if args.json {
        let doc = serde_json::json!({
            "exitCode": report.exit_code,
            "stdout": String::from_utf8_lossy(&outcome.stdout),
            "stderr": String::from_utf8_lossy(&outcome.stderr),
            "report": report,
        });
        // A closed reader loses the document, not the program's exit status.
        let _ = writeln!(io::stdout(), "{doc}");
    }
    if let Some(error) = &report.setup_error {
        eprintln!("moat: sandbox setup failed: {error}");
    } else if report.timed_out && args.class == WorkloadClass::Worker {
        eprintln!("moat: the worker's deadline ({timeout} ms) passed; the guest was interrupted");
    } else if report.timed_out {
        eprintln!("moat: timed out after {timeout} ms; the process tree was killed");
    } else if let Some(worker) = &report.worker
        && worker.ended == "memoryExceeded"
    {
        eprintln!(
            "moat: the worker's memory limit ({}) was reached; the guest failed to grow its memory",
            moat_core::size::format_size(memory)
        );
    } else if let Some(trap) = report.worker.as_ref().and_then(|w| w.trap.as_ref()) {
        eprintln!("moat: the worker trapped: {trap}");
    } else if report.oom_killed {
        eprintln!(
            "moat: the memory limit ({}) was reached; the out-of-memory killer stopped the program",
            moat_core::size::format_size(memory)
        );
    } else if let ExitStatus::ExecFailed { errno } = report.exit {
        let program = args.command.first().map(String::as_str).unwrap_or_default();
        let why = io::Error::from_raw_os_error(errno);
        eprintln!("moat: cannot execute {program} in the sandbox: {why}");
    }
    Ok(u8::try_from(report.exit_code).unwrap_or(255))
}

fn build_spec(args: &ExecArgs) -> anyhow::Result<SandboxSpec> {
    match args.mode {
        SandboxMode::ArtifactWrite => bail!(
            "--mode artifact-write belongs to the capability shell (`moat shell`); \
             moat exec takes read-only, workspace-write or danger-full-access"
        ),
        _ if args.class != WorkloadClass::Microvm
            && (args.vm_kernel.is_some() || args.vm_modules.is_some()) =>
        {
            bail!("--vm-kernel and --vm-modules choose the guest of --class microvm: add it")
        }
        _ if args.class == WorkloadClass::Worker => {
            let has_roots = args.workspace.is_some()
                || !args.read_only.is_empty()
                || !args.read_write.is_empty();
            moat_shell::worker::refuse_program_flags(
                has_roots,
                args.network == NetworkMode::Off || args.network.uses_egress_proxy(),
                !args.env.is_empty(),
            )?;
        }
        _ if args.kv.is_some()
            || !args.queues.is_empty()
            || args.message.is_some()
            || args.effects.is_some() =>
        {
            bail!(
                "--kv, --queue, --message and --effects grant a worker's bindings: they need \
                 --class worker"
            )
        }
        _ if args.class == WorkloadClass::Microvm && args.network == NetworkMode::IngressOnly => {
            bail!(
                "--network ingress-only runs in the namespace class: a microvm guest's ports \
                 live in its own kernel, which the exposed sockets do not reach"
            )
        }
        _ if args.network != NetworkMode::IngressOnly
            && (!args.expose.is_empty() || args.expose_dir.is_some()) =>
        {
            bail!(
                "--expose and --expose-dir make ports reachable in --network ingress-only: add it"
            )
        }
        _ if !args.network.uses_egress_proxy() && has_egress_flags(args) => {
            bail!(
                "--allow-domain, --deny-domain, --allow-address and --resolve configure the \
                 egress proxy: add --network allowlist"
            )
        }
        _ => {}
    }
    let mut spec = SandboxSpec::new(run_id(), args.command.clone());
    // A worker's runtime writes nothing but its outputs binding's files.
    spec.mode = match args.class {
        WorkloadClass::Worker if args.output.is_some() || args.effects.is_some() => {
            SandboxMode::WorkspaceWrite
        }
        WorkloadClass::Worker => SandboxMode::ReadOnly,
        _ => args.mode,
    };
    spec.network = args.network;
    spec.root_view = args.root;
    spec.allow_degraded = args.allow_degraded;
    spec.without_cgroup = args.without_cgroup_limits;
    spec.id_range = args.uid_range;
    spec.launch_policy = LaunchPolicy {
        allow: args.launch_allow.clone(),
        overridden: args.override_launch_policy,
    };
    spec.limits = Limits {
        timeout_ms: u64::try_from(args.timeout.as_millis()).unwrap_or(u64::MAX),
        memory_bytes: args.memory,
        pids: args.pids,
        cpu_millis: args.cpus,
        max_output_bytes: args.max_output,
        tmp_size_bytes: args.tmp_size,
        max_write_bytes: args.max_write,
        ..Limits::default()
    };
    let mut mount = |host: &Path, inside: &str, writable: bool| {
        spec.mounts.push(BindMount {
            host: host.to_path_buf(),
            inside: PathBuf::from(inside),
            writable,
        })
    };
    if let Some(dir) = &args.workspace {
        mount(dir, "/workspace", true);
    }
    // A worker's are its bindings' directories (moat_shell::worker mounts them).
    if args.class != WorkloadClass::Worker {
        if let Some(dir) = &args.input {
            mount(dir, "/workspace/input", false);
        }
        if let Some(dir) = &args.output {
            mount(dir, "/workspace/output", true);
        }
    }
    for (list, writable) in [(&args.read_only, false), (&args.read_write, true)] {
        for item in list {
            let (host, inside) = split_bind(item)?;
            spec.mounts.push(BindMount {
                host,
                inside,
                writable,
            });
        }
    }
    for item in &args.env {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => {
                let value = std::env::var(item).with_context(|| {
                    format!("--env {item}: not set (or not UTF-8) in moat's environment")
                })?;
                (item.clone(), value)
            }
        };
        spec.env.push((name, value));
    }
    Ok(spec)
}

fn has_egress_flags(args: &ExecArgs) -> bool {
    [
        &args.allow_domains,
        &args.deny_domains,
        &args.allow_addresses,
        &args.resolve,
    ]
    .iter()
    .any(|list| !list.is_empty())
}

/// The egress of a proxied run (its proxy starts once the sandbox is set
/// up); `None` for the other network modes.
fn egress_setup(args: &ExecArgs, run_id: &str) -> anyhow::Result<Option<OneRunEgress>> {
    if !args.network.uses_egress_proxy() {
        return Ok(None);
    }
    let policy = EgressPolicy {
        allow: args.allow_domains.clone(),
        deny: args.deny_domains.clone(),
        allow_addresses: args.allow_addresses.clone(),
    };
    policy
        .compile()
        .context("--allow-domain/--deny-domain/--allow-address")?;
    if policy.allow.is_empty() {
        eprintln!(
            "moat: note: --network {} without --allow-domain: every request will be refused",
            args.network
        );
    }
    let mut config = EgressConfig {
        run_id: run_id.to_owned(),
        limits: EgressLimits {
            max_requests: args.egress_max_requests,
            max_bytes: args.egress_max_bytes,
            max_connections: args.egress_max_connections,
        },
        allow_degraded: args.allow_degraded,
        ..EgressConfig::default()
    };
    for entry in &args.resolve {
        let (name, addresses) = parse_resolve(entry).context("--resolve")?;
        config.hosts.insert(name, addresses);
    }
    Ok(Some(OneRunEgress::new(config, policy)))
}

/// `HOST[:INSIDE]`; without INSIDE the root appears at its canonical host path.
fn split_bind(item: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (host, inside) = match item.rsplit_once(':') {
        Some((host, inside)) if inside.starts_with('/') && !host.is_empty() => {
            (PathBuf::from(host), Some(PathBuf::from(inside)))
        }
        _ => (PathBuf::from(item), None),
    };
    let inside = match inside {
        Some(inside) => inside,
        None => std::fs::canonicalize(&host).with_context(|| format!("{}", host.display()))?,
    };
    Ok((host, inside))
}

/// The directory moat made for a run's `--expose` sockets (mode 0700, so
/// only moat's user reaches the ports), removed at the end; `None` when
/// `--expose-dir` named the caller's own.
struct ExposeDir(Option<PathBuf>);

impl ExposeDir {
    /// Makes the directory, names each port's socket in `spec`, and tells
    /// the user where the ports are.
    fn make(args: &ExecArgs, spec: &mut SandboxSpec) -> anyhow::Result<ExposeDir> {
        if args.expose.is_empty() {
            return Ok(ExposeDir(None));
        }
        moat_sandbox::spec::check_ports(&args.expose).context("--expose")?;
        let (dir, made) = match &args.expose_dir {
            Some(dir) => {
                let dir = std::path::absolute(dir)
                    .with_context(|| format!("--expose-dir {}", dir.display()))?;
                if !moat_sandbox::spec::is_private_dir(&dir) {
                    bail!(
                        "--expose-dir {}: must be a directory (not a link) owned by moat's user \
                         and writable by nobody else",
                        dir.display()
                    );
                }
                (dir, ExposeDir(None))
            }
            None => {
                // $XDG_RUNTIME_DIR only when it is really ours (an inherited
                // one, under `su` or `sudo -E`, may belong to someone else).
                let base = std::env::var_os("XDG_RUNTIME_DIR")
                    .map(PathBuf::from)
                    .filter(|dir| dir.is_absolute() && moat_sandbox::spec::is_private_dir(dir))
                    .unwrap_or_else(|| PathBuf::from("/tmp"));
                let dir = base.join(format!("moat-{}", spec.run_id));
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&dir)
                    .with_context(|| {
                        format!("making {} for the --expose sockets", dir.display())
                    })?;
                (dir.clone(), ExposeDir(Some(dir)))
            }
        };
        for port in &args.expose {
            let socket = dir.join(format!("{port}.sock"));
            spec.expose.push(moat_sandbox::ExposedPort {
                port: *port,
                socket,
            });
        }
        for exposed in &spec.expose {
            eprintln!(
                "moat: port {} of the sandbox is at {}\nmoat:   curl --unix-socket {} http://localhost/",
                exposed.port,
                exposed.socket.display(),
                exposed.socket.display()
            );
        }
        Ok(made)
    }
}

impl Drop for ExposeDir {
    fn drop(&mut self) {
        // The launcher removed the sockets; an empty directory is all that is left.
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn run_id() -> String {
    format!("run-{}", moat_core::random::hex(8))
}

enum Output {
    Stderr,
    File(File),
}

impl Output {
    fn write_line(&mut self, text: &str) -> io::Result<()> {
        match self {
            Output::Stderr => writeln!(io::stderr().lock(), "{text}"),
            Output::File(file) => {
                writeln!(file, "{text}")?;
                file.flush()
            }
        }
    }
}

/// JSON-lines events, written as they happen.
struct EventWriter {
    out: Option<Output>,
}

impl EventWriter {
    fn open(target: Option<&str>) -> anyhow::Result<Self> {
        let out = match target {
            None => None,
            Some("-") => Some(Output::Stderr),
            Some(path) => Some(Output::File(
                File::create(path).with_context(|| format!("--events {path}"))?,
            )),
        };
        Ok(EventWriter { out })
    }
}

impl EventSink for EventWriter {
    fn emit(&mut self, event: Event) {
        if let Some(out) = &mut self.out
            && let Ok(line) = serde_json::to_string(&event)
            && let Err(e) = out.write_line(&line)
        {
            eprintln!("moat: cannot write an event: {e}");
        }
    }
}

/// A worker binding's file (`--kv`, `--message`), read by moat (as its
/// caller) and handed to the runtime: a kv snapshot must be one, and a
/// message must be JSON, before anything starts.
fn read_binding_file(path: Option<&Path>, flag: &str) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let bytes = std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))?;
    let parsed = match flag {
        "--kv" => serde_json::from_slice::<moat_worker_api::KvSnapshot>(&bytes).map(|_| ()),
        _ => serde_json::from_slice::<serde_json::Value>(&bytes).map(|_| ()),
    };
    parsed.with_context(|| match flag {
        "--kv" => format!(
            "--kv {}: not a kv snapshot ({{\"namespaces\": {{NAME: {{KEY: BASE64}}}}}})",
            path.display()
        ),
        _ => format!("{flag} {}: not JSON", path.display()),
    })?;
    Ok(Some(bytes))
}
