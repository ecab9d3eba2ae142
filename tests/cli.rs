//! `moat exec` as a command: exit statuses, errors, modes, the unprivileged
//! path, and the report on interruption.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};

use common::*;

#[test]
fn exit_status_follows_the_program() {
    assert_eq!(exec(&[], &["/bin/sh", "-c", "exit 3"]).code, 3);
    let killed = exec(&[], &["/bin/sh", "-c", "kill -TERM $$"]);
    assert_eq!(killed.code, 128 + 15);
    assert_eq!(killed.report["exit"]["signal"], 15);
}

#[test]
fn missing_and_unexecutable_programs_get_127_and_126() {
    let missing = exec(&[], &["no-such-program-here"]);
    assert_eq!(missing.code, 127);
    assert!(
        missing.stderr.contains("No such file"),
        "{}",
        missing.stderr
    );
    let not_exec = exec(&[], &["/etc/passwd"]);
    assert_eq!(not_exec.code, 126);
    // Lookup happens in the sandbox's PATH, inside the sandbox.
    assert_eq!(exec(&[], &["true"]).code, 0);
}

#[test]
fn bad_flags_and_paths_exit_2_with_a_message() {
    for args in [
        vec!["exec", "--memory", "lots", "--", "/bin/true"],
        vec!["exec", "--mode", "artifact-write", "--", "/bin/true"],
        vec![
            "exec",
            "--network",
            "allowlist",
            "--allow-domain",
            "*",
            "--",
            "/bin/true",
        ],
        vec![
            "exec",
            "--network",
            "allowlist",
            "--allow-domain",
            "*.com",
            "--",
            "/bin/true",
        ],
        vec![
            "exec",
            "--network",
            "allowlist",
            "--allow-domain",
            "10.0.0.1",
            "--",
            "/bin/true",
        ],
        vec!["exec", "--allow-domain", "example.org", "--", "/bin/true"],
        vec![
            "exec",
            "--network",
            "allowlist",
            "--resolve",
            "x.test",
            "--",
            "/bin/true",
        ],
        vec![
            "exec",
            "--workspace",
            "/nonexistent/moat-test",
            "--",
            "/bin/true",
        ],
        vec!["exec", "--rw", "/tmp:/usr/evil", "--", "/bin/true"],
        vec!["exec", "--rw", "/:/host", "--", "/bin/true"],
        vec!["exec", "--ro", "/proc/self/root:/host", "--", "/bin/true"],
        vec![
            "exec",
            "--env",
            "MOAT_TEST_UNSET_VARIABLE",
            "--",
            "/bin/true",
        ],
        vec!["exec", "--timeout", "soon", "--", "/bin/true"],
        vec!["exec", "--timeout", "999999999999s", "--", "/bin/true"],
        vec!["exec"],
    ] {
        let output = Command::new(MOAT)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.lines().count() >= 1);
    }
}

#[test]
fn danger_full_access_warns_and_emits_an_event_every_time() {
    for _ in 0..2 {
        let run = exec(&["--mode", "danger-full-access"], &["/bin/true"]);
        assert_eq!(run.code, 0);
        assert!(
            run.stderr.contains("WARNING: danger-full-access"),
            "{}",
            run.stderr
        );
        assert_eq!(run.events_of("sandbox.danger_full_access").len(), 1);
        assert_ne!(run.report["enforcement"]["hostUid"], 0);
    }
}

#[test]
fn json_mode_prints_one_document_with_output_and_report() {
    let output = Command::new(MOAT)
        .args([
            "exec",
            "--json",
            "--",
            "/bin/sh",
            "-c",
            "echo out; echo err >&2; exit 4",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(4));
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(doc["stdout"], "out\n");
    assert_eq!(doc["stderr"], "err\n");
    assert_eq!(doc["exitCode"], 4);
    assert_eq!(
        doc["report"]["enforcement"]["seccomp"]["status"],
        "enforced"
    );
}

#[test]
fn every_run_emits_started_and_finished_events() {
    let run = exec(&[], &["/bin/true"]);
    let types: Vec<&str> = run
        .events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, vec!["sandbox.exec.started", "sandbox.exec.finished"]);
    let run_id = &run.events[0]["runId"];
    assert!(run.events.iter().all(|e| &e["runId"] == run_id));
    assert_eq!(run.events[1]["data"]["exitCode"], 0);
}

#[test]
fn unprivileged_user_without_cgroups_is_refused_unless_degrading_is_allowed() {
    let bin = unprivileged_copy();
    let moat = bin.path().join("moat");
    let moat = moat.to_str().unwrap();
    let refused = exec_as(moat, &[], &["/bin/true"], Some(65534));
    assert_eq!(refused.code, 125, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("sandbox setup failed: cgroup"),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("--allow-degraded"));
    assert!(refused.stderr.contains("--without-cgroup-limits"));
    let denied = refused.events_of("sandbox.exec.denied");
    assert_eq!(denied.len(), 1);
    assert!(
        denied[0]["data"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("cgroup")
    );

    let probe_dir = format!("{}:/probe", bin.path().display());
    let degraded = exec_as(
        moat,
        &["--allow-degraded", "--ro", &probe_dir],
        &["/probe/probe", "host-uid"],
        Some(65534),
    );
    assert_eq!(degraded.code, 0, "{}", degraded.stderr);
    assert_eq!(degraded.stdout.trim(), "65534");
    assert_eq!(degraded.layer("cgroup"), "not_enforced");
    for layer in [
        "namespaces",
        "filesystem",
        "landlock",
        "seccomp",
        "privileges",
        "rlimits",
    ] {
        assert_eq!(degraded.layer(layer), "enforced", "{layer}");
    }
    let ptrace = exec_as(
        moat,
        &["--allow-degraded", "--ro", &probe_dir],
        &["/probe/probe", "ptrace"],
        Some(65534),
    );
    assert_eq!(ptrace.stdout.trim(), "errno=1");
    ptrace.assert_syscall_denied_event("ptrace");
}

#[test]
fn unprivileged_user_can_use_its_own_workspace() {
    let bin = unprivileged_copy();
    let ws = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(ws.path(), Some(65534), Some(65534)).unwrap();
    let moat = bin.path().join("moat");
    let run = exec_as(
        moat.to_str().unwrap(),
        &["--allow-degraded", "--workspace", path_str(ws.path())],
        &["/bin/sh", "-c", "echo made > /workspace/out; id -u"],
        Some(65534),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout.trim(), "65534");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("out")).unwrap(),
        "made\n"
    );
}

#[test]
fn root_launch_writes_outputs_owned_by_the_roots_owner() {
    use std::os::unix::fs::MetadataExt;
    let out = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(out.path(), Some(4242), Some(4343)).unwrap();
    let run = exec(
        &["--output", path_str(out.path())],
        &["/bin/sh", "-c", "echo r > /workspace/output/result; id -u"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout.trim(),
        "4242",
        "inside, the program acts as the owner"
    );
    let meta = std::fs::metadata(out.path().join("result")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (4242, 4343));
    // On the host it is an id of its own, never the owner's, root or nobody.
    let host = run.report["enforcement"]["hostUid"].as_u64().unwrap();
    assert!(![0, 4242, 65534].contains(&host), "{}", run.report);
    assert_eq!(
        run.report["enforcement"]["hostIdentity"]["status"],
        "enforced"
    );
}

#[test]
fn an_interrupted_launcher_stops_the_run_and_still_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let marker = format!(
        "8{}",
        &token()[..7].replace(|c: char| !c.is_ascii_digit(), "3")
    );
    let mut child = Command::new(MOAT)
        .arg("exec")
        .arg("--report")
        .arg(&report)
        .args(["--", "/bin/sleep", &marker])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..300 {
        if host_processes_with(&format!("/bin/sleep {marker}")).len() >= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: signalling the child this test started, by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["interrupted"], true);
    assert!(host_processes_with(&format!("sleep {marker}")).is_empty());
}
