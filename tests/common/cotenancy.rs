//! Host-side views of co-tenant sandboxes: which host ids a program runs
//! as, which tasks hold an id, a run's cgroup files, and `escapee.py`, the
//! stand-in for a program that got out of its sandbox.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// One tenant's program (`tests/hostid/tenant.py`).
pub const TENANT: &str = include_str!("../hostid/tenant.py");
const ESCAPEE: &str = include_str!("../hostid/escapee.py");
pub const PYTHON: &str = "/usr/bin/python3";
pub const SETPRIV: &str = "/usr/bin/setpriv";

/// A block of `count` ids of the calling test's own: test number `index`
/// (each test of a binary its own, as they run at once) gets a region of
/// 2^20 ids from `0x7300_0000`, away from Moat's default block and from the
/// suite's, and a random 256-id block in it.
pub fn test_range(index: u32, count: u32) -> (u32, String) {
    assert!(count <= 256 && index < 16);
    let pick = u32::from_str_radix(&super::token()[..4], 16).unwrap() % 4096;
    let base = 0x7300_0000 + (index << 20) + pick * 256;
    (base, format!("{base}:{count}"))
}

/// The host pid of the tenant program tagged `tag` (its argv[3]).
pub fn tenant_pid(tag: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let hit = argv.len() > 3 && argv[0].ends_with(b"python3") && argv[3] == tag.as_bytes();
        hit.then(|| e.file_name().to_str()?.parse().ok()).flatten()
    })
}

/// The uids and gids (real, effective, saved, filesystem) in a task's
/// status file; empty once the task is gone.
pub fn ids_in(status: &Path) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let text = std::fs::read_to_string(status).unwrap_or_default();
    let ids = |key| -> BTreeSet<u32> {
        let line = text.lines().find_map(|l| l.strip_prefix(key));
        line.into_iter()
            .flat_map(str::split_whitespace)
            .map(|f| f.parse().unwrap())
            .collect()
    };
    (ids("Uid:"), ids("Gid:"))
}

/// `pid`'s one host uid and gid (all four of each agree).
pub fn host_ids(pid: u32) -> (u32, u32) {
    let (uids, gids) = ids_in(Path::new(&format!("/proc/{pid}/status")));
    assert_eq!(
        (uids.len(), gids.len()),
        (1, 1),
        "pid {pid}: {uids:?} {gids:?}"
    );
    (*uids.first().unwrap(), *gids.first().unwrap())
}

/// Tasks anywhere on the host holding one of `ids` as a uid or gid.
pub fn tasks_holding(ids: &[u32]) -> Vec<PathBuf> {
    let procs = std::fs::read_dir("/proc").unwrap().flatten();
    let tasks = procs.flat_map(|p| {
        std::fs::read_dir(p.path().join("task"))
            .into_iter()
            .flatten()
            .flatten()
    });
    tasks
        .map(|t| t.path())
        .filter(|t| {
            let (uids, gids) = ids_in(&t.join("status"));
            uids.iter().chain(&gids).any(|id| ids.contains(id))
        })
        .collect()
}

/// The processes those tasks belong to.
pub fn pids_holding(ids: &[u32]) -> BTreeSet<u32> {
    tasks_holding(ids)
        .iter()
        .filter_map(|t| t.components().nth(2)?.as_os_str().to_str()?.parse().ok())
        .collect()
}

/// `pid`'s memory cgroup: its `cgroup.procs` and memory limit file.
pub fn cgroup_files(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let v1 = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':').skip(1);
        let (controllers, path) = (f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_owned())
    });
    let (dir, limit) = match v1 {
        Some(path) => (
            Path::new("/sys/fs/cgroup/memory").join(&path[1..]),
            "memory.limit_in_bytes",
        ),
        None => {
            let path = text.lines().find_map(|l| l.strip_prefix("0::/")).unwrap();
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let mount = mountinfo
                .lines()
                .find(|l| l.contains(" - cgroup2 "))
                .unwrap();
            (
                Path::new(mount.split(' ').nth(4).unwrap()).join(path),
                "memory.max",
            )
        }
    };
    let files = vec![dir.join("cgroup.procs"), dir.join(limit)];
    for file in &files {
        assert!(
            file.exists(),
            "pid {pid}'s cgroup file {} is missing",
            file.display()
        );
    }
    files
}

/// Runs escapee.py on the host as uid and gid `id` against `spec`: its
/// attempts, each `{"attempt", "target", "outcome"}`.
pub fn escape(id: u32, spec: &Value) -> Vec<Value> {
    for tool in [SETPRIV, PYTHON] {
        assert!(Path::new(tool).exists(), "{tool} is needed for this test");
    }
    let out = Command::new(SETPRIV)
        .args([
            format!("--reuid={id}"),
            format!("--regid={id}"),
            "--clear-groups".into(),
        ])
        .args([PYTHON, "-c", ESCAPEE, &spec.to_string()])
        .current_dir("/")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "escapee as {id}: {stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every attempt (escapee.py's list, or the fields of tenant.py's findings)
/// was refused.
pub fn assert_all_refused(what: &str, found: &Value) {
    let entries: Vec<(String, &Value)> = match found {
        Value::Array(items) => items
            .iter()
            .map(|a| (format!("{} {}", a["attempt"], a["target"]), &a["outcome"]))
            .collect(),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !["ownProcesses", "uid"].contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v))
            .collect(),
        other => panic!("{what}: {other}"),
    };
    assert!(!entries.is_empty(), "{what}: nothing was tried");
    for (attempt, outcome) in entries {
        assert!(
            outcome.as_str().is_some_and(|o| o.starts_with("refused")),
            "{what}: {attempt} was {outcome}"
        );
    }
}
