//! `moat mcp` against MCP clients: a few lines of JSON-RPC written here (the
//! initialize handshake, tools/list, `--help`), and a real client we did not
//! write, the official Python SDK (`pip install mcp`, in the venv tests/suite.sh makes;
//! `MOAT_TEST_PYTHON` names an interpreter that has it, e.g. a venv's). It
//! lists the tools, writes, reads, runs an allowed program and gets a
//! denial; the ledger has it all.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// A signed manifest, its key, a workspace and a state directory in `dir`:
/// the arguments `moat mcp` needs.
fn mcp_args(dir: &Path) -> (Vec<String>, PathBuf, PathBuf) {
    let (signed, public) = signed_manifest(dir, |_| {});
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.join("state");
    let args = [
        "--manifest",
        path_str(&signed),
        "--trusted-key",
        path_str(&public),
        "--workspace",
        path_str(&ws),
        "--state",
        path_str(&state),
    ];
    (args.map(String::from).to_vec(), ws, state)
}

/// Starts `moat mcp`, sends `requests` (one JSON-RPC message a line) and
/// returns the answers to those with an id, in order. Fails after 30 s
/// rather than hanging on a server that does not answer.
fn json_rpc(args: &[String], requests: &[Value]) -> Vec<Value> {
    let mut server = Command::new(MOAT)
        .arg("mcp")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = server.stdin.take().unwrap();
    let stdout = BufReader::new(server.stdout.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut answers = Vec::new();
    for request in requests {
        writeln!(stdin, "{request}").unwrap();
        stdin.flush().unwrap();
        let Some(id) = request.get("id") else {
            continue;
        };
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("no answer from moat mcp to {request}: {e}"));
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("id") == Some(id) {
                answers.push(message);
                break;
            }
        }
    }
    drop(stdin);
    let status = server.wait().unwrap();
    assert!(status.success(), "moat mcp exited with {status}");
    answers
}

/// The answers of a fresh `moat mcp` to `initialize` and `tools/list`.
fn initialize_and_list_tools() -> (Value, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let (args, _, _) = mcp_args(dir.path());
    let answers = json_rpc(
        &args,
        &[
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "moat-tests", "version": "0"},
            }}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        ],
    );
    let tools = answers[1]["result"]["tools"].as_array().unwrap().clone();
    (answers[0]["result"].clone(), tools)
}

#[test]
fn the_server_names_itself_moat_with_its_version() {
    let (init, _) = initialize_and_list_tools();
    let info = &init["serverInfo"];
    assert_eq!(info["name"], "moat", "{init}");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info["title"], "Moat");
}

#[test]
fn moat_mcp_help_names_and_describes_every_tool_it_serves() {
    let (_, tools) = initialize_and_list_tools();
    assert_eq!(tools.len(), 6, "{tools:?}");
    let help = Command::new(MOAT).args(["mcp", "--help"]).output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    // clap wraps the help to the terminal's width: compare words, not lines.
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        assert!(
            help.lines().any(|line| line.trim() == name),
            "`moat mcp --help` does not list {name}:\n{help}"
        );
        let description = tool["description"].as_str().unwrap();
        let first = description.split(". ").next().unwrap();
        let first = first.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words.contains(&first),
            "`moat mcp --help` does not describe {name} as tools/list does ({first}):\n{help}"
        );
    }
}

/// The interpreter with the Python MCP SDK: `MOAT_TEST_PYTHON`, else
/// `python3`. Fails, saying how to get the SDK, when it lacks it.
fn python_with_mcp() -> String {
    let python = std::env::var("MOAT_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args(["-c", "import mcp.client.stdio"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (MOAT_TEST_PYTHON): {e}"));
    assert!(
        probe.status.success(),
        "{python} has no Python MCP SDK ({}). Run the suite with `bash tests/suite.sh` (it \
         makes a venv with it) or point MOAT_TEST_PYTHON at an interpreter that has it: \
         `python3 -m venv /tmp/venv-mcp && /tmp/venv-mcp/bin/pip install mcp`, then \
         MOAT_TEST_PYTHON=/tmp/venv-mcp/bin/python",
        String::from_utf8_lossy(&probe.stderr).trim()
    );
    python
}

#[test]
fn an_official_mcp_client_uses_moat_as_its_tool_surface() {
    let python = python_with_mcp();
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| Command::new(MOAT).args(args).output().unwrap();
    let (args, ws, state) = mcp_args(dir.path());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
    let output = Command::new(&python)
        .args([script, MOAT, "--"])
        .args(&args)
        .output()
        .expect("python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python MCP client ({python}) failed: {stderr}"
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["server"]["name"], "moat", "{seen}");
    assert_eq!(seen["server"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        seen["tools"],
        json!([
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
        json!(["path", "maxBytes"])
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
