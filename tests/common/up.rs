//! `moat up` started for a test, in a fresh home, and stopped (by pid)
//! when the test ends.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::MOAT;

/// `moat up` stopped (SIGTERM, by pid) when the test ends, however it ends.
pub struct Up(pub Child);

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

/// `moat up ARGS` in a fresh home, once it says it serves: the process,
/// what it printed, and its standard error (read to the end when joined).
pub fn start_up(home: &Path, args: &[&str]) -> (Up, String, std::thread::JoinHandle<String>) {
    let state = home.join("state");
    let mut child = Command::new(MOAT)
        .arg("up")
        .args(args)
        .env_remove("MOAT_STATE")
        .env("HOME", home)
        .env("XDG_STATE_HOME", &state)
        .current_dir(home)
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
    (up, printed, errors)
}
