//! `moat shell`: structured operations as JSON lines on stdin, one result
//! line each on stdout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use clap::Args;
use moat_core::{SandboxMode, SignedManifest, WorkloadClass};
use moat_sandbox::hostid::IdRange;
use moat_shell::{Shell, ShellConfig};

use crate::{manifest, state};

const ABOUT: &str = "\
Reads operation envelopes, one JSON object per line, on standard input and
answers each with one JSON result line on standard output, in order:

  {\"id\":\"1\",\"runId\":\"r\",\"correlationId\":\"c\",\"op\":\"artifact_list\",
   \"args\":{\"path\":\".\"},\"createdAt\":\"2026-11-29T12:00:00Z\"}

Operations: artifact_read, artifact_write, artifact_list, exec_argv (with
network off, or proxy-only/allowlist through Moat's egress proxy when the
manifest grants it), http_request (to the manifest's allowDomains or its
profiles, made by the egress proxy), browser_step (a headless Chromium
session in a sandbox of its own, reaching the web through the egress proxy
only; needs an approval). Every request, grant, denial and artifact
is recorded in the ledger in the state directory before its result is
written. The manifest must be signed by the trusted key, unexpired, and not
older than --max-manifest-age. See docs/protocol.md.";

/// Serve structured operations (JSON lines) against a workspace.
#[derive(Args, Clone)]
#[command(after_long_help = ABOUT)]
pub struct ShellArgs {
    /// The signed manifest (see `moat manifest sign`); default: the one
    /// sealed into this binary (`moat runner build`).
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// Public key the manifest must be signed with (default: STATE/trusted.pub).
    #[arg(long, value_name = "FILE")]
    trusted_key: Option<PathBuf>,
    /// The workspace the operations' paths are relative to.
    #[arg(long, value_name = "DIR")]
    workspace: PathBuf,
    /// State directory: ledger and artifacts (default: $MOAT_STATE,
    /// $XDG_STATE_HOME/moat or ~/.local/state/moat).
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
    /// Sandbox mode for exec_argv (default: the manifest's first sandboxModes entry).
    #[arg(long, value_name = "MODE")]
    mode: Option<SandboxMode>,
    /// Refuse a manifest created longer ago than this, even if unexpired.
    #[arg(long, value_name = "DURATION", default_value = "30days", value_parser = humantime::parse_duration)]
    max_manifest_age: Duration,
    /// Answer NAME with ADDRESS in the egress proxy's resolver (like curl
    /// --resolve; for tests and private deployments). Repeatable.
    #[arg(long = "resolve", value_name = "NAME=ADDRESS[,ADDRESS]")]
    resolve: Vec<String>,
    /// Also trust the CA certificates in FILE (PEM) for http_request over HTTPS.
    #[arg(long, value_name = "FILE")]
    egress_ca: Option<PathBuf>,
    /// Managed runner: refuse every operation without a capability signed by
    /// the manifest's control-plane key (see `moat capability issue`).
    #[arg(long)]
    require_capabilities: bool,
    /// Launched by root, each exec_argv sandbox runs as a host uid/gid of its
    /// own from this block (BASE:COUNT). Default: the `moat-sandboxes` entries of
    /// /etc/subuid and /etc/subgid, added on first use.
    #[arg(long, value_name = "BASE:COUNT", env = "MOAT_UID_RANGE")]
    pub uid_range: Option<IdRange>,
    /// Allow PATH as a declared root although the launch policy refuses it
    /// (see `moat exec --help`). Repeatable.
    #[arg(long = "launch-allow", value_name = "PATH")]
    pub launch_allow: Vec<PathBuf>,
    /// Do not apply the launch policy to exec_argv's roots: an escalation
    /// that every report records and `moat audit` lists.
    #[arg(long)]
    pub override_launch_policy: bool,
    /// Offer this workload class besides namespace (repeatable): with
    /// microvm, an exec_argv whose capability says microvm runs in a
    /// disposable virtual machine, and a browser_step `open` so says starts
    /// its session's browser in one (the manifest must list the class;
    /// `allowEmulation` lets it run under software emulation).
    #[arg(long = "class", value_name = "CLASS")]
    pub classes: Vec<WorkloadClass>,
    /// microvm: the guest kernel (default: the newest /boot/vmlinuz-*).
    #[arg(long, value_name = "FILE")]
    pub vm_kernel: Option<PathBuf>,
    /// microvm: the guest kernel's modules directory (default:
    /// /lib/modules/VERSION).
    #[arg(long, value_name = "DIR")]
    pub vm_modules: Option<PathBuf>,
    /// Give an operation in --network ingress-only a unix socket per port
    /// it exposes, DIR/PORT.sock, through which the runtime reaches it
    /// (a managed runner relays the control plane's /v1/runs/RUN/ports/PORT/
    /// route there). DIR must be yours alone and out of the sandbox's
    /// sight; without it such an operation is refused.
    #[arg(long, value_name = "DIR")]
    pub expose_dir: Option<PathBuf>,
}

impl ShellArgs {
    /// The same options, as command-line arguments for a `moat shell` child.
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut out: Vec<std::ffi::OsString> = vec!["shell".into()];
        let mut push = |flag: &str, value: std::ffi::OsString| {
            out.push(flag.into());
            out.push(value);
        };
        if let Some(manifest) = &self.manifest {
            push("--manifest", manifest.clone().into());
        }
        push("--workspace", self.workspace.clone().into());
        if let Some(key) = &self.trusted_key {
            push("--trusted-key", key.clone().into());
        }
        if let Some(state) = &self.state {
            push("--state", state.clone().into());
        }
        if let Some(mode) = self.mode {
            push("--mode", mode.as_str().into());
        }
        for entry in &self.resolve {
            push("--resolve", entry.into());
        }
        if let Some(ca) = &self.egress_ca {
            push("--egress-ca", ca.clone().into());
        }
        push(
            "--max-manifest-age",
            humantime::format_duration(self.max_manifest_age)
                .to_string()
                .into(),
        );
        if self.require_capabilities {
            out.push("--require-capabilities".into());
        }
        if let Some(range) = self.uid_range {
            out.push("--uid-range".into());
            out.push(range.to_string().into());
        }
        for path in &self.launch_allow {
            out.push("--launch-allow".into());
            out.push(path.clone().into());
        }
        if self.override_launch_policy {
            out.push("--override-launch-policy".into());
        }
        for class in &self.classes {
            out.push("--class".into());
            out.push(class.as_str().into());
        }
        if let Some(kernel) = &self.vm_kernel {
            out.push("--vm-kernel".into());
            out.push(kernel.clone().into());
        }
        if let Some(modules) = &self.vm_modules {
            out.push("--vm-modules".into());
            out.push(modules.clone().into());
        }
        if let Some(dir) = &self.expose_dir {
            out.push("--expose-dir".into());
            out.push(dir.clone().into());
        }
        out
    }
}

pub fn main(args: ShellArgs) -> ExitCode {
    match open(args) {
        Ok(mut shell) => {
            let stdin = std::io::stdin().lock();
            let stdout = std::io::stdout().lock();
            match shell.serve(stdin, stdout) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("moat shell: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(e) => {
            eprintln!("moat shell: refusing to start: {e:#}");
            ExitCode::from(2)
        }
    }
}

pub fn open(args: ShellArgs) -> anyhow::Result<Shell> {
    moat_sandbox::hold_interrupts();
    let state = state::dir(args.state)?;
    let key_path = args
        .trusted_key
        .unwrap_or_else(|| state.join("trusted.pub"));
    if !key_path.exists() {
        bail!(
            "no trusted key at {}: pass --trusted-key FILE (the control plane's public key)",
            key_path.display()
        );
    }
    let trusted = manifest::read_public_key(&key_path)?;
    let (signed, source): (SignedManifest, String) = match &args.manifest {
        Some(path) => (manifest::read_json(path)?, path.display().to_string()),
        None => {
            let me = std::env::current_exe().context("finding this binary")?;
            match moat_runner::seal::read_trailer(&me)? {
                Some((signed, _)) => (signed, format!("sealed in {}", me.display())),
                None => bail!("no --manifest, and this binary is not a sealed runner"),
            }
        }
    };
    let verified = signed
        .verify(&trusted)
        .with_context(|| format!("manifest {source}"))?;
    verified
        .check_time(SystemTime::now(), Some(args.max_manifest_age))
        .with_context(|| format!("manifest {source}"))?;
    let mode = match args.mode {
        Some(mode) => mode,
        None => *verified
            .sandbox_modes
            .first()
            .context("the manifest lists no sandbox mode")?,
    };
    let microvm = args.classes.contains(&WorkloadClass::Microvm);
    if !microvm && (args.vm_kernel.is_some() || args.vm_modules.is_some()) {
        bail!("--vm-kernel and --vm-modules choose the guest of --class microvm: add it");
    }
    let vm = if microvm {
        Some(moat_sandbox::microvm::VmOptions {
            moat: std::env::current_exe().context("finding the moat binary (the guest's init)")?,
            kernel: args.vm_kernel.clone(),
            modules: args.vm_modules.clone(),
            qemu: None,
            allow_emulation: verified.allow_emulation,
        })
    } else {
        None
    };
    let expose_dir = match args.expose_dir {
        Some(dir) if !moat_sandbox::spec::is_private_dir(&dir) => bail!(
            "--expose-dir {}: must be a directory (not a link) owned by moat's user that \
             nobody else may write to",
            dir.display()
        ),
        other => other,
    };
    let session_id = format!("shell-{}", moat_core::random::hex(6));
    let mut egress_hosts = std::collections::BTreeMap::new();
    for entry in &args.resolve {
        let (name, addresses) = moat_egress::parse_resolve(entry).context("--resolve")?;
        egress_hosts.insert(name, addresses);
    }
    let egress_roots_pem = match &args.egress_ca {
        Some(path) => {
            Some(std::fs::read(path).with_context(|| format!("--egress-ca {}", path.display()))?)
        }
        None => None,
    };
    Ok(Shell::open(ShellConfig {
        manifest: verified.clone(),
        manifest_hash: signed.manifest_hash.clone(),
        workspace: args.workspace,
        state,
        mode,
        session_id,
        egress_hosts,
        egress_roots_pem,
        require_capabilities: args.require_capabilities,
        id_range: args.uid_range,
        launch_policy: moat_sandbox::LaunchPolicy {
            allow: args.launch_allow,
            overridden: args.override_launch_policy,
        },
        vm,
        expose_dir,
    })?)
}
