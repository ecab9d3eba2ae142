#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Blocked-access evidence: what the layers refuse inside the sandbox is
//! reported, with the path, address or syscall, in the report's
//! `violations`, as `sandbox.violation` / `sandbox.syscall.denied` events,
//! and in the op result's `blocked` lines. A root launcher reads Landlock's
//! refusals from the kernel audit log; where it cannot (unprivileged, or the
//! kernel's audit off) the report says the evidence layer is not enforced.
//!
//! The kernel's audit setting is host-wide: the tests here take turns, and
//! each puts the setting back as it found it.

mod common;

use common::{AuditSetting, MOAT, Run, exec, exec_as};
use serde_json::Value;

const NOBODY: u32 = 65534;

/// The script of the issue: a host credential path, `mount`, `ptrace`.
const ATTEMPTS: &str = "cat /root/.aws/credentials; \
    mount -t tmpfs none /tmp; \
    python3 -c 'import ctypes; print(\"ptrace\", ctypes.CDLL(None).ptrace(0, 0, 0, 0))'; \
    echo done";

fn violation<'a>(run: &'a Run, layer: &str, access: &str, object: &str) -> &'a Value {
    run.report["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["layer"] == layer && v["access"] == access && v["object"] == object)
        .unwrap_or_else(|| panic!("no {layer} {access} {object} in {}", run.report))
}

fn check_events(run: &Run) {
    for event in &run.events {
        common::check_event(event, "moat exec");
    }
}

#[test]
fn a_root_launcher_reports_the_credential_read_mount_and_ptrace() {
    let host_decoy = std::path::Path::new("/root/.aws/credentials");
    let existed = host_decoy.exists();
    let _audit = AuditSetting::set(true);
    let run = exec(&[], &["sh", "-c", ATTEMPTS]);
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    // The program saw plain refusals.
    assert!(run.stderr.contains("Permission denied"), "{}", run.stderr);
    assert!(run.stdout.contains("ptrace -1"), "{}", run.stdout);
    assert_eq!(run.layer("evidence"), "enforced", "{}", run.report);
    // All three, in the report.
    let creds = violation(&run, "landlock", "fs.read_file", "/root/.aws/credentials");
    assert_eq!(creds["count"], 1, "{creds}");
    violation(&run, "seccomp", "syscall", "mount");
    violation(&run, "seccomp", "syscall", "ptrace");
    // And as events.
    check_events(&run);
    let refused = run.events_of("sandbox.violation");
    assert_eq!(refused.len(), 1, "{:#?}", run.events);
    assert_eq!(
        refused[0]["data"]["message"],
        "tried to read /root/.aws/credentials: denied (landlock fs.read_file)"
    );
    assert_eq!(refused[0]["data"]["errno"], "EACCES");
    run.assert_syscall_denied_event("mount");
    run.assert_syscall_denied_event("ptrace");
    // The decoy was the sandbox's own: nothing appeared on the host.
    assert_eq!(host_decoy.exists(), existed);
}

#[test]
fn landlock_network_and_signal_refusals_name_their_target() {
    let _audit = AuditSetting::set(true);
    let script = "import os, signal, socket\n\
        s = socket.socket()\n\
        try:\n    s.bind(('127.0.0.1', 8081))\nexcept OSError as e:\n    print('bind', e.errno)\n\
        try:\n    os.kill(1, signal.SIGTERM)\nexcept OSError as e:\n    print('kill', e.errno)\n\
        for i in range(3):\n    try:\n        open('/root/.ssh/id_ed25519').read()\n    except OSError as e:\n        print('read', e.errno)\n";
    let run = exec(&["--network", "proxy-only"], &["python3", "-c", script]);
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    assert!(run.stdout.contains("bind 13"), "{}", run.stdout);
    assert!(run.stdout.contains("kill 1"), "{}", run.stdout);
    violation(&run, "landlock", "net.bind_tcp", "127.0.0.1:8081");
    let read = violation(&run, "landlock", "fs.read_file", "/root/.ssh/id_ed25519");
    assert_eq!(read["count"], 3, "{read}");
    let signal = run.report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["access"] == "scope.signal")
        .unwrap_or_else(|| panic!("no signal refusal: {}", run.report));
    assert!(
        signal["object"].as_str().unwrap().starts_with("process "),
        "{signal}"
    );
    check_events(&run);
    // One event per access and object, however often it was tried.
    assert_eq!(
        run.events_of("sandbox.violation").len(),
        3,
        "{:#?}",
        run.events
    );
}

#[test]
fn with_the_kernels_audit_off_the_report_says_the_evidence_layer_is_not_enforced() {
    let _audit = AuditSetting::set(false);
    let run = exec(&[], &["sh", "-c", ATTEMPTS]);
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    assert_eq!(run.layer("evidence"), "not_enforced", "{}", run.report);
    let detail = run.report["enforcement"]["evidence"]["detail"]
        .as_str()
        .unwrap();
    assert!(detail.contains("audit is off"), "{detail}");
    // Seccomp's refusals are still observed. No decoys without the
    // evidence layer: the credential path simply is not there.
    violation(&run, "seccomp", "syscall", "ptrace");
    assert!(
        run.stderr
            .contains("/root/.aws/credentials: No such file or directory"),
        "{}",
        run.stderr
    );
    assert!(run.events_of("sandbox.violation").is_empty());
}

#[test]
fn an_unprivileged_launcher_says_the_evidence_layer_is_not_enforced() {
    let _audit = AuditSetting::set(true);
    let run = exec_as(
        MOAT,
        &["--without-cgroup-limits"],
        &["sh", "-c", ATTEMPTS],
        Some(NOBODY),
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    assert_eq!(run.layer("evidence"), "not_enforced", "{}", run.report);
    let detail = run.report["enforcement"]["evidence"]["detail"]
        .as_str()
        .unwrap();
    assert!(detail.contains("CAP_AUDIT_READ"), "{detail}");
    violation(&run, "seccomp", "syscall", "ptrace");
    violation(&run, "seccomp", "syscall", "mount");
    assert!(
        run.stderr
            .contains("/root/.aws/credentials: No such file or directory"),
        "{}",
        run.stderr
    );
    check_events(&run);
}
