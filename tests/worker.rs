#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The `worker` class through `moat exec --class worker`: a Python
//! component (built here from tests/worker/guest.py with componentize-py)
//! run by wasmtime inside a namespace sandbox. Its file opens are refused
//! and recorded, a loop ends by the deadline with `process.timeout`, and
//! memory past the limit fails cleanly.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use common::{Canary, Run, exec, host_processes_with};

/// The guest, built once per test binary into target/ (it depends only on
/// its source and the WIT in crates/moat-worker/wit).
fn guest() -> &'static PathBuf {
    static GUEST: OnceLock<PathBuf> = OnceLock::new();
    GUEST.get_or_init(|| {
        let tool = std::env::var("MOAT_TEST_COMPONENTIZE_PY").expect(
            "MOAT_TEST_COMPONENTIZE_PY is not set: run the suite with `bash tests/suite.sh`, \
             which installs componentize-py into target/worker-venv",
        );
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("worker-guest");
        std::fs::create_dir_all(&out_dir).expect("guest dir");
        std::fs::copy(root.join("tests/worker/guest.py"), out_dir.join("guest.py"))
            .expect("guest source");
        let wasm = out_dir.join("guest.wasm");
        let output = Command::new(&tool)
            .current_dir(&out_dir)
            .arg("-d")
            .arg(root.join("crates/moat-worker/wit"))
            .args(["-w", "moat:worker/command", "componentize", "guest", "-o"])
            .arg(&wasm)
            .output()
            .expect("running componentize-py");
        assert!(
            output.status.success(),
            "componentize-py failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        wasm
    })
}

/// One worker at a time: a test checks that no runtime is left once its
/// run ended, and two cold compiles on two cores only slow each other.
static ONE_WORKER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn worker(args: &[&str], guest_args: &[&str]) -> Run {
    let module = guest().display().to_string();
    let _one = ONE_WORKER.lock().unwrap_or_else(|e| e.into_inner());
    let mut all = vec!["--class", "worker"];
    all.extend_from_slice(args);
    let mut program = vec![module.as_str()];
    program.extend_from_slice(guest_args);
    let run = exec(&all, &program);
    assert!(
        host_processes_with("/moat/moat-worker").is_empty(),
        "a worker runtime was left running"
    );
    run
}

#[test]
fn a_worker_runs_a_python_component_with_its_arguments_in_the_worker_class() {
    let run = worker(&[], &["greets", "you"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("hello from a worker, greets you"),
        "{}",
        run.stdout
    );
    assert_eq!(run.report["class"], "worker");
    let worker = &run.report["worker"];
    assert_eq!(worker["ended"], "exited");
    assert_eq!(worker["moduleSha256"].as_str().map(str::len), Some(64));
    let started = run.events_of("sandbox.exec.started");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["data"]["class"], "worker");
    // The runtime itself ran in a namespace sandbox, every layer applied.
    common::assert_all_layers_enforced(&run);
}

#[test]
fn a_worker_that_opens_a_host_file_is_refused_and_the_denial_is_recorded() {
    let canary = Canary::plant();
    let path = canary.path.display().to_string();
    let run = worker(&[], &["open", &path]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("refused:"), "{}", run.stdout);
    assert!(!run.stdout.contains(&canary.content), "{}", run.stdout);
    let denied = run
        .events_of("sandbox.violation")
        .into_iter()
        .find(|e| e["data"]["object"] == path.as_str())
        .unwrap_or_else(|| panic!("no denial of {path}: {:?}", run.events));
    assert_eq!(denied["data"]["layer"], "wasi");
    assert_eq!(denied["data"]["access"], "fs.open");
    let violations = run.report["violations"].as_array().expect("violations");
    assert!(violations.iter().any(|v| v["object"] == path.as_str()));
    canary.assert_intact();
}

#[test]
fn a_worker_in_an_endless_loop_ends_by_its_deadline_with_process_timeout() {
    let run = worker(&["--timeout", "2s"], &["loop"]);
    assert_eq!(run.code, 124, "{}", run.stderr);
    assert_eq!(run.report["timedOut"], true);
    assert_eq!(run.report["worker"]["ended"], "timedOut");
    let timeout = run.events_of("process.timeout");
    assert_eq!(timeout.len(), 1, "{:?}", run.events);
    assert_eq!(timeout[0]["data"]["timeoutMs"], 2000);
    assert_eq!(timeout[0]["data"]["killed"], "worker invocation");
    assert!(run.stderr.contains("deadline"), "{}", run.stderr);
}

#[test]
fn a_worker_allocating_past_its_memory_limit_fails_cleanly() {
    let run = worker(&["--memory", "64M"], &["memory"]);
    assert_eq!(run.code, 137, "{}", run.stderr);
    let worker = &run.report["worker"];
    assert_eq!(worker["ended"], "memoryExceeded");
    assert_eq!(worker["memoryLimitBytes"], 64 << 20);
    let peak = worker["peakMemoryBytes"].as_u64().expect("peak");
    assert!(peak <= 64 << 20, "{peak}");
    assert!(run.stderr.contains("memory limit"), "{}", run.stderr);
    // The limit is the guest's: the runtime and its sandbox were fine.
    assert_eq!(run.report["oomKilled"], false);
}

#[test]
fn a_worker_refuses_flags_that_would_give_a_component_directories_or_network() {
    let module = guest().display().to_string();
    for extra in [
        vec!["--workspace", "/tmp"],
        vec!["--network", "allowlist"],
        vec!["--env", "HOME"],
    ] {
        let mut args = vec!["--class", "worker"];
        args.extend(extra.iter().copied());
        let run = exec(&args, &[module.as_str()]);
        assert_eq!(run.code, 2, "{extra:?}: {}", run.stderr);
        assert!(run.stderr.contains("--class worker"), "{}", run.stderr);
    }
    // A core module (not a component) is refused before anything starts.
    let dir = tempfile::tempdir().expect("tempdir");
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").expect("core module");
    let run = exec(&["--class", "worker"], &[core.to_str().expect("utf-8")]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("not a component"), "{}", run.stderr);
}
