//! Any bytes, as one line, through envelope parsing and the whole
//! dispatcher (manifest checks, path resolution, artifact store, ledger).
//! Must never panic, and must always answer with a result.
#![no_main]

use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use moat_core::limits::Limits;
use moat_core::manifest::{FilesystemPolicy, NetworkPolicy};
use moat_core::sign::PrivateKey;
use moat_core::{Manifest, NetworkMode, OpKind, SandboxMode};
use moat_shell::{Line, Shell, ShellConfig};

fn shell() -> &'static Mutex<Shell> {
    static SHELL: OnceLock<Mutex<Shell>> = OnceLock::new();
    SHELL.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("moat-fuzz-{}", std::process::id()));
        let ws = dir.join("ws");
        std::fs::create_dir_all(ws.join("input")).expect("workspace");
        std::fs::write(ws.join("input/data.txt"), "fuzz\n").expect("input");
        let key = PrivateKey::from_seed([9; 32]);
        let manifest = Manifest {
            runner_version: "fuzz".into(),
            environment: "fuzz".into(),
            policy_hash: "0".repeat(64),
            // No exec_argv: the fuzzer's own threads would (rightly) make the
            // launcher refuse, and sandboxes are tested elsewhere.
            allowed_ops: vec![
                OpKind::ArtifactRead,
                OpKind::ArtifactWrite,
                OpKind::ArtifactList,
                OpKind::HttpRequest,
                OpKind::BrowserStep,
            ],
            allowed_tools: vec![],
            allowed_executables: vec![],
            sandbox_modes: vec![SandboxMode::WorkspaceWrite],
            // Network off: http_request is refused before any proxy is started.
            network_policy: NetworkPolicy { mode: NetworkMode::Off, ..NetworkPolicy::default() },
            filesystem: FilesystemPolicy { read_roots: vec![".".into()], write_roots: vec!["output".into()], artifact_only: Vec::new(), persistent_roots: Vec::new() },
            env_passthrough: vec![],
            limits: Limits { file_size_bytes: 1 << 16, ..Limits::default() },
            exports: None,
            cgroup_limits: Default::default(),
            workload_classes: Vec::new(),
            allow_emulation: false,
            created_at: "2026-01-01T00:00:00Z".into(),
            expires_at: "2099-01-01T00:00:00Z".into(),
            control_plane_public_key: key.public().to_base64(),
        };
        Mutex::new(
            Shell::open(ShellConfig {
                manifest,
                manifest_hash: "fuzz".into(),
                workspace: ws,
                state: dir.join("state"),
                mode: SandboxMode::WorkspaceWrite,
                session_id: "fuzz".into(),
                egress_hosts: Default::default(),
                egress_roots_pem: None,
                require_capabilities: false,
                id_range: None,
                launch_policy: Default::default(),
                vm: None,
                expose_dir: None,
            })
            .expect("shell"),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let mut shell = shell().lock().expect("lock");
    let result = shell.handle(Line::Text(data.to_vec()));
    // Every line is answered, and a denial always names its reason.
    if result.status == moat_core::OpStatus::Denied {
        assert!(result.reason.is_some());
    }
});
