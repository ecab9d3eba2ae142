//! Shell throughput and latency, each next to its own floor measured in the
//! same run: JSON-lines artifact_read (target ≥ 20,000 ops/s), artifact_write
//! with its event durable (target ≥ 80% of a plain write+fsync loop), and
//! exec_argv of /usr/bin/true (target ≤ 1.1x the bare launcher).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use moat_core::limits::Limits;
use moat_core::manifest::{AllowedExecutable, FilesystemPolicy, NetworkPolicy};
use moat_core::sign::PrivateKey;
use moat_core::{Manifest, NetworkMode, OpKind, SandboxMode};
use moat_shell::{Line, Shell, ShellConfig};

fn shell(dir: &std::path::Path) -> Shell {
    let ws = dir.join("ws");
    std::fs::create_dir_all(ws.join("input")).unwrap();
    std::fs::write(ws.join("input/4k.txt"), "x".repeat(4096)).unwrap();
    let key = PrivateKey::from_seed([3; 32]);
    let manifest = Manifest {
        runner_version: "bench".into(),
        environment: "bench".into(),
        policy_hash: "0".repeat(64),
        allowed_ops: OpKind::ALL.to_vec(),
        allowed_tools: vec![],
        allowed_executables: vec![AllowedExecutable {
            path: "/usr/bin/true".into(),
            sha256: None,
            origin: None,
        }],
        sandbox_modes: vec![SandboxMode::WorkspaceWrite],
        network_policy: NetworkPolicy {
            mode: NetworkMode::Off,
            allow_domains: vec![],
            ..NetworkPolicy::default()
        },
        filesystem: FilesystemPolicy {
            read_roots: vec![".".into()],
            write_roots: vec!["output".into()],
            artifact_only: Vec::new(),
            persistent_roots: Vec::new(),
        },
        env_passthrough: vec![],
        limits: Limits::default(),
        exports: None,
        cgroup_limits: Default::default(),
        workload_classes: Vec::new(),
        allow_emulation: false,
        created_at: "2026-01-01T00:00:00Z".into(),
        expires_at: "2099-01-01T00:00:00Z".into(),
        control_plane_public_key: key.public().to_base64(),
    };
    Shell::open(ShellConfig {
        manifest,
        manifest_hash: "bench".into(),
        workspace: ws,
        state: dir.join("state"),
        mode: SandboxMode::WorkspaceWrite,
        session_id: "bench".into(),
        egress_hosts: Default::default(),
        egress_roots_pem: None,
        require_capabilities: false,
        id_range: None,
        launch_policy: moat_sandbox::LaunchPolicy::default(),
        vm: None,
        expose_dir: None,
    })
    .unwrap()
}

fn envelope(id: usize, op: &str, args: serde_json::Value) -> String {
    serde_json::json!({"id": id.to_string(), "runId": "bench", "correlationId": "c", "op": op,
                       "args": args, "createdAt": "2026-11-29T12:00:00Z"})
    .to_string()
}

fn pipelined_reads(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut shell = shell(dir.path());
    const N: usize = 1000;
    let input: String = (0..N)
        .map(|i| {
            envelope(
                i,
                "artifact_read",
                serde_json::json!({"path": "input/4k.txt", "maxBytes": 4096}),
            ) + "\n"
        })
        .collect();
    let mut group = c.benchmark_group("json_lines");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function("artifact_read_4k_x1000", |b| {
        b.iter(|| shell.serve(input.as_bytes(), std::io::sink()).unwrap())
    });
    group.finish();
}

fn durable_writes(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut shell = shell(dir.path());
    const N: usize = 32;
    let mut round = 0usize;
    let mut group = c.benchmark_group("durable_write_4k");
    group.throughput(Throughput::Elements(N as u64));
    group.sample_size(20);
    group.bench_function("artifact_write_x32", |b| {
        b.iter(|| {
            round += 1;
            let input: String = (0..N)
                .map(|i| {
                    let mut content = format!("{round}:{i}:");
                    content.push_str(&"y".repeat(4096 - content.len()));
                    envelope(
                        i,
                        "artifact_write",
                        serde_json::json!({
                        "path": format!("output/w{i}.txt"), "content": content,
                        "maxBytes": 8192, "overwrite": true}),
                    ) + "\n"
                })
                .collect();
            shell.serve(input.as_bytes(), std::io::sink()).unwrap()
        })
    });
    let floor_dir = dir.path().join("floor");
    std::fs::create_dir_all(&floor_dir).unwrap();
    group.bench_function("fsync_floor_write_fsync_rename_x32", |b| {
        b.iter(|| {
            for i in 0..N {
                let tmp = floor_dir.join(format!("f{i}.tmp"));
                let mut file = std::fs::File::create(&tmp).unwrap();
                file.write_all(&[b'z'; 4096]).unwrap();
                file.sync_all().unwrap();
                std::fs::rename(&tmp, floor_dir.join(format!("f{i}"))).unwrap();
            }
        })
    });
    group.finish();
}

fn exec_true(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut shell = shell(dir.path());
    let line = envelope(
        0,
        "exec_argv",
        serde_json::json!({"argv": ["/usr/bin/true"]}),
    );
    let mut group = c.benchmark_group("exec_true");
    group.sample_size(50);
    group.bench_function("shell_exec_argv", |b| {
        b.iter(|| {
            let result = shell.handle(Line::Text(line.clone().into_bytes()));
            assert_eq!(result.status, moat_core::OpStatus::Ok, "{result:?}");
        })
    });
    const N: usize = 8;
    let lines: String = (0..N).map(|_| line.clone() + "\n").collect();
    group.bench_function("shell_exec_argv_pipelined_per_op", |b| {
        b.iter_custom(|iters| {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                shell.serve(lines.as_bytes(), std::io::sink()).unwrap();
            }
            start.elapsed() / N as u32
        })
    });
    let ws = dir.path().join("ws");
    group.bench_function("bare_launcher_same_mounts", |b| {
        b.iter(|| {
            let mut spec = moat_sandbox::SandboxSpec::new("bench", vec!["/usr/bin/true".into()]);
            spec.cwd = Some("/workspace".into());
            spec.mounts = vec![
                moat_sandbox::BindMount {
                    host: ws.clone(),
                    inside: "/workspace".into(),
                    writable: false,
                },
                moat_sandbox::BindMount {
                    host: ws.join("output"),
                    inside: "/workspace/output".into(),
                    writable: true,
                },
            ];
            let outcome =
                moat_sandbox::run(spec, moat_sandbox::OutputMode::Capture, &mut Vec::new())
                    .unwrap();
            assert_eq!(outcome.report.exit_code, 0);
        })
    });
    group.bench_function("bare_launcher_no_mounts", |b| {
        b.iter(|| {
            let spec = moat_sandbox::SandboxSpec::new("bench", vec!["/usr/bin/true".into()]);
            let outcome =
                moat_sandbox::run(spec, moat_sandbox::OutputMode::Capture, &mut Vec::new())
                    .unwrap();
            assert_eq!(outcome.report.exit_code, 0);
        })
    });
    group.finish();
}

criterion_group!(benches, pipelined_reads, durable_writes, exec_true);
criterion_main!(benches);
