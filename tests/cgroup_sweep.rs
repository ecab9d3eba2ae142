#![allow(clippy::expect_used, clippy::unwrap_used)]
//! A `moat exec` killed with SIGKILL cannot remove its run's cgroup (its
//! sandbox dies with it and leaves the directory empty): the next start
//! removes it, and says so in its report. A test binary of its own: another
//! test's launch would sweep the directory first.

mod common;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{MOAT, exec, host_processes_with, token};

/// Where `pid`'s cgroup of `controller` is (v1), else its unified one.
fn cgroup_dir(pid: &str, controller: &str) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path_of = |wanted: &dyn Fn(&str) -> bool| {
        text.lines()
            .find(|l| wanted(l.split(':').nth(1).unwrap()))
            .map(|l| l.splitn(3, ':').nth(2).unwrap().to_owned())
    };
    let v1 = path_of(&|c| c.split(',').any(|c| c == controller));
    let path = v1.clone().or_else(|| path_of(&str::is_empty)).unwrap();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = mountinfo
        .lines()
        .find(|l| match v1 {
            Some(_) => l.contains(" - cgroup ") && l.ends_with(&format!(",{controller}")),
            None => l.contains(" - cgroup2 "),
        })
        .map(|l| l.split(' ').nth(4).unwrap().to_owned())
        .unwrap();
    PathBuf::from(mount).join(path.trim_start_matches('/'))
}

/// `moat exec` of a shell that waits for a line on stdin, once it is
/// ready, with the pids of its sandboxed processes (init is a clone of the
/// launcher: both carry `marker` on their command lines).
fn start_waiting(marker: &str) -> (std::process::Child, Vec<String>) {
    let script = format!("echo ready; read line # {marker}");
    let mut child = Command::new(MOAT)
        .args(["exec", "--", "/bin/sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let launcher = child.id().to_string();
    let sandboxed = host_processes_with(marker)
        .iter()
        .map(|p| p.split(':').next().unwrap().to_owned())
        .filter(|pid| *pid != launcher)
        .collect();
    (child, sandboxed)
}

#[test]
fn the_cgroup_of_a_killed_launcher_is_removed_by_the_next_start() {
    let marker = format!("sweep{}", token());
    let (mut child, sandboxed) = start_waiting(&marker);
    assert!(!sandboxed.is_empty());
    let dirs: Vec<PathBuf> = ["memory", "pids"]
        .iter()
        .map(|c| cgroup_dir(&sandboxed[0], c))
        .collect();
    for dir in &dirs {
        assert!(dir.to_string_lossy().contains("/moat/run-"), "{dir:?}");
    }

    // SIGKILL: no chance to clean up. The sandbox dies with its launcher.
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !host_processes_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the sandbox outlived its launcher"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A dying process leaves the cgroup a moment after its command line
    // goes blank: wait for the cgroup to empty, then it must still be there.
    for dir in &dirs {
        loop {
            assert!(dir.exists(), "{dir:?} was removed by nobody?");
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
            if procs.trim().is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "{dir:?} kept {procs}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    // A directory this young might be a launcher's between mkdir and flock.
    std::thread::sleep(Duration::from_millis(2500));
    let run = exec(&[], &["/bin/true"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    for dir in &dirs {
        assert!(!dir.exists(), "{dir:?} left behind after the next start");
    }
    let cgroup = run.report["enforcement"]["cgroup"]["detail"]
        .as_str()
        .unwrap();
    assert!(
        cgroup.contains("left by launchers that were killed"),
        "{cgroup}"
    );
    // A live run's directory is never taken: the next start's own is gone
    // only because it ended.
    let (mut live, inside) = start_waiting(&format!("live{}", token()));
    let live_dir = cgroup_dir(&inside[0], "memory");
    std::thread::sleep(Duration::from_millis(2500));
    let run = exec(&[], &["/bin/true"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(live_dir.exists(), "a live run's cgroup was swept");
    live.stdin.take().unwrap().write_all(b"done\n").unwrap();
    assert!(live.wait().unwrap().success());
    assert!(!live_dir.exists());
}
