//! `moat mcp` with a real MCP client we did not write: the official Python
//! SDK (`pip install mcp`, installed by .ci/run). It lists the tools, writes,
//! reads, runs an allowed program and gets a denial; the ledger has it all.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

#[test]
fn an_official_mcp_client_uses_moat_as_its_tool_surface() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| Command::new(MOAT).args(args).output().unwrap();
    let (signed, public) = signed_manifest(dir.path(), |_| {});
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.path().join("state");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
    let output = Command::new("python3")
        .args([script, MOAT, "--"])
        .args([
            "--manifest",
            path_str(&signed),
            "--trusted-key",
            path_str(&public),
        ])
        .args(["--workspace", path_str(&ws), "--state", path_str(&state)])
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python MCP client failed (is `pip install mcp` done? .ci/run does it): {stderr}"
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        seen["tools"],
        serde_json::json!([
            "artifact_list",
            "artifact_read",
            "artifact_write",
            "exec_argv",
            "http_request",
            "http_request_profile"
        ])
    );
    assert_eq!(
        seen["schemas"]["artifact_read"]["required"],
        serde_json::json!(["path", "maxBytes"])
    );
    assert_eq!(seen["write"]["isError"], false, "{seen}");
    assert_eq!(
        std::fs::read_to_string(ws.join("output/hello.txt")).unwrap(),
        "hello from MCP\n"
    );
    assert_eq!(
        seen["read"]["result"]["result"]["content"],
        "hello from MCP\n"
    );
    assert_eq!(
        seen["exec"]["result"]["result"]["stdout"], "hello from MCP\n",
        "{seen}"
    );
    assert_eq!(seen["denied"]["isError"], true);
    assert_eq!(seen["denied"]["result"]["reason"], "path_outside_workspace");
    let tail = run(&["ledger", "tail", "--state", path_str(&state)]);
    let events = String::from_utf8_lossy(&tail.stdout);
    assert!(events.contains("\"artifact.created\""));
    assert!(events.contains("\"path.denied\""));
    assert!(events.contains("\"sandbox.exec.finished\""));
    assert!(
        run(&["ledger", "verify", "--state", path_str(&state)])
            .status
            .success()
    );
}
