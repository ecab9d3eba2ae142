#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Destroy: once a runner stops serving a run it kills what is left, removes
//! the workspace and the sandboxes' cgroups, checks that nothing of the run
//! is left on its host, and reports `run.destroyed`; a runner killed with
//! SIGKILL leaves the run's shell and sandbox running and its workspace on
//! disk, and the next start's janitor tears them down (`runner.janitor`).
//! Every claim is checked on the host side too.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::control::*;
use common::{host_processes_with, path_str};
use serde_json::{Value, json};

/// `dir/moat/<name>` beside this process's cgroup, in every hierarchy: where
/// a runner started by this test puts its sandboxes' cgroups.
fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut dirs = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split(' ');
        let fstype = right.next().unwrap_or_default();
        let options = right.nth(1).unwrap_or_default();
        if !fstype.starts_with("cgroup") {
            continue;
        }
        let point = left.split(' ').nth(4).unwrap();
        let wanted = |controllers: &str| {
            if fstype == "cgroup2" {
                controllers.is_empty()
            } else {
                controllers
                    .split(',')
                    .any(|c| options.split(',').any(|o| o == c))
            }
        };
        if let Some(path) = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _ = parts.next();
            let controllers = parts.next()?;
            let path = parts.next()?;
            wanted(controllers).then_some(path)
        }) {
            dirs.push(
                Path::new(point)
                    .join(path.trim_start_matches('/'))
                    .join("moat")
                    .join(name),
            );
        }
    }
    dirs
}

fn sandbox_ids(events: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = events
        .iter()
        .filter_map(|e| e["data"]["sandboxRunId"].as_str().map(str::to_owned))
        .collect();
    ids.dedup();
    ids
}

fn checks_of(event: &Value) -> Vec<(String, bool)> {
    event["data"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["check"].as_str().unwrap().to_owned(), c["ok"] == true))
        .collect()
}

#[test]
fn a_finished_run_leaves_nothing_on_its_runner_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (setup, db, serve, acme) = sqlite_plane(dir.path());
    let runner = Runner::start(&serve, &setup, &acme, "runner-td");
    let run = "run-td";
    create_run(&serve, &acme, run);
    python_op(
        &serve,
        &acme,
        run,
        "1",
        "open('output/made.txt', 'w').write('x'); import os; os.makedirs('output/d', mode=0o500)",
    );
    let workspace = runner.state.join("runs").join(run);
    assert!(workspace.join("output/made.txt").exists());
    finish_run(&serve, &acme, run);

    let destroyed = wait_run_event(&serve, &acme, run, "run.destroyed");
    assert_eq!(destroyed["data"]["ok"], true, "{destroyed}");
    let checks = checks_of(&destroyed);
    assert_eq!(
        checks,
        [
            ("processes".to_owned(), true),
            ("files".to_owned(), true),
            ("mounts".to_owned(), true),
            ("cgroups".to_owned(), true)
        ],
        "{destroyed}"
    );
    // The host side says the same.
    assert!(!workspace.exists(), "{} left behind", workspace.display());
    assert!(host_processes_with(path_str(&workspace)).is_empty());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(path_str(&workspace)));
    let ids = sandbox_ids(&run_events(&serve, &acme, run));
    assert!(!ids.is_empty());
    for id in &ids {
        for cgroup in cgroup_dirs(id) {
            assert!(!cgroup.exists(), "{} left behind", cgroup.display());
        }
    }
    // What the run used, summed when it ended, and the audit says both.
    let events = run_events(&serve, &acme, run);
    let usage = events.iter().find(|e| e["type"] == "run.usage").unwrap();
    assert_eq!(usage["data"]["ops"], json!({"succeeded": 1}), "{usage}");
    assert_eq!(usage["data"]["programs"], 1, "{usage}");
    assert!(usage["data"]["cpuMs"].as_u64().unwrap() > 0, "{usage}");
    assert!(
        usage["data"]["peakMemoryBytes"].as_u64().unwrap() > 1 << 20,
        "{usage}"
    );
    let audited = std::process::Command::new(common::MOAT)
        .args(["audit", run, "--db", &db])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&audited.stdout);
    assert!(
        text.contains("Usage: ops 1 succeeded; 1 program(s), CPU "),
        "{text}"
    );
    assert!(
        text.contains("nothing left (processes, files, mounts, cgroups)"),
        "{text}"
    );

    // A run that ends before its first operation started nothing here: its
    // teardown says so rather than look through every process on the host.
    let empty = "run-td-empty";
    create_run(&serve, &acme, empty);
    finish_run(&serve, &acme, empty);
    let destroyed = wait_run_event(&serve, &acme, empty, "run.destroyed");
    assert_eq!(destroyed["data"]["ok"], true, "{destroyed}");
    assert_eq!(
        destroyed["data"]["checks"][0],
        json!({"check": "processes", "ok": true,
               "detail": "no process of the run was started on this host"}),
        "{destroyed}"
    );
    assert!(!runner.state.join("runs").join(empty).exists());
    // Torn down before its finish, the teardown went with it: recorded
    // last, after the run's end.
    let types: Vec<String> = run_events(&serve, &acme, empty)
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        types.ends_with(&[
            "run.usage".into(),
            "run.finished".into(),
            "run.destroyed".into()
        ]),
        "{types:?}"
    );
    assert_ledger_intact(&serve);
    drop(runner);
}

#[test]
fn the_janitor_tears_down_what_a_killed_runner_left() {
    let dir = tempfile::tempdir().unwrap();
    let (setup, db, serve, acme) = sqlite_plane(dir.path());
    let mut first = Runner::start(&serve, &setup, &acme, "runner-j");
    let run = "run-j";
    create_run(&serve, &acme, run);
    // An operation that runs long; its result is never awaited.
    let marker = format!("janitor{}", common::token());
    start_long_op(&serve, &acme, run, &marker);
    let workspace = first.state.join("runs").join(run);
    // kill -9 of the runner alone: its shell and the sandbox run on.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !host_processes_with(path_str(&workspace)).is_empty(),
        "the shell died with the runner: nothing for the janitor to do"
    );
    assert!(workspace.exists());

    let second = Runner::start(&serve, &setup, &acme, "runner-j");
    assert_eq!(second.state, first.state);
    let store = moat_store::Store::open(&db).unwrap();
    let found = wait_event(&store, moat_core::EventType::RunnerJanitor);
    let janitor = serde_json::to_value(&found[0].event).unwrap();
    assert_eq!(janitor["data"]["runs"], json!([run]), "{janitor}");
    assert_eq!(janitor["data"]["ok"], true, "{janitor}");
    let checks = janitor["data"]["checks"].as_array().unwrap();
    assert!(
        checks[0]["detail"].as_str().unwrap().starts_with("killed"),
        "{janitor}"
    );
    // The host side: the shell, the sandbox and the program are gone.
    assert!(host_processes_with(&marker).is_empty());
    // A third runner on the same state directory would tear down the
    // second's runs: it refuses to start.
    let (status, body) = call(
        "POST",
        &format!("{}/v1/bootstrap-tokens", serve.url),
        &acme,
        Some(json!({})),
    );
    assert_eq!(status, 201, "{body}");
    let token_file = setup.dir.join("third.token");
    std::fs::write(&token_file, body["token"].as_str().unwrap()).unwrap();
    let third = std::process::Command::new(&setup.runner)
        .args(["runner", "start", "--control-plane", &serve.url])
        .args(["--bootstrap-token-file", path_str(&token_file)])
        .args(["--state-dir", path_str(&second.state)])
        .output()
        .unwrap();
    assert_eq!(third.status.code(), Some(2));
    let said = String::from_utf8_lossy(&third.stderr);
    assert!(said.contains("another runner uses --state-dir"), "{said}");
    // The run itself is retried once its lease lapses, by the new runner,
    // from its inputs: what the janitor removed was the old attempt's.
    drop(second);
    drop(first);
    assert!(host_processes_with(&marker).is_empty());
}

/// A control plane and a runner serving `run`, whose operation runs a
/// program that sleeps: the server, acme's token, the runner, and the
/// marker on the program's command line.
fn running_long_op(dir: &Path, run: &str) -> (Serve, String, Runner, String) {
    let (setup, _db, serve, acme) = sqlite_plane(dir);
    let runner = Runner::start(&serve, &setup, &acme, &format!("runner-{run}"));
    create_run(&serve, &acme, run);
    let marker = format!("long{}", common::token());
    start_long_op(&serve, &acme, run, &marker);
    (serve, acme, runner, marker)
}

/// Starts a long operation on `run` (a sleeping program marked `marker`)
/// and waits until its program runs.
fn start_long_op(serve: &Serve, token: &str, run: &str, marker: &str) {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs/{run}/ops", serve.url),
        token,
        Some(envelope(
            "1",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c",
                format!("import time; time.sleep(120) # {marker}")]}),
        )),
    );
    assert!((200..=202).contains(&status), "{status} {body}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while host_processes_with(marker).is_empty() {
        assert!(Instant::now() < deadline, "the operation never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for the program marked `marker` to be gone; how long it took.
/// The runner heartbeats every second while an operation runs and stops
/// the shell at the first refusal, so this is about a second; the bound
/// leaves room for a loaded two-core CI machine.
fn gone_within(marker: &str) -> Duration {
    let started = Instant::now();
    while !host_processes_with(marker).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the sandbox outlived the run"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

#[test]
fn cancel_mid_operation_stops_the_sandbox_and_the_run_is_torn_down() {
    let dir = tempfile::tempdir().unwrap();
    let run = "run-c";
    let (serve, acme, runner, marker) = running_long_op(dir.path(), run);

    // `moat runs cancel`, as printed in its help.
    let cancelled = std::process::Command::new(common::MOAT)
        .args(["runs", "cancel", run, "--control-plane", &serve.url])
        .env("MOAT_TOKEN", &acme)
        .output()
        .unwrap();
    assert!(
        cancelled.status.success(),
        "{}",
        String::from_utf8_lossy(&cancelled.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&cancelled.stdout).trim(),
        format!("cancelled {run}: cancelled")
    );
    let took = gone_within(&marker);
    eprintln!("cancel: the sandbox was gone after {took:?}");
    assert_eq!(run_state(&serve, &acme, run), "cancelled");
    let (_, op) = call(
        "GET",
        &format!("{}/v1/runs/{run}/ops/1", serve.url),
        &acme,
        None,
    );
    assert_eq!(op["state"], "failed", "{op}");
    assert_eq!(op["result"]["error"]["reason"], "run_ended", "{op}");
    let destroyed = wait_run_event(&serve, &acme, run, "run.destroyed");
    assert_eq!(destroyed["data"]["ok"], true, "{destroyed}");
    assert!(!runner.state.join("runs").join(run).exists());
    let events = run_events(&serve, &acme, run);
    let finished = events.iter().find(|e| e["type"] == "run.finished").unwrap();
    assert_eq!(finished["data"]["state"], "cancelled", "{finished}");

    // A run that ended cannot be cancelled again: 409, and the CLI says so.
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs/{run}/cancel", serve.url),
        &acme,
        None,
    );
    assert_eq!(
        (status, body["error"]["reason"].as_str()),
        (409, Some("not_cancellable")),
        "{body}"
    );
    assert_ledger_intact(&serve);
}

#[test]
fn revoking_the_manifest_stops_a_running_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let run = "run-r";
    let (serve, acme, runner, marker) = running_long_op(dir.path(), run);
    let (_, view) = call("GET", &format!("{}/v1/runs/{run}", serve.url), &acme, None);
    let hash = view["manifestHash"].as_str().unwrap().to_owned();
    let (status, body) = call(
        "POST",
        &format!("{}/v1/manifests/{hash}/revoke", serve.url),
        &acme,
        None,
    );
    assert_eq!(status, 200, "{body}");
    let took = gone_within(&marker);
    eprintln!("revocation: the sandbox was gone after {took:?}");
    // The runner tore the run down on its host (its report is refused:
    // it no longer stands).
    let workspace = runner.state.join("runs").join(run);
    let deadline = Instant::now() + Duration::from_secs(10);
    while workspace.exists() {
        assert!(Instant::now() < deadline, "{} left", workspace.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(host_processes_with(path_str(&workspace)).is_empty());
}
