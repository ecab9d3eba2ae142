//! `moat runner start`: the command line of `moat_runner::run`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
#[command(group = clap::ArgGroup::new("token").required(true).args(["bootstrap_token_file", "enrolment_token_file"]))]
pub struct StartArgs {
    /// The control plane's base URL, e.g. http://127.0.0.1:7700.
    #[arg(long, value_name = "URL")]
    control_plane: String,
    /// File holding a single-use bootstrap token (`POST /v1/bootstrap-tokens`):
    /// this start spends it, the next needs a new one. Read once; never
    /// passed on to a child.
    #[arg(long, value_name = "FILE")]
    bootstrap_token_file: Option<PathBuf>,
    /// File holding a token from an identity provider the org enrolled
    /// (`POST /v1/runner-enrolments`), e.g. a Kubernetes pod's projected
    /// service-account token: reusable until it expires, so every start
    /// registers without anyone writing a token. Read once per start;
    /// never passed on to a child.
    #[arg(long, value_name = "FILE")]
    enrolment_token_file: Option<PathBuf>,
    /// Trust only the certificate authorities in this PEM file for an
    /// https:// control plane (a private CA; default: the public roots).
    #[arg(long, value_name = "FILE", env = "MOAT_CA_FILE")]
    ca_file: Option<PathBuf>,
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
    /// Allow PATH as a declared root of the runs' sandboxes although the
    /// launch policy refuses it (see `moat exec --help`). Repeatable.
    #[arg(long = "launch-allow", value_name = "PATH")]
    launch_allow: Vec<PathBuf>,
    /// Do not apply the launch policy to the runs' sandboxes: an
    /// escalation every op's report records and `moat audit` lists.
    #[arg(long)]
    override_launch_policy: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics, without a token
    /// (operations by kind and status, refusals by layer, teardowns and
    /// their failed checks, runs being served). Bind it where only your
    /// Prometheus reaches, e.g. 127.0.0.1:9465.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Offer this workload class besides namespace (repeatable): microvm
    /// runs each program the policy puts there in a disposable QEMU
    /// virtual machine (see `moat exec --help`). The manifest must list
    /// it; at start the runner boots a probe guest to learn its
    /// accelerator, and refuses to start when only software emulation
    /// works and the manifest does not say `allowEmulation`.
    #[arg(long = "class", value_name = "CLASS")]
    classes: Vec<moat_core::WorkloadClass>,
    /// microvm: the guest kernel (default: the newest /boot/vmlinuz-* whose
    /// modules are installed).
    #[arg(long, value_name = "FILE")]
    vm_kernel: Option<PathBuf>,
    /// microvm: the guest kernel's modules directory (default:
    /// /lib/modules/VERSION).
    #[arg(long, value_name = "DIR")]
    vm_modules: Option<PathBuf>,
    /// The host this runner runs on, as the control plane shows it and
    /// will place runs by (default: /etc/machine-id). 1 to 128 of
    /// A-Z a-z 0-9 . _ : -
    #[arg(long, value_name = "ID")]
    host_id: Option<String>,
    /// A label for placement and the operator's view (repeatable), e.g.
    /// --label zone=a --label dedicated=acme.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// CPUs this runner may hand out to runs (e.g. 4 or 1.5): a run whose
    /// manifest limits CPU (limits.cpuMillis) reserves that much while
    /// held, and the runner claims no run that would not fit. Default: the
    /// CPUs this process may use.
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    cpus: Option<u64>,
    /// Memory this runner may hand out to runs (e.g. 16GiB): each run
    /// reserves its manifest's memory limit while held. Default: the
    /// host's memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    memory: Option<u64>,
}

/// `--cpus`: a positive number of CPUs, to the thousandth; in millicores.
fn parse_cpus(text: &str) -> Result<u64, String> {
    let cpus: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of CPUs (e.g. 4 or 1.5)"))?;
    if !(0.001..=100_000.0).contains(&cpus) {
        return Err("give 0.001 to 100000 CPUs".into());
    }
    Ok((cpus * 1000.0).round() as u64)
}

/// `--memory`: a size (`512MiB`, `16GiB`), more than zero.
fn parse_memory(text: &str) -> Result<u64, String> {
    match moat_core::size::parse_size(text) {
        Ok(0) => Err("give more than 0 bytes".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The labels given, checked: `KEY=VALUE` each, a key once.
fn labels(given: &[String]) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut labels = std::collections::BTreeMap::new();
    for entry in given {
        let (key, value) = entry
            .split_once('=')
            .ok_or_else(|| format!("--label {entry:?}: give KEY=VALUE"))?;
        moat_core::host::check_label(key, value).map_err(|e| format!("--label: {e}"))?;
        if labels.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("--label: {key} is given twice"));
        }
    }
    if labels.len() > 32 {
        return Err("--label: at most 32".into());
    }
    Ok(labels)
}

/// `--host-id`, checked, or this machine's id (`/etc/machine-id`) when it
/// has a usable one: a container's is often empty, and then the runner
/// registers without one (give `--host-id`).
fn host_id(given: Option<String>) -> Result<Option<String>, String> {
    if let Some(id) = given {
        moat_core::host::check_host_id(&id).map_err(|e| format!("--host-id: {e}"))?;
        return Ok(Some(id));
    }
    let found = std::fs::read_to_string("/etc/machine-id")
        .map_err(|e| e.to_string())
        .and_then(|text| {
            let id = text.trim().to_owned();
            moat_core::host::check_host_id(&id).map(|()| id)
        });
    match found {
        Ok(id) => Ok(Some(id)),
        Err(why) => {
            eprintln!(
                "moat runner: /etc/machine-id: {why}; registering without a host id \
                 (give --host-id)"
            );
            Ok(None)
        }
    }
}

pub fn main(args: StartArgs) -> ExitCode {
    let microvm = args.classes.contains(&moat_core::WorkloadClass::Microvm);
    if !microvm && (args.vm_kernel.is_some() || args.vm_modules.is_some()) {
        eprintln!(
            "moat runner: error: --vm-kernel and --vm-modules choose the guest of --class \
             microvm: add it"
        );
        return ExitCode::from(2);
    }
    let program = match std::env::current_exe() {
        Ok(me) => me,
        Err(e) => {
            eprintln!("moat runner: error: finding this binary: {e}");
            return ExitCode::from(2);
        }
    };
    let token = match (args.bootstrap_token_file, args.enrolment_token_file) {
        (Some(file), None) => moat_runner::TokenFile::Bootstrap(file),
        (None, Some(file)) => moat_runner::TokenFile::Enrolment(file),
        // clap's group makes exactly one of them present.
        _ => {
            eprintln!(
                "moat runner: error: give exactly one of --bootstrap-token-file and --enrolment-token-file"
            );
            return ExitCode::from(2);
        }
    };
    let (host_id, labels) = match (host_id(args.host_id), labels(&args.labels)) {
        (Ok(id), Ok(labels)) => (id, labels),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("moat runner: error: {e}");
            return ExitCode::from(2);
        }
    };
    let config = moat_runner::Config {
        control_plane: args.control_plane,
        token,
        state_dir: args.state_dir,
        max_runs: args.max_runs,
        resolve: args.resolve,
        slots: args.slots,
        uid_range: args.uid_range,
        launch_allow: args.launch_allow,
        override_launch_policy: args.override_launch_policy,
        ca_file: args.ca_file,
        program,
        metrics_listen: args.metrics_listen,
        classes: args.classes,
        vm_kernel: args.vm_kernel,
        vm_modules: args.vm_modules,
        host_id,
        labels,
        cpu_millis: args.cpus,
        memory_bytes: args.memory,
    };
    match moat_runner::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat runner: error: {e}");
            ExitCode::from(2)
        }
    }
}
