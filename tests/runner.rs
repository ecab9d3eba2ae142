#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Sealed runners: `moat runner build` appends a signed manifest to a copy
//! of the binary; the result runs as `moat` does, knows its manifest, and is
//! identified by the SHA-256 of the whole file.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

fn sha256_file(path: &std::path::Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn a_sealed_runner_runs_as_moat_knows_its_manifest_and_is_named_by_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let (signed, public) = signed_manifest(dir.path(), |_| {});
    let runner = dir.path().join("runner");
    let built = Command::new(MOAT)
        .args(["runner", "build", "--manifest", path_str(&signed)])
        .args([
            "--trusted-key",
            path_str(&public),
            "--out",
            path_str(&runner),
        ])
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let report: Value = serde_json::from_slice(&built.stdout).unwrap();
    assert_eq!(report["runnerHash"], sha256_file(&runner));
    let sealed: Value = serde_json::from_str(&std::fs::read_to_string(&signed).unwrap()).unwrap();
    assert_eq!(report["manifestHash"], sealed["manifestHash"]);

    // The runner describes itself, and still does moat's work.
    let own = Command::new(&runner)
        .args(["runner", "inspect"])
        .output()
        .unwrap();
    let own: Value = serde_json::from_slice(&own.stdout).unwrap();
    assert_eq!(own, report);
    let exec = Command::new(&runner)
        .args(["exec", "--", "/bin/echo", "sealed"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&exec.stdout), "sealed\n");

    // `shell` without --manifest serves under the sealed one.
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("input")).unwrap();
    std::fs::create_dir_all(ws.join("output")).unwrap();
    let mut shell = Command::new(&runner)
        .args(["shell", "--trusted-key", path_str(&public)])
        .args([
            "--workspace",
            path_str(&ws),
            "--state",
            path_str(&dir.path().join("state")),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = r#"{"id":"1","runId":"r","correlationId":"c","op":"artifact_list","args":{"path":"."},"createdAt":"2026-11-29T12:00:00Z"}"#;
    writeln!(shell.stdin.take().unwrap(), "{line}").unwrap();
    let out = shell.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "ok", "{result}");

    // Building from a sealed runner, or over an existing file, is refused.
    let again = Command::new(&runner)
        .args(["runner", "build", "--manifest", path_str(&signed)])
        .args(["--trusted-key", path_str(&public)])
        .args(["--out", path_str(&dir.path().join("runner2"))])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(!dir.path().join("runner2").exists());
}

#[test]
fn a_tampered_or_foreign_manifest_makes_no_runner_and_no_shell() {
    let dir = tempfile::tempdir().unwrap();
    let (signed, public) = signed_manifest(dir.path(), |_| {});
    let other = tempfile::tempdir().unwrap();
    let (_, foreign_key) = signed_manifest(other.path(), |_| {});
    let out = dir.path().join("runner");
    let refused = Command::new(MOAT)
        .args(["runner", "build", "--manifest", path_str(&signed)])
        .args([
            "--trusted-key",
            path_str(&foreign_key),
            "--out",
            path_str(&out),
        ])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(!out.exists());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("verify"));

    // A runner whose sealed manifest is edited afterwards: its identity
    // changes, and neither inspect nor shell accepts it.
    let built = Command::new(MOAT)
        .args(["runner", "build", "--manifest", path_str(&signed)])
        .args(["--trusted-key", path_str(&public), "--out", path_str(&out)])
        .output()
        .unwrap();
    assert!(built.status.success());
    let mut bytes = std::fs::read(&out).unwrap();
    let at = bytes
        .windows(7)
        .rposition(|w| w == b"\"local\"")
        .expect("the environment in the trailer");
    bytes[at + 1] = b'L';
    let bytes_file = dir.path().join("tampered.bytes");
    std::fs::write(&bytes_file, &bytes).unwrap();
    let tampered = dir.path().join("tampered");
    install_executable(&bytes_file, &tampered);
    let inspect = Command::new(&tampered)
        .args(["runner", "inspect"])
        .output()
        .unwrap();
    assert_eq!(inspect.status.code(), Some(2));
    let shell = Command::new(&tampered)
        .args(["shell", "--trusted-key", path_str(&public)])
        .args([
            "--workspace",
            path_str(dir.path()),
            "--state",
            path_str(&dir.path().join("s")),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        shell.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&shell.stderr)
    );
}
