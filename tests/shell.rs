//! `moat shell` against the real binary: the escapes and denials of
//! docs/protocol.md and docs/sandbox.md, each checked on the host and in
//! the ledger, plus bad input.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use serde_json::{Value, json};
use sha2::Digest as _;

struct Session {
    dir: tempfile::TempDir,
    ws: PathBuf,
    state: PathBuf,
    signed: PathBuf,
    public: PathBuf,
    /// More `moat shell` arguments.
    extra: Vec<String>,
    /// Run the shell as this user (`None`: as the test, root).
    uid: Option<u32>,
}

fn moat(args: &[&str]) -> std::process::Output {
    Command::new(MOAT).args(args).output().unwrap()
}

impl Session {
    fn new(edit: impl FnOnce(&mut Value)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("input")).unwrap();
        std::fs::write(ws.join("input/data.txt"), "line one\nline two\n").unwrap();
        let (signed, public) = signed_manifest(dir.path(), |manifest| {
            manifest["allowedExecutables"] = json!([
                {"path": "/usr/bin/cat"}, {"path": "/usr/bin/env"}, {"path": "/usr/bin/yes"},
                {"path": "/bin/sh"}, {"path": "/usr/bin/sleep"}, {"path": "/usr/bin/wc"}
            ]);
            manifest["envPassthrough"] = json!(["GREETING"]);
            edit(manifest);
        });
        let state = dir.path().join("state");
        Session {
            dir,
            ws,
            state,
            signed,
            public,
            extra: Vec::new(),
            uid: None,
        }
    }

    fn command(&self) -> Command {
        let mut c = command_as(MOAT, self.uid);
        c.args([
            "shell",
            "--manifest",
            path_str(&self.signed),
            "--trusted-key",
            path_str(&self.public),
        ])
        .args([
            "--workspace",
            path_str(&self.ws),
            "--state",
            path_str(&self.state),
        ])
        .args(&self.extra);
        c
    }

    /// Sends raw lines; returns one parsed result per line.
    fn send(&self, lines: &[Vec<u8>]) -> Vec<Value> {
        let mut child = self
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input: Vec<u8> = lines
            .iter()
            .flat_map(|l| l.iter().copied().chain([b'\n']))
            .collect();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let results: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
            .collect();
        writer.join().unwrap();
        let status = child.wait_with_output().unwrap();
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        assert_eq!(results.len(), lines.len(), "one result per line");
        results
    }

    fn ops(&self, ops: &[Value]) -> Vec<Value> {
        self.send(
            &ops.iter()
                .map(|o| o.to_string().into_bytes())
                .collect::<Vec<_>>(),
        )
    }

    fn events(&self) -> Vec<Value> {
        let out = moat(&["ledger", "tail", "--state", path_str(&self.state)]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn events_of(&self, op_id: &str, event_type: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["opId"] == op_id && e["type"] == event_type)
            .collect()
    }

    fn ledger_verifies(&self) -> bool {
        moat(&["ledger", "verify", "--state", path_str(&self.state)])
            .status
            .success()
    }
}

fn op(id: &str, op: &str, args: Value) -> Value {
    json!({"id": id, "runId": "run-t", "correlationId": "c", "op": op, "args": args,
           "createdAt": "2026-11-29T12:00:00Z"})
}

fn assert_denied(result: &Value, reason: &str) {
    assert_eq!(result["status"], "denied", "{result}");
    assert_eq!(result["reason"], reason, "{result}");
}

#[test]
fn traversal_and_absolute_paths_are_denied_and_recorded() {
    let canary = Canary::plant();
    let s = Session::new(|_| {});
    let escape = format!("../../../..{}", canary.path.display());
    let results = s.ops(&[
        op(
            "1",
            "artifact_read",
            json!({"path": escape, "maxBytes": 100}),
        ),
        op(
            "2",
            "artifact_read",
            json!({"path": canary.path.display().to_string(), "maxBytes": 100}),
        ),
        op(
            "3",
            "artifact_write",
            json!({"path": format!("output/{escape}"), "content": "x", "maxBytes": 10}),
        ),
        op("4", "artifact_list", json!({"path": "input/../.."})),
    ]);
    assert_denied(&results[0], "path_outside_workspace");
    assert_denied(&results[1], "absolute_path");
    assert_denied(&results[2], "path_outside_workspace");
    assert_denied(&results[3], "path_outside_workspace");
    for id in ["1", "2", "3", "4"] {
        assert_eq!(s.events_of(id, "path.denied").len(), 1, "op {id}");
        assert_eq!(s.events_of(id, "capability.denied").len(), 1, "op {id}");
    }
    canary.assert_intact();
    assert!(s.ledger_verifies());
}

#[test]
fn symlink_and_hardlink_escapes_are_denied() {
    let canary = Canary::plant();
    let s = Session::new(|_| {});
    let input = s.ws.join("input");
    std::os::unix::fs::symlink(&canary.path, input.join("file-link")).unwrap();
    std::os::unix::fs::symlink(canary.dir.path(), input.join("dir-link")).unwrap();
    std::fs::create_dir_all(s.ws.join("output")).unwrap();
    std::os::unix::fs::symlink(&canary.path, s.ws.join("output/planted")).unwrap();
    let hard = std::fs::hard_link(&canary.path, input.join("hard-link")).is_ok();
    let name = canary.path.file_name().unwrap().to_str().unwrap();
    let results = s.ops(&[
        op("1", "artifact_read", json!({"path": "input/file-link", "maxBytes": 100})),
        op("2", "artifact_read", json!({"path": format!("input/dir-link/{name}"), "maxBytes": 100})),
        op("3", "artifact_write", json!({"path": "output/planted", "content": "pwned", "maxBytes": 10, "overwrite": true})),
        op("4", "artifact_write", json!({"path": "output/planted/x", "content": "pwned", "maxBytes": 10})),
        op("5", "artifact_read", json!({"path": "input/hard-link", "maxBytes": 100})),
    ]);
    assert_denied(&results[0], "symlink_escape");
    assert_denied(&results[1], "symlink_escape");
    assert_denied(&results[2], "wrong_file_type");
    assert_eq!(results[3]["status"], "denied", "{}", results[3]);
    if hard {
        assert_denied(&results[4], "path_outside_workspace");
    }
    for result in &results {
        assert!(!result.to_string().contains(&canary.content));
    }
    assert_eq!(s.events_of("1", "path.denied").len(), 1);
    canary.assert_intact();
    if hard {
        std::fs::remove_file(input.join("hard-link")).unwrap();
        canary.assert_intact();
    }
}

#[test]
fn writes_land_only_under_output_atomically_and_become_artifacts() {
    let s = Session::new(|_| {});
    let results = s.ops(&[
        op(
            "1",
            "artifact_write",
            json!({"path": "input/evil.txt", "content": "x", "maxBytes": 10}),
        ),
        op(
            "2",
            "artifact_write",
            json!({"path": "output/deep/report.md", "content": "# hi\n", "maxBytes": 100}),
        ),
        op(
            "3",
            "artifact_write",
            json!({"path": "output/deep/report.md", "content": "again", "maxBytes": 100}),
        ),
        op(
            "4",
            "artifact_write",
            json!({"path": "output/big.bin", "contentBase64": "AAAA", "maxBytes": 2}),
        ),
    ]);
    assert_denied(&results[0], "write_outside_output");
    assert!(!s.ws.join("input/evil.txt").exists());
    assert_eq!(results[1]["status"], "ok", "{}", results[1]);
    assert_eq!(
        std::fs::read_to_string(s.ws.join("output/deep/report.md")).unwrap(),
        "# hi\n"
    );
    assert_denied(&results[2], "already_exists");
    assert_denied(&results[3], "too_large");
    let sha = results[1]["artifacts"][0]["sha256"].as_str().unwrap();
    let stored = s.state.join("artifacts").join(&sha[..2]).join(sha);
    assert_eq!(std::fs::read_to_string(stored).unwrap(), "# hi\n");
    let created = s.events_of("2", "artifact.created");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0]["data"]["sha256"], sha);
    assert_eq!(s.events_of("1", "capability.denied").len(), 1);
    assert!(s.ledger_verifies());
}

#[test]
fn an_artifact_only_root_is_written_by_artifact_write_and_read_only_to_programs() {
    let s = Session::new(|m| {
        m["filesystem"] = json!({
            "readRoots": ["."],
            "writeRoots": [".", "output", "export"],
            "artifactOnly": ["export"],
        });
    });
    let results = s.ops(&[
        op(
            "1",
            "exec_argv",
            json!({"argv": ["sh", "-c", "echo leak > export/direct.txt"]}),
        ),
        op(
            "2",
            "exec_argv",
            json!({"argv": ["sh", "-c", "mv export export2 || rmdir export; echo ok > output/b.txt"]}),
        ),
        op(
            "3",
            "artifact_write",
            json!({"path": "export/report.md", "content": "# ok\n", "maxBytes": 100}),
        ),
        op("4", "exec_argv", json!({"argv": ["cat", "export/report.md"]})),
    ]);
    // The program's write fails inside; nothing lands on the host.
    assert_ne!(results[0]["result"]["exitCode"], 0, "{}", results[0]);
    assert!(!s.ws.join("export/direct.txt").exists());
    assert!(s.ws.join("export").is_dir(), "the root was moved away");
    assert!(!s.ws.join("export2").exists());
    // Its writable neighbours still take writes.
    assert_eq!(results[1]["result"]["exitCode"], 0, "{}", results[1]);
    assert_eq!(
        std::fs::read_to_string(s.ws.join("output/b.txt")).unwrap(),
        "ok\n"
    );
    // artifact_write writes it, and programs read what it wrote.
    assert_eq!(results[2]["status"], "ok", "{}", results[2]);
    assert_eq!(s.events_of("3", "artifact.created").len(), 1);
    assert_eq!(results[3]["result"]["stdout"], "# ok\n", "{}", results[3]);
    let finished = s.events_of("1", "sandbox.exec.finished");
    assert_eq!(
        finished.len(),
        1,
        "the refused write is on record with its exit"
    );
    assert!(s.ledger_verifies());
}

#[test]
fn what_a_program_writes_is_judged_against_the_exports_and_only_the_good_becomes_an_artifact() {
    let s = Session::new(|m| {
        m["exports"] = json!({"rules": [
            {"path": "output/*.csv", "types": ["csv"], "csv": {"header": ["id", "amount"]}},
            {"path": "output/*.json", "types": ["json"]},
        ]});
    });
    std::fs::create_dir_all(s.ws.join("output")).unwrap();
    std::fs::write(s.ws.join("output/before.csv"), "id,amount\n0,0\n").unwrap();
    let script = "printf 'id,amount\\n1,2.50\\n' > output/clean.csv; \
        echo '{\"rows\": 1}' > output/summary.json; \
        cat /usr/bin/true > output/tool.csv; \
        printf 'id,amount\\n1,AKIAABCDEFGHIJKLMNOP\\n' > output/keys.csv; \
        printf 'id,amount\\n1,2,3\\n' > output/ragged.csv; \
        echo note > output/notes.txt";
    let results = s.ops(&[op("1", "exec_argv", json!({"argv": ["sh", "-c", script]}))]);
    let result = &results[0];
    assert_eq!(result["result"]["exitCode"], 0, "{result}");
    let exports = &result["result"]["exports"];
    let promoted: Vec<&str> = exports["promoted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        promoted,
        ["output/clean.csv", "output/summary.json"],
        "{exports}"
    );
    let rejected: Vec<(String, String)> = exports["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_owned(),
                r["reasons"][0]["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("output/keys.csv", "token"),
        ("output/notes.txt", "no_rule"),
        ("output/ragged.csv", "invalid_content"),
        ("output/tool.csv", "executable"),
    ]
    .iter()
    .map(|(p, r)| ((*p).to_owned(), (*r).to_owned()))
    .collect();
    assert_eq!(rejected, want, "{exports}");
    // Untouched files are not candidates again.
    assert!(!exports.to_string().contains("before.csv"), "{exports}");
    // Promoted files are artifacts, byte for byte; the rest only events.
    for path in promoted {
        let on_disk = std::fs::read(s.ws.join(path)).unwrap();
        let sha = hex::encode(sha2::Sha256::digest(&on_disk));
        let stored = s.state.join("artifacts").join(&sha[..2]).join(&sha);
        assert_eq!(std::fs::read(stored).unwrap(), on_disk, "{path}");
    }
    assert_eq!(s.events_of("1", "artifact.promoted").len(), 2);
    let rejections = s.events_of("1", "artifact.rejected");
    assert_eq!(rejections.len(), 4);
    assert!(rejections.iter().any(|e| {
        e["data"]["path"] == "output/tool.csv"
            && e["data"]["reasons"][0]["detail"]
                .as_str()
                .unwrap()
                .contains("ELF")
    }));
    assert!(s.ledger_verifies());
}

#[test]
fn exec_runs_only_allowlisted_programs_with_a_clean_environment() {
    let secret = format!("sk-{}", token());
    let s = Session::new(|m| {
        m["allowedExecutables"]
            .as_array_mut()
            .unwrap()
            .push(json!({"path": "/usr/bin/ls", "sha256": "0".repeat(64)}));
    });
    let mut child = s
        .command()
        .env("MOAT_TEST_SECRET", &secret)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = [
        op(
            "1",
            "exec_argv",
            json!({"argv": ["env"], "env": {"GREETING": "hi"}}),
        ),
        op("2", "exec_argv", json!({"argv": ["bash", "-c", "id"]})),
        op("3", "exec_argv", json!({"argv": ["ls"]})),
        op(
            "4",
            "exec_argv",
            json!({"argv": ["env"], "env": {"LD_PRELOAD": "/x.so"}}),
        ),
        op(
            "5",
            "exec_argv",
            json!({"argv": ["cat", "input/data.txt"], "cwd": "."}),
        ),
    ];
    {
        let mut stdin = child.stdin.take().unwrap();
        for line in &lines {
            writeln!(stdin, "{line}").unwrap();
        }
    }
    let output = child.wait_with_output().unwrap();
    let results: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let env_out = results[0]["result"]["stdout"].as_str().unwrap();
    assert!(env_out.contains("GREETING=hi"), "{env_out}");
    assert!(!env_out.contains(&secret), "{env_out}");
    assert!(!env_out.contains("MOAT_TEST_SECRET"));
    assert_denied(&results[1], "executable_not_allowed");
    assert_denied(&results[2], "executable_not_allowed"); // pinned hash differs
    assert!(results[2]["message"].as_str().unwrap().contains("hash"));
    assert_denied(&results[3], "env_not_allowed");
    assert_eq!(
        results[4]["result"]["stdout"], "line one\nline two\n",
        "{}",
        results[4]
    );
    assert_eq!(s.events_of("2", "capability.denied").len(), 1);
    assert_eq!(s.events_of("1", "sandbox.exec.finished").len(), 1);
}

#[test]
fn exec_timeout_kills_the_process_tree() {
    let s = Session::new(|_| {});
    let marker = format!(
        "7{}",
        &token()[..6].replace(|c: char| !c.is_ascii_digit(), "5")
    );
    let script = format!("sleep {marker} & (sleep {marker} &); sleep {marker}");
    let results = s.ops(&[op(
        "1",
        "exec_argv",
        json!({"argv": ["sh", "-c", script], "timeoutMs": 500}),
    )]);
    assert_eq!(results[0]["status"], "timeout", "{}", results[0]);
    assert_eq!(s.events_of("1", "process.timeout").len(), 1);
    assert!(host_processes_with(&format!("sleep {marker}")).is_empty());
}

#[test]
fn exec_output_is_capped_and_saved_as_an_artifact() {
    let s = Session::new(|_| {});
    let results = s.ops(&[op(
        "1",
        "exec_argv",
        json!({"argv": ["yes"], "maxOutputBytes": 100000}),
    )]);
    let result = &results[0]["result"];
    assert_eq!(result["stdoutBytes"], 100000, "{}", results[0]);
    assert_eq!(result["stdoutTruncated"], true);
    assert!(result["stdout"].as_str().unwrap().len() <= 16 << 10);
    let artifact = &results[0]["artifacts"][0];
    assert_eq!(artifact["kind"], "stdout");
    let sha = artifact["sha256"].as_str().unwrap();
    let stored = std::fs::read(s.state.join("artifacts").join(&sha[..2]).join(sha)).unwrap();
    assert_eq!(stored.len(), 100000);
    assert_eq!(s.events_of("1", "artifact.created").len(), 1);
}

#[test]
fn raw_shell_strings_unknown_ops_and_disallowed_ops_are_denied() {
    let s = Session::new(|m| {
        m["allowedOps"] = json!([
            "artifact_read",
            "artifact_list",
            "http_request",
            "browser_step"
        ])
    });
    // A policyDecisionRef is the agent's own word, not an approval.
    let mut browser_approved = op(
        "5",
        "browser_step",
        json!({"action": "open", "sessionId": "s"}),
    );
    browser_approved["policyDecisionRef"] = json!("approval-1");
    let results = s.ops(&[
        json!({"cmd": "rm -rf /"}),
        op("2", "shell", json!({"script": "id"})),
        op("3", "exec_argv", json!({"argv": ["cat"]})),
        op("4", "browser_step", json!({})),
        browser_approved,
        op(
            "6",
            "http_request",
            json!({"method": "GET", "url": "http://example.test/"}),
        ),
    ]);
    assert_denied(&results[0], "raw_shell_unsupported");
    assert_denied(&results[1], "unknown_op");
    assert_denied(&results[2], "op_not_in_manifest");
    assert_denied(&results[3], "approval_required");
    assert_denied(&results[4], "approval_required");
    assert_denied(&results[5], "network_not_allowed");
    assert_eq!(s.events_of("6", "network.denied").len(), 1);
    let denials = s
        .events()
        .into_iter()
        .filter(|e| e["type"] == "capability.denied")
        .count();
    assert_eq!(denials, 6);
}

#[test]
fn bad_input_never_crashes_and_the_shell_goes_on() {
    let s = Session::new(|_| {});
    let mut deep = "[".repeat(100_000);
    deep.push_str(&"]".repeat(100_000));
    let mut long = b"{\"id\":\"".to_vec();
    long.extend(std::iter::repeat_n(b'a', 100 << 20));
    let lines: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{".to_vec(),
        b"[1,2]".to_vec(),
        vec![0xff, 0xfe, b'{', 0x80],
        b"{\"id\":\"1\",\"runId\":\"r\",\"correlationId\":\"c\",\"op\":\"artifact_read\",\"args\":{\"path\":\"a\\u0000b\",\"maxBytes\":1},\"createdAt\":\"x\"}".to_vec(),
        deep.into_bytes(),
        op("2", "artifact_read", json!({"path": "input/data.txt", "maxBytes": -1})).to_string().into_bytes(),
        b"{\"id\":\"3\",\"runId\":\"r\",\"correlationId\":\"c\",\"op\":\"artifact_read\",\"args\":{\"path\":\"input/data.txt\",\"maxBytes\":1e999},\"createdAt\":\"x\"}".to_vec(),
        op("4", "artifact_read", json!({"path": "input/data.txt", "maxBytes": 10, "extra": true})).to_string().into_bytes(),
        long,
        // Arguments as an array of their fields: never read as the struct.
        op("6", "artifact_write", json!(["output/x.txt", "data", null, 10])).to_string().into_bytes(),
        op("7", "artifact_read", json!(["input/data.txt", 100])).to_string().into_bytes(),
        op("5", "artifact_read", json!({"path": "input/data.txt", "maxBytes": 100})).to_string().into_bytes(),
    ];
    let results = s.send(&lines);
    for (i, result) in results[..results.len() - 1].iter().enumerate() {
        assert_ne!(result["status"], "ok", "line {i}: {result}");
        assert!(
            result["reason"].is_string() || result["status"] == "error",
            "line {i}: {result}"
        );
    }
    assert_eq!(results[4]["reason"], "invalid_args");
    assert_eq!(results[9]["reason"], "invalid_envelope");
    assert_eq!(results[10]["reason"], "invalid_args", "{}", results[10]);
    assert_eq!(results[11]["reason"], "invalid_args", "{}", results[11]);
    for id in ["6", "7"] {
        assert_eq!(s.events_of(id, "capability.denied").len(), 1, "op {id}");
    }
    assert_eq!(results.last().unwrap()["status"], "ok");
    assert_eq!(
        results.last().unwrap()["result"]["content"],
        "line one\nline two\n"
    );
    assert!(
        !s.ws.join("output").read_dir().unwrap().any(|_| true),
        "nothing was written"
    );
    assert!(s.ledger_verifies());
}

#[test]
fn stale_expired_unsigned_and_foreign_manifests_are_refused_at_start() {
    let now = std::time::SystemTime::now();
    let stamp = |secs_ago: i64| {
        let t = if secs_ago >= 0 {
            now - std::time::Duration::from_secs(secs_ago as u64)
        } else {
            now + std::time::Duration::from_secs((-secs_ago) as u64)
        };
        humantime::format_rfc3339_seconds(t).to_string()
    };
    let cases: Vec<(&str, Session)> = vec![
        (
            "expired",
            Session::new(|m| {
                m["createdAt"] = stamp(3 * 86400).into();
                m["expiresAt"] = stamp(86400).into();
            }),
        ),
        (
            "stale",
            Session::new(|m| {
                m["createdAt"] = stamp(40 * 86400).into();
                m["expiresAt"] = stamp(-86400).into();
            }),
        ),
    ];
    for (what, s) in &cases {
        let out = s.command().stdin(Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{what}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("refusing to start") && stderr.contains(what),
            "{what}: {stderr}"
        );
    }
    let s = Session::new(|_| {});
    let mut unsigned: Value =
        serde_json::from_str(&std::fs::read_to_string(&s.signed).unwrap()).unwrap();
    unsigned["signature"] = "".into();
    std::fs::write(&s.signed, unsigned.to_string()).unwrap();
    let out = s.command().stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not signed"));
    let other = Session::new(|_| {});
    let out = Command::new(MOAT)
        .args([
            "shell",
            "--manifest",
            path_str(&other.signed),
            "--trusted-key",
            path_str(&s.public),
        ])
        .args([
            "--workspace",
            path_str(&other.ws),
            "--state",
            path_str(&other.state),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the trusted key"));
    let _ = &s.dir;
}

#[test]
fn kill_9_in_the_middle_of_a_write_leaves_no_partial_file_and_a_sound_ledger() {
    let s = Session::new(|m| m["limits"]["fileSizeBytes"] = json!(256 << 20));
    // A first write so the ledger has history.
    s.ops(&[op(
        "0",
        "artifact_write",
        json!({"path": "output/first.txt", "content": "ok", "maxBytes": 10}),
    )]);
    let big = "x".repeat(96 << 20);
    let line = op(
        "1",
        "artifact_write",
        json!({"path": "output/big.txt", "content": big, "maxBytes": 256 << 20}),
    )
    .to_string();
    let mut child = s
        .command()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(line.as_bytes());
        let _ = stdin.write_all(b"\n");
    });
    // Kill it while it is reading, parsing or writing the 96 MiB.
    std::thread::sleep(std::time::Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();
    writer.join().unwrap();
    let target = s.ws.join("output/big.txt");
    if let Ok(content) = std::fs::read(&target) {
        assert_eq!(content.len(), 96 << 20, "a partial target file");
    }
    // Staged content has no name, so a kill leaves nothing in the workspace; the ledger verifies.
    let results = s.ops(&[op("2", "artifact_list", json!({"path": "output"}))]);
    let names: Vec<&str> = results[0]["result"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".moat-")), "{names:?}");
    assert!(s.ledger_verifies());
}

#[test]
fn writes_in_one_batch_are_visible_to_later_operations_and_conflict_with_each_other() {
    let s = Session::new(|_| {});
    // Sent together, these are processed as one batch (one ledger commit).
    let results = s.ops(&[
        op(
            "1",
            "artifact_write",
            json!({"path": "output/same.txt", "content": "first", "maxBytes": 10}),
        ),
        op(
            "2",
            "artifact_write",
            json!({"path": "output/same.txt", "content": "second", "maxBytes": 10}),
        ),
        op(
            "3",
            "artifact_write",
            json!({"path": "output/over.txt", "content": "a", "maxBytes": 10}),
        ),
        op(
            "4",
            "artifact_write",
            json!({"path": "output/over.txt", "content": "b", "maxBytes": 10, "overwrite": true}),
        ),
        op(
            "5",
            "artifact_read",
            json!({"path": "output/same.txt", "maxBytes": 10}),
        ),
        op(
            "6",
            "exec_argv",
            json!({"argv": ["cat", "/workspace/output/over.txt"]}),
        ),
    ]);
    assert_eq!(results[0]["status"], "ok");
    assert_denied(&results[1], "already_exists");
    assert_eq!(results[4]["result"]["content"], "first", "{}", results[4]);
    assert_eq!(results[5]["result"]["stdout"], "b", "{}", results[5]);
    assert_eq!(
        std::fs::read_to_string(s.ws.join("output/over.txt")).unwrap(),
        "b"
    );
    let leftovers = std::fs::read_dir(s.ws.join("output"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".moat-")
        })
        .count();
    assert_eq!(leftovers, 0);
    assert!(s.ledger_verifies());
}

/// A session whose manifest grants `network` to `allow` (and lets the proxy
/// dial the test servers on 127.0.0.1, which `app.test` resolves to).
fn network_session(network: &str, allow: Vec<String>, edit: impl FnOnce(&mut Value)) -> Session {
    let mut s = Session::new(|m| {
        m["allowedOps"] = json!([
            "artifact_read",
            "artifact_write",
            "artifact_list",
            "exec_argv",
            "http_request"
        ]);
        m["allowedExecutables"]
            .as_array_mut()
            .unwrap()
            .push(json!({"path": "/usr/bin/curl"}));
        m["networkPolicy"] = json!({
            "mode": network,
            "allowDomains": allow,
            "allowAddresses": ["127.0.0.1"],
        });
        edit(m);
    });
    s.extra = vec![
        "--resolve".into(),
        "app.test=127.0.0.1".into(),
        "--resolve".into(),
        "other.test=127.0.0.1".into(),
    ];
    s
}

#[test]
fn exec_argv_gets_the_network_the_manifest_grants_and_no_more() {
    use common::servers::*;
    let server = Server::http();
    let port = server.port;
    let s = network_session("allowlist", vec![format!("app.test:{port}")], |_| {});
    let results = s.ops(&[
        op(
            "1",
            "exec_argv",
            json!({"argv": ["curl", "-sS", format!("http://app.test:{port}/")], "network": "allowlist"}),
        ),
        op(
            "2",
            "exec_argv",
            json!({"argv": ["curl", "-sS", "-i", format!("http://other.test:{port}/")], "network": "allowlist"}),
        ),
        op("3", "exec_argv", json!({"argv": ["curl", "-sS", "http://app.test/"], "network": "full"})),
        op("4", "exec_argv", json!({"argv": ["curl", "-sS", format!("http://app.test:{port}/")]})),
    ]);
    assert_eq!(results[0]["result"]["stdout"], HTTP_BODY, "{}", results[0]);
    let allowed = s.events_of("1", "network.request");
    assert_eq!(allowed.len(), 1, "{allowed:?}");
    assert_eq!(allowed[0]["data"]["decision"], "allowed");
    assert_eq!(allowed[0]["runId"], "run-t");
    let refused = results[1]["result"]["stdout"]
        .as_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        refused.contains("403") && refused.contains("x-moat-denied: domain_not_allowed"),
        "{refused}"
    );
    assert_eq!(
        s.events_of("2", "network.denied")[0]["data"]["reason"],
        "domain_not_allowed"
    );
    // More network than the manifest grants: refused before anything runs.
    assert_denied(&results[2], "network_not_allowed");
    assert_eq!(s.events_of("3", "network.denied").len(), 1);
    assert!(s.events_of("3", "sandbox.exec.started").is_empty());
    // No network asked: off, so curl cannot reach anything.
    assert_ne!(results[3]["result"]["exitCode"], 0, "{}", results[3]);
    assert_eq!(server.count(), 1, "{:?}", server.seen());
    assert!(s.ledger_verifies());

    let off = network_session("off", vec![], |_| {});
    let results = off.ops(&[op(
        "1",
        "exec_argv",
        json!({"argv": ["curl", "http://app.test/"], "network": "allowlist"}),
    )]);
    assert_denied(&results[0], "network_not_allowed");

    // ingress-only: a shell given no --expose-dir has no way for anyone to
    // reach an operation's port, so it is refused rather than run
    // unreachable, even where the manifest allows it.
    let ingress = network_session("ingress-only", vec![], |_| {});
    let results = ingress.ops(&[op(
        "1",
        "exec_argv",
        json!({"argv": ["curl", "http://app.test/"], "network": "ingress-only"}),
    )]);
    assert_denied(&results[0], "network_not_allowed");
    assert_eq!(ingress.events_of("1", "network.denied").len(), 1);
    assert!(ingress.events_of("1", "sandbox.exec.started").is_empty());
}

#[test]
fn http_request_reaches_allowed_domains_only_and_strips_credentials() {
    use common::servers::*;
    let pki = Pki::new();
    let server = Server::http();
    let tls = Server::tls(pki.config.clone());
    let (port, tls_port) = (server.port, tls.port);
    let mut s = network_session(
        "allowlist",
        vec![format!("app.test:{port}"), format!("app.test:{tls_port}")],
        |m| {
            m["networkPolicy"]["profiles"] =
                json!([{"name": "tools", "baseUrl": format!("http://app.test:{port}/api")}]);
        },
    );
    s.extra.push("--egress-ca".into());
    s.extra.push(format!("{}/ca.pem", pki.input()));
    let stored = json!({"method": "POST", "path": "/call", "body": "{}"}).to_string();
    let results = s.ops(&[
        op(
            "1",
            "http_request",
            json!({"method": "GET", "url": format!("http://app.test:{port}/")}),
        ),
        op(
            "2",
            "http_request",
            json!({"method": "GET", "url": format!("https://app.test:{tls_port}/")}),
        ),
        op(
            "3",
            "http_request",
            json!({"method": "GET", "url": format!("http://other.test:{port}/")}),
        ),
        op(
            "4",
            "http_request",
            json!({"method": "GET", "url": format!("http://app.test:{port}/big")}),
        ),
        op(
            "5",
            "artifact_write",
            json!({"path": "output/request.json", "content": stored, "maxBytes": 1000}),
        ),
    ]);
    let ok = &results[0]["result"];
    assert_eq!(ok["status"], 200, "{}", results[0]);
    assert_eq!(ok["body"], HTTP_BODY);
    let headers = ok["headers"].to_string().to_ascii_lowercase();
    assert!(
        !headers.contains("set-cookie") && !headers.contains("secret=1"),
        "{headers}"
    );
    assert_eq!(ok["strippedHeaders"], json!(["set-cookie"]));
    assert_eq!(results[1]["result"]["body"], TLS_BODY, "{}", results[1]);
    assert_denied(&results[2], "domain_not_allowed");
    assert_eq!(
        s.events_of("3", "network.denied")[0]["data"]["reason"],
        "domain_not_allowed"
    );
    let big = &results[3];
    assert_eq!(big["result"]["bodyBytes"], BIG_LEN, "{big}");
    let sha = big["result"]["bodyArtifact"].as_str().unwrap();
    assert_eq!(big["artifacts"][0]["sha256"], sha);
    assert_eq!(big["artifacts"][0]["kind"], "http_response");
    // The profile form: the stored request, sent to the profile's base URL.
    let request_ref = results[4]["artifacts"][0]["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let results = s.ops(&[
        op(
            "6",
            "http_request",
            json!({"profile": "tools", "requestRef": request_ref}),
        ),
        op(
            "7",
            "http_request",
            json!({"profile": "elsewhere", "requestRef": request_ref}),
        ),
    ]);
    assert_eq!(results[0]["result"]["status"], 200, "{}", results[0]);
    assert!(
        server
            .seen()
            .iter()
            .any(|r| r.line.starts_with("POST /api/call")),
        "{:?}",
        server.seen()
    );
    assert_denied(&results[1], "domain_not_allowed");
    assert_eq!(server.count(), 3, "{:?}", server.seen()); // 1, 4 and 6
    assert_eq!(tls.count(), 1);
    // Nothing of the credential header reached the ledger.
    let ledger = std::fs::read(s.state.join("ledger.db")).unwrap();
    assert!(!String::from_utf8_lossy(&ledger).contains("secret=1"));
    assert!(s.ledger_verifies());
}

#[test]
fn a_managed_runner_takes_only_operations_with_a_valid_unused_capability() {
    let mut s = Session::new(|_| {});
    s.extra = vec!["--require-capabilities".into()];
    let issue = |key: &std::path::Path, envelope: &Value, extra: &[&str]| -> Value {
        issue_capability(&s, key, envelope, extra)
    };
    let key = s.dir.path().join("keys/moat.key");
    let read = |id: &str| {
        op(
            id,
            "artifact_read",
            json!({"path": "input/data.txt", "maxBytes": 100}),
        )
    };
    let granted = issue(&key, &read("1"), &[]);
    let mut altered = issue(&key, &read("2"), &[]);
    altered["args"]["path"] = json!("input/other.txt");
    let expired = issue(&key, &read("3"), &["--issued-at", "2020-01-01T00:00:00Z"]);
    let other = tempfile::tempdir().unwrap();
    assert!(
        moat(&["manifest", "keygen", "--out", path_str(other.path())])
            .status
            .success()
    );
    let foreign = issue(&other.path().join("moat.key"), &read("4"), &[]);
    let too_long = Command::new(MOAT)
        .args([
            "capability",
            "issue",
            "--key",
            path_str(&key),
            "--manifest",
            path_str(&s.signed),
        ])
        .args(["--ttl", "5m", "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(too_long.status.code(), Some(2));

    let results = s.ops(&[
        read("0"),
        granted.clone(),
        granted.clone(),
        altered,
        expired,
        foreign,
    ]);
    assert_denied(&results[0], "capability_invalid");
    assert!(
        results[0]["message"]
            .as_str()
            .unwrap()
            .contains("carry a capability")
    );
    assert_eq!(results[1]["status"], "ok", "{}", results[1]);
    assert_eq!(results[1]["result"]["content"], "line one\nline two\n");
    let message = |i: usize| results[i]["message"].as_str().unwrap().to_owned();
    assert_denied(&results[2], "capability_invalid");
    assert!(message(2).contains("already used"), "{}", message(2));
    assert_denied(&results[3], "capability_invalid");
    assert!(message(3).contains("arguments"), "{}", message(3));
    assert_denied(&results[4], "capability_invalid");
    assert!(message(4).contains("expired"), "{}", message(4));
    assert_denied(&results[5], "capability_invalid");
    assert!(message(5).contains("signature"), "{}", message(5));
    let granted_events = s.events_of("1", "capability.granted");
    assert_eq!(granted_events.len(), 1, "{granted_events:?}");
    assert!(granted_events[0]["data"]["capability"]["nonce"].is_string());
    let denied: usize = ["0", "1", "2", "3", "4"]
        .iter()
        .map(|id| s.events_of(id, "capability.denied").len())
        .sum();
    assert_eq!(denied, 5); // 0, the replayed 1, 2, 3 and 4
    // A new shell process on the same ledger still knows the capability was used.
    let again = s.ops(&[granted]);
    assert_denied(&again[0], "capability_invalid");
    assert!(
        again[0]["message"]
            .as_str()
            .unwrap()
            .contains("already used"),
        "{}",
        again[0]
    );
    assert!(s.ledger_verifies());
}

#[test]
fn proxy_only_reaches_the_manifest_profiles_and_nothing_else() {
    use common::servers::*;
    let server = Server::http();
    let port = server.port;
    // app.test is allowlisted but only `tools` (other.test) is a profile.
    let s = network_session("proxy-only", vec![format!("app.test:{port}")], |m| {
        m["networkPolicy"]["profiles"] =
            json!([{"name": "tools", "baseUrl": format!("http://other.test:{port}")}]);
    });
    let results = s.ops(&[
        op(
            "1",
            "exec_argv",
            json!({"argv": ["curl", "-sS", format!("http://other.test:{port}/")], "network": "proxy-only"}),
        ),
        op(
            "2",
            "exec_argv",
            json!({"argv": ["curl", "-sS", "-i", format!("http://app.test:{port}/")], "network": "proxy-only"}),
        ),
        op(
            "3",
            "exec_argv",
            json!({"argv": ["curl", "-sS", format!("http://app.test:{port}/")], "network": "allowlist"}),
        ),
        op("4", "http_request", json!({"method": "GET", "url": format!("http://app.test:{port}/")})),
    ]);
    assert_eq!(results[0]["result"]["stdout"], HTTP_BODY, "{}", results[0]);
    let refused = results[1]["result"]["stdout"]
        .as_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        refused.contains("x-moat-denied: domain_not_allowed"),
        "{refused}"
    );
    assert_eq!(s.events_of("2", "network.denied").len(), 1);
    assert_denied(&results[2], "network_not_allowed");
    assert_denied(&results[3], "network_not_allowed");
    assert_eq!(server.count(), 1, "{:?}", server.seen());
}

#[test]
fn a_program_cannot_read_the_requests_that_follow_its_own() {
    let s = Session::new(|_| {});
    // The second request is far larger than the shell's read buffer, so
    // most of it is still in the shell's stdin pipe while `cat` (which
    // reads its stdin) runs: `cat` must get nothing of it.
    let big = "x".repeat(200_000);
    let results = s.ops(&[
        op("1", "exec_argv", json!({"argv": ["cat"]})),
        op(
            "2",
            "artifact_write",
            json!({"path": "output/big.txt", "content": big, "maxBytes": 300_000}),
        ),
        op("3", "exec_argv", json!({"argv": ["wc", "-c"]})),
    ]);
    assert_eq!(results[0]["status"], "ok", "{}", results[0]);
    assert_eq!(
        results[0]["result"]["stdout"], "",
        "the program read the next request"
    );
    assert_eq!(results[1]["status"], "ok", "the next request was damaged");
    assert_eq!(
        results[2]["result"]["stdout"].as_str().unwrap().trim(),
        "0",
        "{}",
        results[2]
    );
}

#[test]
fn a_tool_token_is_refused_without_a_control_plane() {
    let s = Session::new(|_| {});
    let results = s.ops(&[op(
        "1",
        "exec_argv",
        json!({"argv": ["cat"], "toolToken": ["crm_lookup"]}),
    )]);
    assert_denied(&results[0], "unsupported");
    assert_eq!(s.events_of("1", "sandbox.exec.started").len(), 0);
}

#[test]
fn exec_cwd_is_resolved_beneath_the_workspace_roots() {
    let s = Session::new(|_| {});
    let input = s.ws.join("input");
    let missing = format!("/nonexistent-{}", token());
    std::os::unix::fs::symlink("..", s.ws.join("up1")).unwrap();
    std::os::unix::fs::symlink("../..", input.join("up2")).unwrap();
    std::os::unix::fs::symlink("/", input.join("root")).unwrap();
    std::os::unix::fs::symlink(&missing, input.join("gone")).unwrap();
    std::fs::create_dir_all(input.join("sub")).unwrap();
    let ran = format!("ran-{}", token());
    // Wherever it runs, this program leaves a mark in the workspace.
    let argv = |id: &str| {
        json!([
            "sh",
            "-c",
            format!("echo {id} > /workspace/output/{ran}-{id}; pwd")
        ])
    };
    let exec = |id: &str, cwd: &str| op(id, "exec_argv", json!({"argv": argv(id), "cwd": cwd}));
    let mut envelope_cwd = op("9", "exec_argv", json!({"argv": argv("9")}));
    envelope_cwd["cwd"] = json!("input/root");
    let mut both = exec("10", "input/sub");
    both["cwd"] = json!("up1");
    let results = s.ops(&[
        exec("1", "up1"),
        exec("2", "input/up2"),
        exec("3", "input/root"),
        exec("4", "input/gone"),
        exec("5", "input/../.."),
        exec("6", "/"),
        exec("7", "input/data.txt"),
        exec("8", "input/nope"),
        envelope_cwd,
        both,
        exec("11", "input/sub"),
    ]);
    let expected = [
        ("1", "symlink_escape"),
        ("2", "symlink_escape"),
        ("3", "symlink_escape"),
        ("4", "symlink_escape"),
        ("5", "path_outside_workspace"),
        ("6", "absolute_path"),
        ("7", "wrong_file_type"),
        ("8", "not_found"),
        ("9", "symlink_escape"),
        ("10", "symlink_escape"),
    ];
    for (i, (id, reason)) in expected.iter().enumerate() {
        assert_denied(&results[i], reason);
        assert!(results[i]["message"].as_str().is_some(), "{}", results[i]);
        let path_denials = s.events_of(id, "path.denied").len();
        let is_path_reason = !["wrong_file_type", "not_found"].contains(reason);
        assert_eq!(path_denials, usize::from(is_path_reason), "op {id}");
        assert_eq!(s.events_of(id, "capability.denied").len(), 1, "op {id}");
        assert_eq!(s.events_of(id, "sandbox.exec.started").len(), 0, "op {id}");
        assert!(
            !s.ws.join(format!("output/{ran}-{id}")).exists(),
            "op {id} ran"
        );
    }
    assert_eq!(results[10]["status"], "ok", "{}", results[10]);
    assert_eq!(results[10]["result"]["stdout"], "/workspace/input/sub\n");
    assert!(s.ws.join(format!("output/{ran}-11")).exists());
    assert!(!Path::new(&missing).exists());
    assert!(s.ledger_verifies());
}

#[test]
fn a_new_shell_keeps_the_agents_files_named_like_temporaries() {
    let s = Session::new(|_| {});
    let written = s.ops(&[
        op(
            "1",
            "artifact_write",
            json!({"path": "output/.moat-1-2.tmp", "content": "mine", "maxBytes": 10}),
        ),
        op(
            "2",
            "artifact_write",
            json!({"path": "output/deep/.moat-3-4.tmp", "content": "also mine", "maxBytes": 10}),
        ),
    ]);
    for (i, result) in written.iter().enumerate() {
        assert_eq!(result["status"], "ok", "{result}");
        assert_eq!(
            s.events_of(&(i + 1).to_string(), "artifact.created").len(),
            1
        );
    }
    // A second shell starts on the same workspace.
    let listed = s.ops(&[op(
        "3",
        "artifact_list",
        json!({"path": "output", "recursive": true}),
    )]);
    assert_eq!(listed[0]["status"], "ok", "{}", listed[0]);
    assert_eq!(
        std::fs::read_to_string(s.ws.join("output/.moat-1-2.tmp")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(s.ws.join("output/deep/.moat-3-4.tmp")).unwrap(),
        "also mine"
    );
}

#[test]
fn concurrent_shells_keep_each_others_writes_and_stage_nothing_under_agent_names() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = Session::new(|m| m["limits"]["fileSizeBytes"] = json!(1 << 20));
    const A: usize = 120;
    let big = "a".repeat(256 << 10);
    // Each line is larger than the shell's read buffer, so each write is a
    // batch of its own: staged, synced, published, while other shells start.
    let a_ops: Vec<Value> = (0..A)
        .map(|i| {
            op(
                &format!("a{i}"),
                "artifact_write",
                json!({"path": format!("output/a/{i}.txt"), "content": big, "maxBytes": 1 << 20,
                       "overwrite": i % 2 == 0}),
            )
        })
        .collect();
    std::fs::create_dir_all(s.ws.join("output/a")).unwrap();
    // Overwrites replace existing files: half of them exist already.
    for i in (0..A).step_by(4) {
        std::fs::write(s.ws.join(format!("output/a/{i}.txt")), "old").unwrap();
    }
    // The second shell has its own state (and ledger) but the same workspace.
    let other = tempfile::tempdir().unwrap();
    let b = Session {
        dir: tempfile::tempdir().unwrap(),
        ws: s.ws.clone(),
        state: other.path().join("state"),
        signed: s.signed.clone(),
        public: s.public.clone(),
        extra: Vec::new(),
        uid: None,
    };
    let done = AtomicBool::new(false);
    let mut stray = Vec::new();
    let mut b_written = 0usize;
    let a_results = std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            let results = s.ops(&a_ops);
            done.store(true, Ordering::SeqCst);
            results
        });
        let watcher = scope.spawn(|| {
            let mut seen = Vec::new();
            while !done.load(Ordering::SeqCst) {
                for sub in ["output", "output/a", "output/b"] {
                    for entry in std::fs::read_dir(s.ws.join(sub))
                        .into_iter()
                        .flatten()
                        .flatten()
                    {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        let expected = match sub {
                            "output" => name == "a" || name == "b",
                            _ => name.ends_with(".txt") && !name.starts_with('.'),
                        };
                        if !expected {
                            seen.push(format!("{sub}/{name}"));
                        }
                    }
                }
            }
            seen
        });
        while !done.load(Ordering::SeqCst) && b_written < 40 {
            let results = b.ops(&[op(
                "b",
                "artifact_write",
                json!({"path": format!("output/b/{b_written}.txt"), "content": b_written.to_string(),
                       "maxBytes": 10}),
            )]);
            assert_eq!(results[0]["status"], "ok", "{}", results[0]);
            b_written += 1;
        }
        stray = watcher.join().unwrap();
        a.join().unwrap()
    });
    assert!(b_written > 0);
    for (i, result) in a_results.iter().enumerate() {
        assert_eq!(result["status"], "ok", "write {i}: {result}");
        let content = std::fs::read(s.ws.join(format!("output/a/{i}.txt"))).unwrap();
        assert_eq!(content.len(), big.len(), "write {i}");
    }
    for n in 0..b_written {
        assert_eq!(
            std::fs::read_to_string(s.ws.join(format!("output/b/{n}.txt"))).unwrap(),
            n.to_string()
        );
    }
    assert!(
        stray.is_empty(),
        "staged files seen under the agent's names: {stray:?}"
    );
    assert!(s.ledger_verifies() && b.ledger_verifies());
}

/// A session whose shell runs as uid 65534, which may write no cgroup here.
fn unprivileged_session(edit: impl FnOnce(&mut Value)) -> Session {
    let mut s = Session::new(edit);
    for dir in [s.dir.path().to_path_buf(), s.dir.path().join("keys")] {
        make_world_accessible(&dir);
    }
    std::fs::create_dir_all(&s.state).unwrap();
    for path in [
        &s.ws,
        &s.ws.join("input"),
        &s.ws.join("input/data.txt"),
        &s.state,
    ] {
        std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
    }
    s.uid = Some(65534);
    s
}

#[test]
fn a_manifest_for_runners_without_per_run_cgroups_says_so_and_every_other_layer_holds() {
    // Declared: the run goes ahead, and its report says what bounds it.
    let declared = unprivileged_session(|m| m["cgroupLimits"] = json!("deployment"));
    let results = declared.ops(&[op(
        "cat",
        "exec_argv",
        json!({"argv": ["/usr/bin/cat", "input/data.txt"]}),
    )]);
    assert_eq!(results[0]["status"], "ok", "{}", results[0]);
    let finished = declared.events_of("cat", "sandbox.exec.finished");
    assert_eq!(finished.len(), 1, "{:#?}", declared.events());
    let enforcement = &finished[0]["data"]["enforcement"];
    assert_eq!(
        enforcement["cgroup"]["status"], "not_enforced",
        "{enforcement}"
    );
    assert!(
        enforcement["cgroup"]["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("declared: the deployment's limits bound this run"),
        "{enforcement}"
    );
    for layer in [
        "namespaces",
        "filesystem",
        "landlock",
        "seccomp",
        "privileges",
        "rlimits",
    ] {
        assert_eq!(
            enforcement[layer]["status"], "enforced",
            "{layer}: {enforcement}"
        );
    }
    // Not declared (the default, per-run): the same run is refused, and the
    // refusal is recorded.
    let per_run = unprivileged_session(|_| {});
    let results = per_run.ops(&[op(
        "cat",
        "exec_argv",
        json!({"argv": ["/usr/bin/cat", "input/data.txt"]}),
    )]);
    assert_ne!(results[0]["status"], "ok", "{}", results[0]);
    let denied = per_run.events_of("cat", "sandbox.exec.denied");
    assert_eq!(denied.len(), 1, "{:#?}", per_run.events());
    assert!(
        denied[0]["data"]["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("cgroup"),
        "{}",
        denied[0]
    );
    assert!(declared.ledger_verifies() && per_run.ledger_verifies());
}

/// A `browser_step` the test's policy decided (the local mode's approval).
/// `envelope` with a capability (`moat capability issue`) signed with
/// `key` for the session's manifest.
fn issue_capability(s: &Session, key: &std::path::Path, envelope: &Value, extra: &[&str]) -> Value {
    let mut child = Command::new(MOAT)
        .args(["capability", "issue", "--key", path_str(key)])
        .args(["--manifest", path_str(&s.signed)])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(envelope.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A `browser_step` approved as a control plane would: with a capability
/// signed by the session's trusted key (an acting step on any element).
fn browser(s: &Session, id: &str, args: Value) -> Value {
    browser_on(s, id, args, "any")
}

/// A `browser_step` whose capability binds `element` (a fingerprint, or
/// `any`; "" binds none).
fn browser_on(s: &Session, id: &str, args: Value, element: &str) -> Value {
    let key = s.dir.path().join("keys/moat.key");
    let mut flags = vec!["--ttl", "60s"];
    if !element.is_empty() {
        flags.extend(["--element", element]);
    }
    issue_capability(s, &key, &op(id, "browser_step", args), &flags)
}

/// Width and height of a PNG, from its header.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&png[12..16], b"IHDR");
    let word = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    (word(16), word(20))
}

/// A site, and a shell whose manifest allows `browser_step` and reaches
/// the site (as `app.test`) through the egress proxy.
fn browser_session() -> (common::servers::Site, Session) {
    let site = common::servers::Site::start();
    let s = browsing(&site, |_| {});
    (site, s)
}

/// A shell whose manifest allows `browser_step`, reaches `site` (as
/// `app.test`) and is edited further by `edit`.
fn browsing(site: &common::servers::Site, edit: impl FnOnce(&mut Value)) -> Session {
    network_session("allowlist", vec![format!("app.test:{}", site.port)], |m| {
        m["allowedOps"]
            .as_array_mut()
            .unwrap()
            .push(json!("browser_step"));
        edit(m);
    })
}

#[test]
fn browser_step_drives_a_sandboxed_browser_that_reaches_only_the_allowed_site() {
    let (site, s) = browser_session();
    let port = site.port;
    let page = format!("http://app.test:{port}/page");
    let results = s.ops(&[
        browser(&s, "1", json!({"action": "open", "sessionId": "b1"})),
        browser(&s, "2", json!({"action": "navigate", "sessionId": "b1", "url": page})),
        browser(&s, "3", json!({"action": "extract", "sessionId": "b1", "selector": "#greeting"})),
        browser(&s, "4", json!({"action": "screenshot", "sessionId": "b1"})),
        browser(&s, "5",
            json!({"action": "navigate", "sessionId": "b1", "url": format!("http://other.test:{port}/page")}),
        ),
        browser(&s, "6", json!({"action": "close", "sessionId": "b1"})),
        browser(&s, "7", json!({"action": "extract", "sessionId": "b1"})),
        op("8", "browser_step", json!({"action": "open", "sessionId": "b2"})),
    ]);
    assert_eq!(results[0]["status"], "ok", "{}", results[0]);
    let sandbox = results[0]["result"]["sandboxRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(results[1]["status"], "ok", "{}", results[1]);
    assert_eq!(
        results[1]["result"]["title"], "Moat test page",
        "{}",
        results[1]
    );
    assert_eq!(results[1]["result"]["status"], 200, "{}", results[1]);
    assert_eq!(
        results[2]["result"]["text"], "hello, browser",
        "{}",
        results[2]
    );
    // The screenshot is a PNG of the page's size, kept as an artifact.
    let shot = results[3]["result"]["screenshot"]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", results[3]));
    let png = std::fs::read(s.state.join("artifacts").join(&shot[..2]).join(shot)).unwrap();
    assert_eq!(png_size(&png), (1280, 800));
    // A site the manifest does not list is refused by the proxy, visibly.
    assert_denied(&results[4], "domain_not_allowed");
    assert_eq!(results[5]["result"]["closed"], true, "{}", results[5]);
    assert_denied(&results[6], "invalid_args");
    // Without an approval a step does not run.
    assert_denied(&results[7], "approval_required");

    // The browser's requests are on record (with the close), the refused
    // one too; the site saw only the allowed name.
    let requests = s.events_of("6", "network.request");
    assert!(
        requests
            .iter()
            .any(|e| e["data"]["host"] == "app.test" && e["data"]["status"] == 200),
        "{requests:#?}"
    );
    let denied = s.events_of("6", "network.denied");
    assert!(
        denied.iter().any(|e| e["data"]["host"] == "other.test"),
        "{denied:#?}"
    );
    assert!(!s.events_of("6", "sandbox.exec.finished").is_empty());
    let hosts = site.hosts();
    assert!(
        !hosts.is_empty() && hosts.iter().all(|h| h == &format!("app.test:{port}")),
        "{hosts:?}"
    );
    // Nothing of the browser is left.
    assert!(
        common::host_processes_with(&sandbox).is_empty(),
        "{:?}",
        common::host_processes_with(&sandbox)
    );
    assert!(s.ledger_verifies());
}

/// A `browser_step` whose capability puts it in workload class `class`.
fn browser_in(s: &Session, id: &str, args: Value, class: &str) -> Value {
    let key = s.dir.path().join("keys/moat.key");
    issue_capability(
        s,
        &key,
        &op(id, "browser_step", args),
        &["--ttl", "60s", "--element", "any", "--class", class],
    )
}

#[test]
fn a_browser_step_never_runs_in_a_weaker_class_than_its_capability_says() {
    let site = common::servers::Site::start();
    let mut s = browsing(&site, |m| {
        m["workloadClasses"] = json!(["namespace", "microvm"]);
        m["allowEmulation"] = json!(true);
    });
    let page = format!("http://app.test:{}/page", site.port);
    // A shell that offers no microvm refuses a session that must be in one.
    let refused = s.ops(&[browser_in(
        &s,
        "1",
        json!({"action": "open", "sessionId": "vm"}),
        "microvm",
    )]);
    assert_denied(&refused[0], "class_not_available");
    assert_eq!(s.events_of("1", "capability.denied").len(), 1);

    // One that does keeps a session's class: a step the policy puts in a
    // stronger class than its session's is refused, not run there; and a
    // guest too small for a browser is refused before it boots.
    s.extra.extend(["--class".into(), "microvm".into()]);
    let results = s.ops(&[
        browser_in(
            &s,
            "2",
            json!({"action": "open", "sessionId": "b1"}),
            "namespace",
        ),
        browser_in(
            &s,
            "3",
            json!({"action": "navigate", "sessionId": "b1", "url": page}),
            "microvm",
        ),
        browser_in(
            &s,
            "4",
            json!({"action": "open", "sessionId": "b2"}),
            "microvm",
        ),
        browser_in(
            &s,
            "5",
            json!({"action": "close", "sessionId": "b1"}),
            "namespace",
        ),
    ]);
    assert_eq!(results[0]["status"], "ok", "{}", results[0]);
    assert_eq!(results[0]["result"]["class"], "namespace", "{}", results[0]);
    let sandbox = results[0]["result"]["sandboxRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_denied(&results[1], "class_not_available");
    assert!(
        results[1]["message"]
            .as_str()
            .is_some_and(|m| m.contains("runs in workload class namespace")),
        "{}",
        results[1]
    );
    assert_denied(&results[2], "limit_exceeded");
    assert!(
        results[2]["message"]
            .as_str()
            .is_some_and(|m| m.contains("1024 MiB")),
        "{}",
        results[2]
    );
    assert_eq!(results[3]["result"]["closed"], true, "{}", results[3]);
    for id in ["3", "4"] {
        assert_eq!(s.events_of(id, "capability.denied").len(), 1, "op {id}");
    }
    // The refused navigation never reached the site; nothing is left.
    assert!(site.hosts().is_empty(), "{:?}", site.hosts());
    assert!(common::host_processes_with(&sandbox).is_empty());
    assert!(s.ledger_verifies());

    // A guest that cannot start: the session's failure says why, and its
    // sandbox's refusal is on the record.
    let mut big = browsing(&site, |m| {
        m["workloadClasses"] = json!(["namespace", "microvm"]);
        m["allowEmulation"] = json!(true);
        m["limits"]["memoryBytes"] = json!(2u64 << 30);
    });
    let missing = big.dir.path().join("no-such-kernel");
    big.extra.extend([
        "--class".into(),
        "microvm".into(),
        "--vm-kernel".into(),
        missing.display().to_string(),
        "--vm-modules".into(),
        big.dir.path().display().to_string(),
    ]);
    let failed = big.ops(&[browser_in(
        &big,
        "6",
        json!({"action": "open", "sessionId": "vm"}),
        "microvm",
    )]);
    assert_eq!(failed[0]["status"], "error", "{}", failed[0]);
    assert!(
        failed[0]["message"].as_str().is_some_and(
            |m| m.contains("the browser's sandbox: microvm") && m.contains("no-such-kernel")
        ),
        "{}",
        failed[0]
    );
    assert!(
        !big.events_of("6", "sandbox.exec.finished").is_empty(),
        "{:?}",
        big.events()
    );
    assert!(big.ledger_verifies());
}

#[test]
fn an_acting_step_acts_only_on_the_element_its_capability_was_decided_on() {
    let (site, s) = browser_session();
    let port = site.port;
    let url = |path: &str| format!("http://app.test:{port}{path}");
    // The form's submit button, as the browser will find it.
    let send = moat_core::element::ElementFacts {
        origin: format!("http://app.test:{port}"),
        url: url("/form"),
        tag: "button".into(),
        kind: "submit".into(),
        text: "Send".into(),
        form_method: "post".into(),
        form_action: url("/submit"),
        submits: true,
        ..Default::default()
    };
    let go = json!({"action": "click", "sessionId": "a", "selector": "#go"});
    let results = s.ops(&[
        browser(&s, "1", json!({"action": "open", "sessionId": "a"})),
        browser(
            &s,
            "2",
            json!({"action": "navigate", "sessionId": "a", "url": url("/form")}),
        ),
        // Decided on no element: it only says what it would act on.
        browser_on(&s, "3", go.clone(), ""),
        // Decided on another element: not this one.
        browser_on(&s, "4", go.clone(), &format!("sha256:{}", "0".repeat(64))),
        // Decided on that very element: it acts.
        browser_on(&s, "5", go, &send.fingerprint()),
        // A covered element is not clicked through what covers it.
        browser(
            &s,
            "6",
            json!({"action": "navigate", "sessionId": "a", "url": url("/page")}),
        ),
        browser(
            &s,
            "7",
            json!({"action": "click", "sessionId": "a", "selector": "#under"}),
        ),
        // Nor through a card onto the button inside it, nor typed into what
        // takes no focus (the text would go wherever the focus is).
        browser(
            &s,
            "7b",
            json!({"action": "click", "sessionId": "a", "selector": "#card"}),
        ),
        browser(
            &s,
            "7c",
            json!({"action": "type", "sessionId": "a", "selector": "#greeting", "text": "x"}),
        ),
        // A page's scripts cannot make its submit button pass for a link.
        browser(
            &s,
            "8",
            json!({"action": "navigate", "sessionId": "a", "url": url("/tricky")}),
        ),
        browser_on(
            &s,
            "9",
            json!({"action": "click", "sessionId": "a", "selector": "#sneaky"}),
            "",
        ),
        browser(&s, "10", json!({"action": "close", "sessionId": "a"})),
    ]);
    assert_denied(&results[2], "element_unchecked");
    assert_eq!(
        results[2]["result"]["element"],
        serde_json::to_value(&send).unwrap(),
        "{}",
        results[2]
    );
    assert_eq!(results[2]["result"]["fingerprint"], send.fingerprint());
    assert_denied(&results[3], "element_unchecked");
    // Each refusal is on record: those on the element with it.
    for id in ["7", "7b", "7c"] {
        assert!(
            s.events_of(id, "capability.denied")
                .iter()
                .any(|e| e["data"]["reason"] == "invalid_args"),
            "{id}: its refusal is not on record"
        );
    }
    for id in ["3", "4"] {
        let denied = s.events_of(id, "capability.denied");
        assert!(
            denied
                .iter()
                .any(|e| e["data"]["reason"] == "element_unchecked"
                    && e["data"]["element"]["text"] == "Send"),
            "{id}: {denied:#?}"
        );
    }
    assert_eq!(results[4]["status"], "ok", "{}", results[4]);
    assert_eq!(
        results[4]["result"]["element"]["text"], "Send",
        "{}",
        results[4]
    );
    assert_denied(&results[6], "invalid_args");
    assert!(
        results[6]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("covers"),
        "{}",
        results[6]
    );
    for refused in &results[7..=8] {
        assert_denied(refused, "invalid_args");
    }
    assert!(
        results[8]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("focus"),
        "{}",
        results[8]
    );
    assert_denied(&results[10], "element_unchecked");
    let sneaky = &results[10]["result"]["element"];
    assert_eq!(
        (
            &sneaky["tag"],
            &sneaky["type"],
            &sneaky["submits"],
            &sneaky["formMethod"]
        ),
        (
            &json!("button"),
            &json!("submit"),
            &json!(true),
            &json!("post")
        ),
        "{}",
        results[10]
    );
    // The form went once: for the step decided on its button.
    let posted = site
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.line.starts_with("POST /submit"))
        .count();
    assert_eq!(posted, 1);
    assert!(s.ledger_verifies());
}

#[test]
fn a_browser_fills_and_submits_a_form_and_sessions_share_no_cookies() {
    let (site, s) = browser_session();
    let port = site.port;
    let url = |path: &str| format!("http://app.test:{port}{path}");
    let results = s.ops(&[
        browser(&s, "1", json!({"action": "open", "sessionId": "a"})),
        browser(
            &s,
            "2",
            json!({"action": "navigate", "sessionId": "a", "url": url("/form")}),
        ),
        browser(
            &s,
            "3",
            json!({"action": "type", "sessionId": "a", "selector": "#q", "text": "moat rocks"}),
        ),
        browser(
            &s,
            "3b",
            json!({"action": "select", "sessionId": "a", "selector": "#size", "value": "Large"}),
        ),
        browser(
            &s,
            "4",
            json!({"action": "click", "sessionId": "a", "selector": "#go"}),
        ),
        browser(
            &s,
            "5",
            json!({"action": "wait_for", "sessionId": "a", "text": "thanks", "timeoutMs": 5000}),
        ),
        browser(
            &s,
            "6",
            json!({"action": "click", "sessionId": "a", "selector": "#nothing-like-it"}),
        ),
        browser(
            &s,
            "7",
            json!({"action": "navigate", "sessionId": "a", "url": url("/cookie")}),
        ),
        browser(&s, "8", json!({"action": "open", "sessionId": "b"})),
        browser(
            &s,
            "9",
            json!({"action": "navigate", "sessionId": "b", "url": url("/page")}),
        ),
        browser(
            &s,
            "10",
            json!({"action": "navigate", "sessionId": "a", "url": url("/page")}),
        ),
        browser(&s, "11", json!({"action": "close", "sessionId": "a"})),
        browser(&s, "12", json!({"action": "close", "sessionId": "b"})),
    ]);
    for (i, result) in results.iter().enumerate() {
        assert_eq!(result["status"], "ok", "step {}: {result}", i + 1);
    }
    assert_eq!(results[2]["result"]["matched"], true, "{}", results[2]);
    // What was typed is not echoed into the record.
    assert!(
        !results[2].to_string().contains("moat rocks"),
        "{}",
        results[2]
    );
    assert_eq!(results[3]["result"]["value"], "l", "{}", results[3]);
    // The click submits the form (its page comes with it, or, on a busy
    // machine, just after: the wait_for step then finds it).
    assert_eq!(results[4]["result"]["matched"], true, "{}", results[4]);
    assert_eq!(results[5]["result"]["matched"], true, "{}", results[5]);
    assert_eq!(results[6]["result"]["matched"], false, "{}", results[6]);
    let seen = site.seen.lock().unwrap().clone();
    let posted: Vec<&common::servers::SiteRequest> = seen
        .iter()
        .filter(|s| s.line.starts_with("POST /submit "))
        .collect();
    assert_eq!(posted.len(), 1, "{seen:#?}");
    assert_eq!(posted[0].body, "q=moat+rocks&size=l");
    // Session a got the cookie and sends it back; session b never sees it.
    let pages: Vec<&common::servers::SiteRequest> = seen
        .iter()
        .filter(|s| s.line.starts_with("GET /page "))
        .collect();
    assert_eq!(pages.len(), 2, "{seen:#?}");
    let cookies: Vec<&str> = pages.iter().map(|s| s.cookie.as_str()).collect();
    assert!(
        cookies.contains(&"") && cookies.contains(&"seen=yes"),
        "{cookies:?}"
    );
}

#[test]
fn a_download_is_refused_and_nothing_is_kept() {
    let (site, s) = browser_session();
    let port = site.port;
    let results = s.ops(&[
        browser(&s, "1", json!({"action": "open", "sessionId": "d"})),
        browser(&s, "2",
            json!({"action": "navigate", "sessionId": "d", "url": format!("http://app.test:{port}/file")}),
        ),
        browser(&s, "3", json!({"action": "extract", "sessionId": "d"})),
        browser(&s, "4", json!({"action": "close", "sessionId": "d"})),
    ]);
    assert_eq!(results[0]["status"], "ok", "{}", results[0]);
    let sandbox = results[0]["result"]["sandboxRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The browser is told to refuse downloads: the navigation that would
    // start one ends, saying so, and the session goes on.
    assert_eq!(results[1]["status"], "error", "{}", results[1]);
    assert_eq!(
        results[1]["result"]["error"], "net::ERR_ABORTED",
        "{}",
        results[1]
    );
    assert_eq!(results[2]["status"], "ok", "{}", results[2]);
    assert_eq!(results[3]["result"]["closed"], true, "{}", results[3]);
    // The request itself went through the proxy, on the record.
    let requests = s.events_of("4", "network.request");
    assert!(
        requests.iter().any(|e| e["data"]["host"] == "app.test"),
        "{requests:#?}"
    );
    assert!(
        site.seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.line.starts_with("GET /file")),
        "the site was never asked"
    );
    assert!(common::host_processes_with(&sandbox).is_empty());
    assert!(s.ledger_verifies());
}
