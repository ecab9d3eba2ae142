#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Storage budgets (`moat exec --max-write`, a manifest's
//! `limits.maxWriteBytes`): a program that writes past the budget gets
//! `ENOSPC`, the host's disk takes at most the budget, and what the program
//! wrote (files, changes, removals, links) reaches its root when it ends,
//! without the merge following anything the program planted.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{MOAT, Run, exec, exec_as, make_world_accessible, path_str};

const NOBODY: u32 = 65534;
const BUDGET: u64 = 100 << 20;

/// The tests here take turns: one measures the host's free space, which
/// another writing (a sealed runner's copy of this binary) would move.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Free bytes on `path`'s filesystem, as `df` reports them.
fn free_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df: {}", String::from_utf8_lossy(&out.stderr)))
}

fn storage(run: &Run) -> (&str, &str) {
    let layer = &run.report["enforcement"]["storage"];
    (
        layer["status"].as_str().unwrap(),
        layer["detail"].as_str().unwrap(),
    )
}

#[test]
fn a_gib_written_under_a_100m_budget_gets_enospc_and_the_disk_takes_at_most_the_budget() {
    let _turn = turn();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    make_world_accessible(dir.path());
    let before = free_bytes(dir.path());
    let run = exec(
        &[
            "--rw",
            &format!("{}:/out", path_str(dir.path())),
            "--max-write",
            "100M",
        ],
        &[
            "/bin/sh",
            "-c",
            "dd if=/dev/zero of=/out/big bs=1M count=1024; echo dd=$?",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    assert!(
        run.stderr.contains("No space left on device"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.contains("dd=1"), "{}", run.stdout);
    let (status, detail) = storage(&run);
    assert_eq!(status, "enforced", "{detail}");
    assert!(detail.contains("used up"), "{detail}");
    assert_eq!(run.report["writeBudgetReached"], true, "{}", run.report);
    let written = run.report["bytesWritten"].as_u64().unwrap();
    assert!(written <= BUDGET, "{written}");
    // What was written is on the host now, and no more than the budget.
    let size = std::fs::metadata(dir.path().join("big")).unwrap().len();
    assert!(size <= BUDGET && size > BUDGET / 2, "{size}");
    let after = free_bytes(dir.path());
    let dropped = before.saturating_sub(after);
    assert!(
        dropped <= BUDGET + (16 << 20),
        "the host's free space dropped by {dropped} bytes"
    );
    let finished = run.events_of("sandbox.exec.finished");
    assert_eq!(finished[0]["data"]["writeBudgetReached"], true);
}

/// The root before the program: a file to keep, one to change, one to
/// remove, a directory to replace, and a link to a host directory (which
/// the merge must never follow).
fn prepared_root(outside: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    make_world_accessible(dir.path());
    let p = dir.path();
    std::fs::write(p.join("keep.txt"), "keep\n").unwrap();
    std::fs::write(p.join("change.txt"), "old\n").unwrap();
    std::fs::write(p.join("remove.txt"), "gone\n").unwrap();
    std::fs::create_dir(p.join("replace")).unwrap();
    std::fs::write(p.join("replace/old.txt"), "old\n").unwrap();
    std::os::unix::fs::symlink(outside, p.join("link")).unwrap();
    dir
}

const CHANGES: &str = "echo new > /out/new.txt; echo more >> /out/change.txt; \
    rm /out/remove.txt; rm -r /out/replace; mkdir /out/replace; \
    echo fresh > /out/replace/fresh.txt; mkdir -p /out/deep/er; \
    echo x > /out/deep/er/x.sh; chmod 755 /out/deep/er/x.sh; \
    rm /out/link; mkdir /out/link; echo planted > /out/link/planted; \
    ln -s /etc/hostname /out/made-link; echo done";

fn assert_merged(root: &Path, outside: &Path) {
    let read = |name: &str| std::fs::read_to_string(root.join(name)).unwrap();
    assert_eq!(read("keep.txt"), "keep\n");
    assert_eq!(read("change.txt"), "old\nmore\n");
    assert_eq!(read("new.txt"), "new\n");
    assert!(!root.join("remove.txt").exists());
    assert!(!root.join("replace/old.txt").exists());
    assert_eq!(read("replace/fresh.txt"), "fresh\n");
    let x = std::fs::metadata(root.join("deep/er/x.sh")).unwrap();
    assert_eq!(x.permissions().mode() & 0o777, 0o755);
    // The link the program replaced with a directory: the directory is the
    // root's now, and the host directory the link pointed to got nothing.
    assert!(
        std::fs::symlink_metadata(root.join("link"))
            .unwrap()
            .is_dir()
    );
    assert_eq!(read("link/planted"), "planted\n");
    assert_eq!(std::fs::read_dir(outside).unwrap().count(), 0);
    assert_eq!(
        std::fs::read_link(root.join("made-link")).unwrap(),
        Path::new("/etc/hostname")
    );
    // Nothing of the merge's own is left.
    for entry in std::fs::read_dir(root).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(!name.to_string_lossy().starts_with(".moat"), "{name:?}");
    }
}

#[test]
fn what_the_program_wrote_reaches_its_root_and_nothing_else_as_root() {
    let _turn = turn();
    let outside = tempfile::tempdir().unwrap();
    let root = prepared_root(outside.path());
    let run = exec(
        &[
            "--rw",
            &format!("{}:/out", path_str(root.path())),
            "--max-write",
            "10M",
        ],
        &["/bin/sh", "-c", CHANGES],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    assert_eq!(storage(&run).0, "enforced", "{}", run.report);
    assert_ne!(run.report["writeBudgetReached"], true, "{}", run.report);
    assert_merged(root.path(), outside.path());
    // Files the program made belong to the root's owner, as without a budget.
    let owner = std::fs::metadata(root.path()).unwrap().uid();
    assert_eq!(
        std::fs::metadata(root.path().join("new.txt"))
            .unwrap()
            .uid(),
        owner
    );
}

#[test]
fn what_the_program_wrote_reaches_its_root_and_nothing_else_unprivileged() {
    let _turn = turn();
    let outside = tempfile::tempdir().unwrap();
    let root = prepared_root(outside.path());
    for entry in walkdir(root.path()) {
        let _ = std::os::unix::fs::lchown(&entry, Some(NOBODY), Some(NOBODY));
    }
    let run = exec_as(
        MOAT,
        &[
            "--rw",
            &format!("{}:/out", path_str(root.path())),
            "--max-write",
            "10M",
            "--without-cgroup-limits",
        ],
        &["/bin/sh", "-c", CHANGES],
        Some(NOBODY),
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    assert_eq!(storage(&run).0, "enforced", "{}", run.report);
    assert_merged(root.path(), outside.path());
}

fn walkdir(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let path = out[i].clone();
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                out.push(entry.unwrap().path());
            }
        }
        i += 1;
    }
    out
}

#[test]
fn a_budget_too_small_to_mean_anything_or_over_a_writable_file_is_refused() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    make_world_accessible(dir.path());
    let rw = format!("{}:/out", path_str(dir.path()));
    let run = exec(&["--rw", &rw, "--max-write", "0"], &["/bin/true"]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("max-write"), "{}", run.stderr);
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let run = exec(
        &[
            "--rw",
            &format!("{}:/f", path_str(&file)),
            "--max-write",
            "10M",
        ],
        &["/bin/true"],
    );
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("storage budget"), "{}", run.stderr);
    // And without a budget, the report says writable roots have none.
    let run = exec(&["--rw", &rw], &["/bin/true"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(storage(&run).0, "not_enforced", "{}", run.report);
}

/// A manifest's `limits.maxWriteBytes` budgets each operation's program
/// on a managed runner: past it, `ENOSPC`, and the result says so.
#[test]
fn a_manifests_max_write_bytes_budgets_a_managed_runs_programs() {
    let _turn = turn();
    use common::control::*;
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let setup = setup_with(dir.path(), |m| {
        m["limits"]["maxWriteBytes"] = json!(1 << 20);
    });
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let _runner = Runner::start(&serve, &setup, &acme, "runner-budget");
    let run = "run-budget";
    create_run(&serve, &acme, run);
    let (status, op) = post_op(
        &serve,
        &acme,
        run,
        envelope(
            "1",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c",
                "import sys\nf = open('output/big', 'wb', buffering=0)\n\
                 try:\n    [f.write(b'0' * 65536) for _ in range(80)]\n\
                 except OSError as e:\n    sys.exit(f'write: {e.strerror}')"]}),
        ),
    );
    assert_eq!(status, 200, "{op}");
    let result = &op["result"]["result"];
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{op}"
    );
    let storage = &result["enforcement"]["storage"];
    assert_eq!(storage["status"], "enforced", "{op}");
    assert!(
        storage["detail"].as_str().unwrap().contains("used up"),
        "{op}"
    );
    finish_run(&serve, &acme, run);
    // What it wrote is accounted with the run.
    let usage = wait_run_event(&serve, &acme, run, "run.usage");
    let written = usage["data"]["bytesWritten"].as_u64().unwrap_or(0);
    assert!((512 << 10..=1 << 20).contains(&written), "{usage}");
}

/// Hard links and sparse files cost the budget's tmpfs less than their
/// copies would cost the root: the merge counts what it writes and stops at
/// the budget.
#[test]
fn the_merge_writes_no_more_than_the_budget_whatever_the_program_arranged() {
    let _turn = turn();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    make_world_accessible(dir.path());
    let run = exec(
        &[
            "--rw",
            &format!("{}:/out", path_str(dir.path())),
            "--max-write",
            "8M",
        ],
        &[
            "/bin/sh",
            "-c",
            "dd if=/dev/zero of=/out/a bs=1M count=3 2>/dev/null; \
             for i in 1 2 3 4 5 6 7 8 9; do ln /out/a /out/a$i; done; \
             truncate -s 2G /out/sparse; echo made",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    assert!(run.stdout.contains("made"), "{}", run.stdout);
    let (status, detail) = storage(&run);
    assert_eq!(status, "degraded", "{detail}");
    assert!(detail.contains("over the budget"), "{detail}");
    let on_disk: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().blocks() * 512)
        .sum();
    assert!(on_disk <= 8 << 20, "the root holds {on_disk} bytes");
    // The 2 GiB sparse file is over the budget: left out, not written out.
    assert!(!dir.path().join("sparse").exists());
    // No temporary file of the merge's is left behind.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(!name.to_string_lossy().starts_with(".moat"), "{name:?}");
    }
    // And danger-full-access, where the host's root is writable, takes no budget.
    let run = exec(
        &["--mode", "danger-full-access", "--max-write", "8M"],
        &["/bin/true"],
    );
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("danger-full-access"), "{}", run.stderr);
}
