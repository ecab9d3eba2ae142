#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Every `sh` block of the README runs as written, in order, in one fresh
//! directory, against the binary under test: `moat` is on PATH there (as the
//! README's install step puts it) and `target/…/release/moat` names it too.
//! HOME and the state directory are the test's own.
//!
//! A comment right before a block says how it runs:
//! - none: run to its end, it must succeed;
//! - `<!-- readme-test: setup: CMD -->`: CMD first (files the block uses);
//! - `<!-- readme-test: background: TEXT -->`: a server; it must print TEXT,
//!   and it runs (the next blocks talk to it) until the test ends;
//! - `<!-- readme-test: skip: REASON -->`: not run here, for the reason given
//!   (the list of such blocks is checked below, so none slips in silently).

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::MOAT;

struct Block {
    line: usize,
    how: String,
    code: String,
}

/// The README's `sh` blocks, each with the `readme-test` comment before it.
fn blocks(readme: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = readme.lines().enumerate().peekable();
    let mut last_comment = String::new();
    while let Some((n, line)) = lines.next() {
        if let Some(how) = line
            .strip_prefix("<!-- readme-test:")
            .and_then(|rest| rest.strip_suffix("-->"))
        {
            last_comment = how.trim().to_owned();
            continue;
        }
        if line.starts_with("```") {
            let lang = line.trim_start_matches('`').trim().to_owned();
            let mut code = String::new();
            for (_, line) in lines.by_ref() {
                if line.starts_with("```") {
                    break;
                }
                code.push_str(line);
                code.push('\n');
            }
            if lang == "sh" {
                out.push(Block {
                    line: n + 1,
                    how: std::mem::take(&mut last_comment),
                    code,
                });
            }
        }
        if !line.trim().is_empty() {
            last_comment.clear();
        }
    }
    out
}

/// A block left running: its whole process group is ended with the test.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        for _ in 0..100 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.wait();
    }
}

fn bash(dir: &Path, env: &[(&str, String)], code: &str) -> Command {
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", code])
        .current_dir(dir)
        .env_remove("MOAT_STATE")
        .envs(env.iter().map(|(k, v)| (k, v)));
    command
}

#[test]
fn every_command_block_of_the_readme_runs_as_written() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in [
        "bin",
        "home",
        "state",
        "target/x86_64-unknown-linux-gnu/release",
        "policies",
    ] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::os::unix::fs::symlink(MOAT, d.join("bin/moat")).unwrap();
    std::os::unix::fs::symlink(MOAT, d.join("target/x86_64-unknown-linux-gnu/release/moat"))
        .unwrap();
    std::fs::copy(
        format!("{root}/policies/default.cedar"),
        d.join("policies/default.cedar"),
    )
    .unwrap();
    let env = [
        (
            "PATH",
            format!(
                "{}:{}",
                d.join("bin").display(),
                std::env::var("PATH").unwrap()
            ),
        ),
        ("HOME", d.join("home").display().to_string()),
        ("XDG_STATE_HOME", d.join("state").display().to_string()),
        // The worker example: the repository's guest, and componentize-py
        // where the README says to install it (tests/suite.sh does).
        ("MOAT_README_REPO", root.to_owned()),
        (
            "MOAT_COMPONENTIZE_PY",
            std::env::var("MOAT_TEST_COMPONENTIZE_PY").unwrap_or_default(),
        ),
    ];
    // The README's servers use its addresses.
    for port in [7700, 7800] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "127.0.0.1:{port} is taken: the README's examples need it"
        );
    }

    let mut skipped = Vec::new();
    let mut background = Vec::new();
    let mut ran = 0;
    for block in blocks(&readme) {
        let where_ = format!("README.md line {}", block.line);
        if let Some(reason) = block.how.strip_prefix("skip:") {
            skipped.push(block.code.lines().next().unwrap_or_default().to_owned());
            assert!(!reason.trim().is_empty(), "{where_}: a skip needs a reason");
            continue;
        }
        ran += 1;
        if let Some(setup) = block.how.strip_prefix("setup:") {
            let out = bash(d, &env, setup).output().unwrap();
            assert!(out.status.success(), "{where_}: setup failed: {out:?}");
        }
        if let Some(ready) = block.how.strip_prefix("background:") {
            let ready = ready.trim().to_owned();
            let mut command = bash(d, &env, &format!("exec 2>&1\n{}", block.code));
            command.stdin(Stdio::null()).stdout(Stdio::piped());
            command.process_group(0);
            let mut child = command.spawn().unwrap();
            let stdout = child.stdout.take().unwrap();
            background.push(Background(child));
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            let mut seen = String::new();
            loop {
                match rx.recv_timeout(Duration::from_secs(180)) {
                    Ok(line) => {
                        seen.push_str(&line);
                        seen.push('\n');
                        assert!(!line.contains("panicked"), "{where_}: {seen}");
                        if line.contains(&ready) {
                            break;
                        }
                    }
                    Err(_) => panic!("{where_}: never printed {ready:?}:\n{seen}"),
                }
            }
            continue;
        }
        assert!(
            block.how.is_empty() || block.how.starts_with("setup:"),
            "{where_}: unknown readme-test {:?}",
            block.how
        );
        let out = bash(d, &env, &block.code).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked"),
            "{where_} failed ({}):\n{}\nstdout:\n{}\nstderr:\n{stderr}",
            out.status,
            block.code,
            String::from_utf8_lossy(&out.stdout)
        );
    }
    drop(background);

    // What the blocks were meant to do, they did.
    assert_eq!(
        std::fs::read_to_string(d.join("out/result.txt")).unwrap(),
        "done\n"
    );
    assert!(d.join("home/moat-7800/agent-token").exists());
    assert!(d.join("runner-state").is_dir());
    // Exactly these are not run here, each for the reason in the README.
    assert_eq!(
        skipped,
        [
            "cargo build --release --locked && target/x86_64-unknown-linux-gnu/release/moat up --demo",
            "install -m 755 target/x86_64-unknown-linux-gnu/release/moat /usr/local/bin/moat",
            "bash tests/suite.sh",
            "moat exec --network allowlist --allow-domain pypi.org --allow-domain '*.pythonhosted.org' \\",
            "claude mcp add moat -- /usr/local/bin/moat mcp --manifest /etc/moat/signed.json \\",
        ]
    );
    assert!(ran >= 6, "only {ran} blocks ran");
}
