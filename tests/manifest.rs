//! `moat manifest`: keys, signing, verification, refusal of edited, foreign,
//! expired and unsigned manifests.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn moat(args: &[&str]) -> Output {
    Command::new(MOAT).args(args).output().unwrap()
}

fn keys(dir: &Path, name: &str) -> (String, String) {
    let out = dir.join(name);
    assert!(
        moat(&["manifest", "keygen", "--out", path_str(&out)])
            .status
            .success()
    );
    (
        out.join("moat.key").display().to_string(),
        out.join("moat.pub").display().to_string(),
    )
}

/// `moat manifest sign --key KEY --out SIGNED BARE`, which must succeed.
fn sign(key: &str, bare: &Path, signed: &Path) {
    let out = moat(&[
        "manifest",
        "sign",
        "--key",
        key,
        "--out",
        path_str(signed),
        path_str(bare),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_signed_manifest_verifies_and_any_tampering_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keys(dir.path(), "cp");
    let (other_key, _) = keys(dir.path(), "other");
    let template = moat(&["manifest", "template", "--public-key", &public]);
    assert!(template.status.success());
    let bare = dir.path().join("manifest.json");
    std::fs::write(&bare, &template.stdout).unwrap();
    let signed = dir.path().join("signed.json");
    sign(&key, &bare, &signed);
    let ok = moat(&[
        "manifest",
        "verify",
        "--trusted-key",
        &public,
        path_str(&signed),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let hash = moat(&["manifest", "hash", path_str(&signed)]);
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains(String::from_utf8_lossy(&hash.stdout).trim())
    );

    // Edited after signing.
    let text = std::fs::read_to_string(&signed).unwrap();
    let edited = dir.path().join("edited.json");
    std::fs::write(&edited, text.replace("\"local\"", "\"prod\"")).unwrap();
    let out = moat(&[
        "manifest",
        "verify",
        "--trusted-key",
        &public,
        path_str(&edited),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("hash does not match"));

    // Signed by a key that is not the trusted one.
    let foreign = dir.path().join("foreign.json");
    let out = moat(&[
        "manifest",
        "sign",
        "--key",
        &other_key,
        "--out",
        path_str(&foreign),
        path_str(&bare),
    ]);
    assert!(out.status.success());
    let out = moat(&[
        "manifest",
        "verify",
        "--trusted-key",
        &public,
        path_str(&foreign),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the trusted key"));

    // Unsigned.
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["signature"] = "".into();
    let unsigned = dir.path().join("unsigned.json");
    std::fs::write(&unsigned, value.to_string()).unwrap();
    let out = moat(&[
        "manifest",
        "verify",
        "--trusted-key",
        &public,
        path_str(&unsigned),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not signed"));

    // Expired (validly signed, but in the past).
    let mut old: serde_json::Value = serde_json::from_slice(&template.stdout).unwrap();
    old["createdAt"] = "2020-01-01T00:00:00Z".into();
    old["expiresAt"] = "2020-01-02T00:00:00Z".into();
    std::fs::write(&bare, old.to_string()).unwrap();
    let expired = dir.path().join("expired.json");
    assert!(
        moat(&[
            "manifest",
            "sign",
            "--key",
            &key,
            "--out",
            path_str(&expired),
            path_str(&bare)
        ])
        .status
        .success()
    );
    let out = moat(&[
        "manifest",
        "verify",
        "--trusted-key",
        &public,
        path_str(&expired),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("expired"));
}

#[test]
fn keygen_never_overwrites_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = keys(dir.path(), "k");
    let before = std::fs::read(&key).unwrap();
    let again = moat(&[
        "manifest",
        "keygen",
        "--out",
        path_str(&dir.path().join("k")),
    ]);
    assert!(!again.status.success());
    assert_eq!(std::fs::read(&key).unwrap(), before);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn a_manifest_whose_times_carry_an_offset_serves_and_seals() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keys(dir.path(), "cp");
    let template = moat(&["manifest", "template", "--public-key", &public]);
    assert!(template.status.success());
    let mut manifest: serde_json::Value = serde_json::from_slice(&template.stdout).unwrap();
    // The same instants as UTC would name, written in Kiribati's +14:00
    // and in lower case with a fraction: every RFC 3339 form is a time.
    let now = std::time::SystemTime::now();
    let created = now - std::time::Duration::from_secs(3600);
    let expires = now + std::time::Duration::from_secs(7 * 86_400);
    let in_kiribati = |t: std::time::SystemTime| {
        let shifted = t + std::time::Duration::from_secs(14 * 3600);
        let utc = humantime::format_rfc3339_millis(shifted).to_string();
        utc.trim_end_matches('Z').replace('T', "t") + "+14:00"
    };
    manifest["createdAt"] = in_kiribati(created).into();
    manifest["expiresAt"] = in_kiribati(expires).into();
    let bare = dir.path().join("manifest.json");
    std::fs::write(&bare, manifest.to_string()).unwrap();
    let signed = dir.path().join("signed.json");
    sign(&key, &bare, &signed);

    // moat shell serves under it...
    let workspace = dir.path().join("work");
    std::fs::create_dir_all(workspace.join("input")).unwrap();
    let mut shell = Command::new(MOAT)
        .args([
            "shell",
            "--manifest",
            path_str(&signed),
            "--trusted-key",
            &public,
        ])
        .args([
            "--workspace",
            path_str(&workspace),
            "--state",
            path_str(&dir.path().join("state")),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    shell
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"id":"1","runId":"r1","correlationId":"c1","op":"artifact_list","args":{"path":"."},"createdAt":"2026-11-29T12:00:00Z"}
"#)
        .unwrap();
    let out = shell.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(r#""status":"ok""#), "{stdout}");

    // ...and a runner is sealed with it.
    let runner = dir.path().join("runner");
    let build = moat(&[
        "runner",
        "build",
        "--manifest",
        path_str(&signed),
        "--trusted-key",
        &public,
        "--out",
        path_str(&runner),
    ]);
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
}
