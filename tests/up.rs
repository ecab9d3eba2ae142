#![allow(clippy::expect_used, clippy::unwrap_used)]
//! `moat up` as a newcomer meets it: everything it prints for a person to
//! paste works as printed (run here with bash), the agent's first steps
//! answer while the demo run waits for its approval, each paste is a new
//! run, its state lives in the per-user state directory (never the source
//! tree), and a taken address is named as such.

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{MOAT, free_port, host_processes_with};
use serde_json::Value;

/// `moat up` stopped (SIGTERM, by pid) when the test ends, however it ends.
struct Up(Child);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bash(script: &str) -> String {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\nfailed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The lines of `text` from the one starting with `first` through the one
/// ending with `last`.
fn block<'a>(text: &'a str, first: &str, last: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with(first))
        .unwrap_or_else(|| panic!("no line starting with {first:?} in:\n{text}"));
    let end = start
        + lines[start..]
            .iter()
            .position(|l| l.trim_end().ends_with(last))
            .unwrap_or_else(|| panic!("no line ending with {last:?} in:\n{text}"));
    lines[start..=end].to_vec()
}

#[test]
fn moat_up_prints_first_steps_that_work_as_printed_while_the_demo_waits() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("state");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(MOAT)
        .args(["up", "--demo", "--listen", &listen])
        .env_remove("MOAT_STATE")
        .env("HOME", home.path())
        .env("XDG_STATE_HOME", &state)
        .current_dir(home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let up = Up(child);
    let errors = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
            .join("\n")
    });
    let mut printed = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        printed.push_str(&line);
        printed.push('\n');
        if line.starts_with("Stop with Ctrl-C") {
            break;
        }
    }
    assert!(
        printed.contains("Stop with Ctrl-C"),
        "moat up stopped early:\n{printed}\n{}",
        {
            drop(up);
            errors.join().unwrap()
        }
    );

    // Its state is in the per-user state directory, and it says where.
    let dir = state.join("moat/up");
    assert!(
        printed.contains(&format!("State:      {}", dir.display())),
        "{printed}"
    );
    for file in [
        "agent-token",
        "org-admin-token",
        "moat.db",
        "control-plane.key",
    ] {
        assert!(
            dir.join(file).exists(),
            "{file} missing in {}",
            dir.display()
        );
    }
    assert!(!home.path().join("moat-up").exists());

    // The agent's first steps, pasted as printed, twice: each is a new run,
    // and each answers at once although the demo's run waits for a person.
    let steps = block(&printed, "TOKEN=", "/finish; echo").join("\n");
    for _ in 0..2 {
        let out = bash(&steps);
        let answers: Vec<Value> = out
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(answers.len(), 3, "{out}");
        assert_eq!(answers[0]["state"], "queued", "{out}");
        assert_eq!(answers[1]["state"], "succeeded", "{out}");
        assert_eq!(answers[1]["result"]["status"], "ok", "{out}");
        assert_eq!(answers[1]["result"]["result"]["stdout"], "3 input/a.txt\n");
        assert_eq!(answers[2]["finishRequested"], true, "{out}");
    }

    // The printed approvals command works as printed (full path to moat).
    let approvals = block(&printed, "MOAT_CONTROL_PLANE=", "approvals list").join("\n");
    let listed = bash(&approvals);
    let demo = printed
        .split_whitespace()
        .find(|w| w.starts_with("demo-"))
        .unwrap();
    assert!(
        listed.contains(demo) && listed.contains("pending"),
        "{listed}"
    );

    // Approved, the demo's last step runs and the run finishes by itself.
    let approval = listed.split_whitespace().next().unwrap();
    let approve = approvals.replace("approvals list", &format!("approvals approve {approval}"));
    bash(&approve);
    let token = std::fs::read_to_string(dir.join("agent-token")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = bash(&format!(
            "curl -s -H 'Authorization: Bearer {}' http://{listen}/v1/runs/{demo}",
            token.trim()
        ));
        let run: Value = serde_json::from_str(&run).unwrap();
        if run["state"] == "succeeded" {
            break;
        }
        assert!(Instant::now() < deadline, "the demo run stayed {run}");
        std::thread::sleep(Duration::from_millis(100));
    }

    drop(up);
    let errors = errors.join().unwrap();
    assert!(errors.contains("moat up: stopping"), "{errors}");
    assert!(
        host_processes_with(dir.to_str().unwrap()).is_empty(),
        "left running: {:?}",
        host_processes_with(dir.to_str().unwrap())
    );
}

#[test]
fn moat_up_on_a_taken_address_says_so_and_names_listen() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("up");
    let out = Command::new(MOAT)
        .args(["up", "--listen", &listen, "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{listen} is already in use")) && stderr.contains("--listen"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Nothing was made or started.
    assert!(!Path::new(&dir).exists());
}
