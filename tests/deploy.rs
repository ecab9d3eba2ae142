#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The Kubernetes runner's seccomp profile, applied as a container runtime
//! applies it (libseccomp, through `tests/deploy/apply-seccomp.py`), with
//! `moat exec` beneath: every sandbox the runner builds starts under it, and
//! the calls it adds are allowed only with the flags the sandbox uses.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

const PROFILE: &str = "deploy/kubernetes/node/moat-runner-seccomp.json";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn profile() -> Value {
    let text = std::fs::read_to_string(root().join(PROFILE)).expect("the shipped profile");
    serde_json::from_str(&text).expect("the profile is JSON")
}

/// Debian's Python, with its libseccomp bindings (`python3-seccomp`,
/// installed by tests/suite.sh): not whatever `python3` is first on PATH.
const PYTHON: &str = "/usr/bin/python3";

/// A `moat` that runs under `profile`: a script in `dir` that applies it
/// and then executes the real binary with its arguments.
fn moat_under(dir: &Path, profile: &Value) -> PathBuf {
    let file = dir.join("profile.json");
    std::fs::write(&file, profile.to_string()).expect("writing the profile");
    let script = dir.join("moat-under-profile");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec {PYTHON} {} {} {} \"$@\"\n",
            root().join("tests/deploy/apply-seccomp.py").display(),
            file.display(),
            MOAT
        ),
    )
    .expect("writing the wrapper");
    make_executable(&script);
    make_world_accessible(dir);
    script
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// `program` under `profile`: its exit code and standard error.
fn under(profile: &Value, program: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("profile.json");
    std::fs::write(&file, profile.to_string()).expect("writing the profile");
    let output = Command::new(PYTHON)
        .arg(root().join("tests/deploy/apply-seccomp.py"))
        .arg(&file)
        .args(program)
        .output()
        .expect("running apply-seccomp.py");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The profile as shipped before `setns` was allowed.
fn without_setns(profile: &Value) -> Value {
    let mut old = profile.clone();
    let rules = old["syscalls"].as_array_mut().expect("syscalls");
    rules.retain(|rule| rule["names"] != serde_json::json!(["setns"]));
    old
}

/// Names the profile allows without any condition on the arguments.
fn allowed_outright(profile: &Value) -> Vec<String> {
    profile["syscalls"]
        .as_array()
        .expect("syscalls")
        .iter()
        .filter(|rule| rule["action"] == "SCMP_ACT_ALLOW" && rule.get("args").is_none())
        .flat_map(|rule| rule["names"].as_array().expect("names").clone())
        .filter_map(|name| name.as_str().map(str::to_owned))
        .collect()
}

#[test]
fn every_sandbox_starts_under_the_runner_profile_with_each_network_mode() {
    let profile = profile();
    let dir = tempfile::tempdir().expect("tempdir");
    let moat = moat_under(dir.path(), &profile);
    let moat = moat.to_str().expect("utf-8 path");
    for network in [
        &["--network", "off"][..],
        &[
            "--network",
            "allowlist",
            "--allow-domain",
            "example.invalid",
        ][..],
    ] {
        let run = exec_as(moat, network, &["/usr/bin/true"], None);
        assert_eq!(run.code, 0, "{network:?}: {}", run.stderr);
        assert_all_layers_enforced(&run);
        assert_eq!(
            run.events_of("sandbox.exec.denied").len(),
            0,
            "{:#?}",
            run.events
        );
    }
}

#[test]
fn the_profile_without_setns_breaks_every_sandbox_and_says_so() {
    let old = without_setns(&profile());
    let dir = tempfile::tempdir().expect("tempdir");
    let moat = moat_under(dir.path(), &old);
    let run = exec_as(
        moat.to_str().expect("utf-8 path"),
        &["--network", "off"],
        &["/usr/bin/true"],
        None,
    );
    assert_eq!(run.code, 125, "{}", run.stderr);
    let denied = run.events_of("sandbox.exec.denied");
    assert_eq!(denied.len(), 1, "{:#?}", run.events);
    let reason = denied[0]["data"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("entering the sandbox's user namespace: Operation not permitted"),
        "{reason}"
    );
}

#[test]
fn namespace_calls_are_allowed_only_with_the_flags_the_sandbox_uses() {
    let profile = profile();
    let outright = allowed_outright(&profile);
    for name in ["setns", "unshare", "ptrace"] {
        assert!(
            !outright.iter().any(|n| n == name),
            "{name} is allowed with any arguments"
        );
    }
    // The kernel would allow these to root; the profile refuses them first.
    for (flag, what) in [
        ("--user", "a user namespace"),
        ("--mount", "a mount namespace"),
        ("--pid", "a pid namespace"),
    ] {
        let (code, stderr) = under(&profile, &["/usr/bin/unshare", flag, "/usr/bin/true"]);
        assert_ne!(code, 0, "unshare {flag} ({what}) was allowed");
        assert!(
            stderr.contains("Operation not permitted"),
            "{flag}: {stderr}"
        );
    }
    // And ptrace, which Moat never calls (PTRACE_TRACEME: harmless if allowed).
    let (code, stderr) = under(
        &profile,
        &[
            PYTHON,
            "-c",
            "import ctypes, sys\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             rc = libc.ptrace(0, 0, 0, 0)\n\
             sys.exit(0 if rc == -1 and ctypes.get_errno() == 1 else 1)",
        ],
    );
    assert_eq!(code, 0, "ptrace was not refused with EPERM: {stderr}");
}
