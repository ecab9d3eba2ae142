//! Destroy: what a runner does once it stops serving a run, however the run
//! ended (finished, failed, ended by the control plane, lease lost, given
//! back). It kills what is left of the run, removes its workspace and its
//! sandboxes' cgroups, and checks each: no process, no mount, no file, no
//! cgroup of the run left on this host. The checks travel to the control
//! plane as `run.destroyed`; at start, the leftovers of runs the runner no
//! longer holds (after a kill -9 or a reboot) are torn down the same way
//! and reported as `runner.janitor`.
//!
//! What the run had from the control plane dies there: a capability is
//! for one operation of a held run, and a tool token is refused once its
//! run is no longer held (see `moat_store`'s `tool_token`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use moat_core::event_data::TeardownCheck;
use moat_ledger::Ledger;

/// How long killed processes get to disappear.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// What a runner started for a run on its host, which the run's teardown
/// looks for.
pub enum Started {
    /// No shell: nothing of the run ever ran here, so there is no process
    /// and no sandbox cgroup to look for (a run that ended before its first
    /// operation). Looking would read every process's command line on the
    /// host for each such run.
    Nothing,
    /// A shell, or perhaps one (the janitor cannot tell): its processes
    /// are looked for, and its sandboxes' cgroups, named here.
    Shell { sandboxes: Vec<String> },
}

/// Tears down the run whose workspace is `dir`.
pub fn destroy(dir: &Path, started: &Started) -> Vec<TeardownCheck> {
    checks(&[dir], started)
}

/// Processes first, then mounts; files only once neither is left: a
/// surviving process could swap a directory for a link while it is being
/// removed, and removing a tree with a mount in it would reach into
/// whatever is mounted there.
fn checks(dirs: &[&Path], started: &Started) -> Vec<TeardownCheck> {
    let (processes, sandboxes) = match started {
        Started::Shell { sandboxes } => (processes(dirs), sandboxes.as_slice()),
        Started::Nothing => (
            check(
                "processes",
                true,
                "no process of the run was started on this host".to_owned(),
            ),
            &[][..],
        ),
    };
    let mounts = mounts(dirs);
    let files = if processes.ok && mounts.ok {
        files(dirs)
    } else {
        check(
            "files",
            false,
            "left in place: a process of the run or a mount under it is still there".to_owned(),
        )
    };
    vec![processes, files, mounts, cgroups(sandboxes)]
}

/// Tears down every run directory under `runs` (none is held: the runner
/// just started). Returns the runs found and the checks.
pub fn janitor(runs: &Path, ledger: Option<&Ledger>) -> (Vec<String>, Vec<TeardownCheck>) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return (Vec::new(), Vec::new());
    };
    let mut found: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    found.sort();
    if found.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let dirs: Vec<&Path> = found.iter().map(|(_, p)| p.as_path()).collect();
    let mut sandboxes = Vec::new();
    if let Some(ledger) = ledger {
        for (run, _) in &found {
            sandboxes.extend(sandboxes_of(ledger, run));
        }
    }
    let checks = checks(&dirs, &Started::Shell { sandboxes });
    (found.into_iter().map(|(run, _)| run).collect(), checks)
}

/// The names the run's sandboxes had (their cgroups are named so), from the
/// shells' ledger.
pub fn sandboxes_of(ledger: &Ledger, run: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut after = 0;
    while let Ok(page) = ledger.events(Some(run), after, 1000) {
        let Some(last) = page.last() else { break };
        after = last.seq;
        for stored in &page {
            if let Some(name) = stored.event.data["sandboxRunId"].as_str()
                && !names.iter().any(|n| n == name)
            {
                names.push(name.to_owned());
            }
        }
    }
    names
}

fn check(name: &str, ok: bool, detail: String) -> TeardownCheck {
    TeardownCheck {
        check: name.to_owned(),
        ok,
        detail,
    }
}

/// Whether one of `args` (a command line) is `dir` or a path under it.
fn names_dir(args: &[u8], dirs: &[&Path]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    args.split(|b| *b == 0).any(|arg| {
        let arg = Path::new(std::ffi::OsStr::from_bytes(arg));
        dirs.iter().any(|dir| arg.starts_with(dir))
    })
}

/// Processes (other than this one) with a run's directory on their command
/// line: its shell, and its sandboxes' inits (clones of the shell). What
/// runs inside a sandbox dies with its init (the pid namespace goes).
fn run_processes(dirs: &[&Path]) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|args| names_dir(&args, dirs))
        })
        .collect()
}

fn processes(dirs: &[&Path]) -> TeardownCheck {
    let found = run_processes(dirs);
    for pid in &found {
        let _ = moat_sandbox::process::kill(*pid);
    }
    let deadline = Instant::now() + KILL_WAIT;
    let mut left = run_processes(dirs);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = run_processes(dirs);
    }
    let detail = match (found.len(), left.len()) {
        (0, _) => "no process of the run was left".to_owned(),
        (n, 0) => format!("killed {n} process(es) of the run; none is left"),
        (_, _) => format!("still running after SIGKILL: pids {left:?}"),
    };
    check("processes", left.is_empty(), detail)
}

fn files(dirs: &[&Path]) -> TeardownCheck {
    let mut failures = Vec::new();
    let mut removed = 0;
    for dir in dirs {
        if !dir.exists() {
            continue;
        }
        let first = std::fs::remove_dir_all(dir);
        // A program may have left directories it made unwritable: the
        // runner owns them (the sandbox's files are stored with the
        // workspace owner's ids), so it may open them up and try again.
        if first.is_err() {
            make_removable(dir);
            let _ = std::fs::remove_dir_all(dir);
        }
        if dir.exists() {
            failures.push(format!("{}: {}", dir.display(), describe(first.err())));
        } else {
            removed += 1;
        }
    }
    let detail = if failures.is_empty() {
        format!("removed {removed} run director(ies) with everything in them")
    } else {
        format!("left: {}", failures.join("; "))
    };
    check("files", failures.is_empty(), detail)
}

fn describe(error: Option<std::io::Error>) -> String {
    error.map_or_else(|| "still there".to_owned(), |e| e.to_string())
}

fn make_removable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
}

fn mounts(dirs: &[&Path]) -> TeardownCheck {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let left: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| dirs.iter().any(|dir| Path::new(point).starts_with(dir)))
        .collect();
    let detail = if left.is_empty() {
        "no mount under the run's directory in the runner's mount namespace".to_owned()
    } else {
        format!("still mounted: {}", left.join(", "))
    };
    check("mounts", left.is_empty(), detail)
}

fn cgroups(sandboxes: &[String]) -> TeardownCheck {
    match moat_sandbox::remove_run_cgroups(sandboxes) {
        Ok(left) if left.is_empty() => check(
            "cgroups",
            true,
            format!(
                "none of the {} sandbox cgroup(s) of the run is left",
                sandboxes.len()
            ),
        ),
        Ok(left) => check(
            "cgroups",
            false,
            format!(
                "still there: {}",
                left.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Err(e) => check("cgroups", false, format!("could not look: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_names_a_run_by_a_whole_path() {
        let dir = Path::new("/state/runs/run-1");
        let args = b"moat\0shell\0--workspace\0/state/runs/run-1\0";
        assert!(names_dir(args, &[dir]));
        let args = b"moat\0shell\0--workspace\0/state/runs/run-10\0";
        assert!(!names_dir(args, &[dir]));
        let args = b"moat\0--workspace\0/state/runs/run-1/sub\0";
        assert!(names_dir(args, &[dir]));
    }

    #[test]
    fn destroy_removes_the_workspace_and_says_so() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("run-1");
        std::fs::create_dir_all(dir.join("output/locked")).unwrap();
        std::fs::write(dir.join("output/locked/f"), b"x").unwrap();
        std::fs::set_permissions(
            dir.join("output/locked"),
            std::fs::Permissions::from_mode(0o500),
        )
        .unwrap();
        let checks = destroy(
            &dir,
            &Started::Shell {
                sandboxes: Vec::new(),
            },
        );
        assert!(!dir.exists());
        assert!(checks.iter().all(|c| c.ok), "{checks:?}");
        let names: Vec<&str> = checks.iter().map(|c| c.check.as_str()).collect();
        assert_eq!(names, ["processes", "files", "mounts", "cgroups"]);
    }
}
