//! `exec_argv` in the `worker` class (planned here, run by `Shell::exec`
//! as a program is): `argv[0]` is a WebAssembly component
//! in the workspace, run by `moat-worker` in a namespace sandbox of its
//! own (`crate::worker`). It sees no directory: its `inputs` binding is
//! the workspace's `input/` (read-only), its `outputs` the workspace's
//! `output/` (what it writes there goes through the export boundary as a
//! program's files do), its `http` the egress proxy in the proxy network
//! modes, and its `kv` and `queue` what a queue's delivery granted
//! (`args.worker`). Its kv writes and sends come back in the result
//! (`effects`): the control plane makes them only if it succeeded.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::Path;

use base64::Engine as _;
use moat_core::op::{ExecArgvArgs, WorkerGrants};
use moat_core::{DenialReason, Envelope};
use moat_sandbox::SandboxSpec;

use super::Shell;
use crate::exec::{self, Plan};
use crate::worker::{BindingDirs, CompileCache, OutcomeReader};
use crate::workspace::Refusal;

/// The workspace's directories a worker's `inputs` and `outputs` are.
const INPUTS: &str = "input";
const OUTPUTS: &str = "output";

fn refuse(reason: DenialReason, message: impl Into<String>) -> Refusal {
    Refusal::new(reason, message)
}

impl Shell {
    /// The sandbox around `moat-worker` for `a`, and where its outcome
    /// comes back: every argument checked first.
    pub(super) fn worker_plan(
        &self,
        envelope: &Envelope,
        a: &ExecArgvArgs,
        sandbox_id: String,
    ) -> Result<(Plan, OutcomeReader, CompileCache), Refusal> {
        let manifest = &self.config.manifest;
        if a.cwd.is_some() || !a.env.is_empty() || !a.tool_token.is_empty() || !a.expose.is_empty()
        {
            return Err(refuse(
                DenialReason::InvalidArgs,
                "a worker has no working directory, environment, tool token or ports: drop \
                 cwd, env, toolToken and expose",
            ));
        }
        let Some(module) = a.argv.first() else {
            return Err(refuse(DenialReason::InvalidArgs, "argv is empty"));
        };
        if a.argv.iter().any(|arg| arg.contains('\0')) {
            return Err(refuse(
                DenialReason::InvalidArgs,
                "an argument contains a NUL byte",
            ));
        }
        // The component is a file of the workspace's, named as a program
        // is (`/workspace/...` or relative), read beneath the roots.
        let relative = module.strip_prefix("/workspace/").unwrap_or(module);
        let module_path = self.workspace.regular_file(relative).map_err(|e| match e {
            crate::workspace::PathError::Denied(refusal) => refusal,
            crate::workspace::PathError::Io(e) => refuse(
                DenialReason::InvalidArgs,
                format!("the component {module}: {e}"),
            ),
        })?;
        let (network, limits) = exec::asked_limits(manifest, envelope, a)?;
        if !matches!(
            network,
            moat_core::NetworkMode::Off
                | moat_core::NetworkMode::ProxyOnly
                | moat_core::NetworkMode::Allowlist
        ) {
            return Err(refuse(
                DenialReason::NetworkNotAllowed,
                format!(
                    "a worker has no network of its own: network {network} is refused (off, or \
                     allowlist for its http binding through the egress proxy)"
                ),
            ));
        }
        let (read, write) = self.workspace.roots();
        let root_of = |roots: &[std::path::PathBuf], name: &str| {
            roots
                .iter()
                .any(|r| r.as_os_str().is_empty() || r == std::path::Path::new(name))
        };
        let inputs = self.workspace.path.join(INPUTS);
        let outputs = self.workspace.path.join(OUTPUTS);
        let outputs_granted = root_of(&write, OUTPUTS)
            && !manifest
                .filesystem
                .is_artifact_only(std::path::Path::new(OUTPUTS));
        if outputs_granted && !outputs.exists() {
            std::fs::create_dir(&outputs).map_err(|e| {
                refuse(
                    DenialReason::Unsupported,
                    format!("making the workspace's {OUTPUTS}/: {e}"),
                )
            })?;
        }
        let grants = a.worker.clone().unwrap_or_default();
        let kv = worker_kv(&grants)?;
        let message = a
            .worker
            .as_ref()
            .map(|g| g.message.to_string().into_bytes());
        let cache = self.compile_cache(&module_path)?;
        let dirs = BindingDirs {
            cache: Some(cache.clone()),
            inputs: (root_of(&read, INPUTS) && inputs.is_dir()).then_some(inputs),
            outputs: outputs_granted.then_some(outputs),
            max_write: limits.max_write_bytes,
            http: network.uses_egress_proxy(),
            kv,
            queues: grants.queues.clone(),
            message,
            effects: a.worker.is_some(),
        };
        let mut argv = a.argv.clone();
        argv[0] = module_path.display().to_string();
        let mut spec = SandboxSpec::new(sandbox_id, argv);
        spec.stdin_null = true;
        spec.mode = if dirs.outputs.is_some() || dirs.effects {
            moat_core::SandboxMode::WorkspaceWrite
        } else {
            moat_core::SandboxMode::ReadOnly
        };
        spec.network = network;
        spec.without_cgroup =
            manifest.cgroup_limits == moat_core::manifest::CgroupLimits::Deployment;
        spec.limits = limits;
        spec.id_range = self.config.id_range;
        spec.launch_policy = self.config.launch_policy.clone();
        let reader = crate::worker::prepare(&mut spec, &dirs)
            .map_err(|e| refuse(DenialReason::InvalidArgs, e.to_string()))?;
        Ok((Plan { spec }, reader, cache))
    }

    /// The compile cache of the component at `module`, under the shell's
    /// state (a runner's is shared by its runs): `worker-cache/SHA256`,
    /// writable by the invocation that fills it, then read-only. A
    /// component's compiled code is only ever written by an invocation of
    /// that same component, in its own sandbox: a runtime subverted by its
    /// component could spoil only that component's later runs, never
    /// another's.
    fn compile_cache(&self, module: &Path) -> Result<CompileCache, Refusal> {
        let failed = |e: std::io::Error| {
            refuse(
                DenialReason::Unsupported,
                format!("the worker's compile cache: {e}"),
            )
        };
        let hash = sha256_of_file(module).map_err(failed)?;
        let dir = self.config.state.join(CACHE_DIR).join(hash);
        if dir.join(FILLED).is_file() {
            return Ok(CompileCache {
                dir,
                writable: false,
            });
        }
        // Read-only, it is not idmapped: the sandbox's user reads it as
        // anyone (the shell's state directory above it is closed).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(failed)?;
        Ok(CompileCache {
            dir,
            writable: true,
        })
    }
}

/// Where the shell keeps compiled components, and the mark of one filled.
const CACHE_DIR: &str = "worker-cache";
const FILLED: &str = ".filled";

/// Marks a cache directory filled once its invocation wrote into it: later
/// invocations get it read-only.
pub(super) fn mark_filled(dir: &Path) {
    let filled = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().any(|e| e.file_name() != FILLED))
        .unwrap_or(false);
    if filled {
        let _ = std::fs::write(dir.join(FILLED), b"");
    }
}

fn sha256_of_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = moat_core::hash::Sha256Stream::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hasher.finish())
}

/// The kv snapshot a delivery granted, as the runtime reads it; `None`
/// when it granted no namespace.
fn worker_kv(grants: &WorkerGrants) -> Result<Option<Vec<u8>>, Refusal> {
    if grants.kv.is_empty() {
        return Ok(None);
    }
    let mut namespaces = std::collections::BTreeMap::new();
    for (namespace, entries) in &grants.kv {
        let mut values = std::collections::BTreeMap::new();
        for (key, value) in entries {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(value)
                .map_err(|e| {
                    refuse(
                        DenialReason::InvalidArgs,
                        format!("worker.kv.{namespace}.{key}: not base64: {e}"),
                    )
                })?;
            values.insert(key.clone(), moat_worker_api::Value(bytes));
        }
        namespaces.insert(namespace.clone(), values);
    }
    let snapshot = moat_worker_api::KvSnapshot { namespaces };
    serde_json::to_vec(&snapshot)
        .map(Some)
        .map_err(|e| refuse(DenialReason::InvalidArgs, e.to_string()))
}
