#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Every sandbox launched by root runs as a host uid/gid of its own, from a
//! block reserved for Moat, held for exactly as long as anything of the
//! sandbox lives. Tested from the host on real processes:
//! - two concurrent `moat exec` runs hold different ids, and a process with
//!   one run's ids on the host (standing in for an escape) can neither signal,
//!   ptrace nor read the other's processes, nor reach its workspace, sockets
//!   or cgroup; from inside, neither run sees the other's processes, files,
//!   network or IPC;
//! - unprivileged, both runs keep the launching user's ids and the report
//!   says that runs are not separated by host identity;
//! - 1,000 sandboxes, 8 at a time, never share a live uid and leave no id
//!   held;
//! - a launcher killed mid-run leaves its id held until nothing of it is
//!   left, checked on the host.
//!
//! How the host's block is recorded in /etc/subuid and /etc/subgid is
//! tests/subid.rs.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::cotenancy::*;
use common::*;
use serde_json::{Value, json};

const SLOTS: &str = "/run/moat/hostids";

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One tenant: `moat exec` running tenant.py over a workspace of its own.
struct Tenant {
    tag: String,
    workspace: tempfile::TempDir,
    /// Report and events (outside the workspace, which the program writes).
    records: tempfile::TempDir,
    child: Child,
}

impl Tenant {
    /// `tag` listens on `port`; its neighbour is `other.0`, on `other.1`.
    fn start(
        tag: &str,
        port: u16,
        other: (&str, u16),
        range: &str,
        as_user: Option<u32>,
    ) -> Tenant {
        // Private, as the runner makes a run's workspace: what keeps another
        // uid out is the directory's mode, with separate ids to make it count.
        let workspace = tempfile::Builder::new()
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .unwrap();
        let records = tempfile::tempdir().unwrap();
        if let Some(uid) = as_user {
            for dir in [workspace.path(), records.path()] {
                std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
            }
        }
        let mut command = command_as(MOAT, as_user);
        command
            .args([
                "exec",
                "--timeout",
                "2m",
                "--uid-range",
                range,
                "--workspace",
            ])
            .arg(workspace.path())
            .args(["--env", &format!("TENANT_SECRET=secret-of-{tag}")])
            .arg("--report")
            .arg(records.path().join("report.json"))
            .arg("--events")
            .arg(records.path().join("events.jsonl"));
        if as_user.is_some() {
            command.arg("--allow-degraded");
        }
        let child = command
            .args([
                "--",
                "/usr/bin/python3",
                "-c",
                TENANT,
                tag,
                "/workspace",
                other.0,
            ])
            .args([port.to_string(), other.1.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Tenant {
            tag: tag.to_owned(),
            workspace,
            records,
            child,
        }
    }

    fn dir(&self) -> &Path {
        self.workspace.path()
    }

    fn wait_ready(&self) -> u32 {
        wait_until(
            &format!("tenant {} ready", self.tag),
            Duration::from_secs(60),
            || self.dir().join("ready").exists(),
        );
        tenant_pid(&self.tag).expect("the tenant's program on the host")
    }

    /// Lets the program look for its neighbour; returns what it found.
    fn look_around(&self) -> Value {
        std::fs::write(self.dir().join("go"), "").unwrap();
        let found = self.dir().join(format!("{}.json", self.tag));
        wait_until("the tenant's findings", Duration::from_secs(60), || {
            std::fs::read_to_string(&found).is_ok_and(|t| t.ends_with('}'))
        });
        serde_json::from_str(&std::fs::read_to_string(found).unwrap()).unwrap()
    }

    /// Ends the program; returns the run's report and events.
    fn finish(mut self) -> (Value, Vec<Value>) {
        std::fs::write(self.dir().join("stop"), "").unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "tenant {} exited {status}", self.tag);
        let report = std::fs::read_to_string(self.records.path().join("report.json")).unwrap();
        let events = std::fs::read_to_string(self.records.path().join("events.jsonl")).unwrap();
        (
            serde_json::from_str(&report).unwrap(),
            events
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
        )
    }
}

/// What the escapee tries against `victim` (its program runs as `pid`).
fn attack_on(victim: &Tenant, pid: u32, planted: &Path) -> Value {
    let dir = victim.dir();
    let tag = &victim.tag;
    json!({
        "pids": [pid],
        "read": [dir.join(format!("{tag}.txt"))],
        "list": [dir],
        "write": [planted],
        "unix": [dir.join(format!("{tag}.sock")), format!("/proc/{pid}/root/tmp/{tag}.sock")],
        "abstract": [format!("moat-{tag}")],
        "cgroup": cgroup_files(pid),
    })
}

fn two_tenants(range: &str, as_user: Option<u32>) -> (Tenant, Tenant) {
    let (pa, pb) = (free_port(), free_port());
    let a = format!("a{}", token());
    let b = format!("b{}", token());
    let first = Tenant::start(&a, pa, (&b, pb), range, as_user);
    let second = Tenant::start(&b, pb, (&a, pa), range, as_user);
    (first, second)
}

#[test]
fn concurrent_runs_hold_different_host_ids_and_an_escapee_of_one_cannot_reach_the_other() {
    let (base, range) = test_range(0, 16);
    let (a, b) = two_tenants(&range, None);
    let (pid_a, pid_b) = (a.wait_ready(), b.wait_ready());
    let (ids_a, ids_b) = (host_ids(pid_a), host_ids(pid_b));
    let (uid_a, uid_b) = (ids_a.0, ids_b.0);
    for (uid, gid) in [ids_a, ids_b] {
        assert_eq!(uid, gid, "uid and gid are one id");
        assert!((base..base + 16).contains(&uid), "{uid} not in {range}");
    }
    assert_ne!(uid_a, uid_b, "two live sandboxes share host uid {uid_a}");

    // Each stands in for an escape from the other, in both directions.
    for (id, victim, pid) in [(uid_a, &b, pid_b), (uid_b, &a, pid_a)] {
        let planted = victim.dir().join(format!("planted-{}", token()));
        let attempts = escape(id, &attack_on(victim, pid, &planted));
        assert_all_refused(
            &format!("uid {id} against {}", victim.tag),
            &json!(attempts),
        );
        assert!(
            !planted.exists(),
            "the escapee created {}",
            planted.display()
        );
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "the victim's program is still alive"
        );
    }

    // From inside, neither sees the other.
    for tenant in [&a, &b] {
        let found = tenant.look_around();
        assert_all_refused(&format!("inside {}", tenant.tag), &found);
    }
    for (tenant, uid) in [(a, uid_a), (b, uid_b)] {
        let tag = tenant.tag.clone();
        let (report, events) = tenant.finish();
        let e = &report["enforcement"];
        assert_eq!(e["hostUid"], uid, "{tag}: {e}");
        assert_eq!(e["hostGid"], uid, "{tag}: {e}");
        assert_eq!(e["hostIdentity"]["status"], "enforced", "{tag}: {e}");
        let finished: Vec<&Value> = events
            .iter()
            .filter(|ev| ev["type"] == "sandbox.exec.finished")
            .collect();
        assert_eq!(finished.len(), 1);
        assert_eq!(finished[0]["data"]["enforcement"]["hostUid"], uid);
        wait_until(
            "the run's processes to end",
            Duration::from_secs(10),
            || tasks_holding(&[uid]).is_empty(),
        );
        let slot = std::fs::read_to_string(format!("{SLOTS}/{uid}")).unwrap();
        assert_eq!(slot.trim_end(), "free", "{tag}'s id was not given back");
    }
}

#[test]
fn unprivileged_runs_keep_the_users_id_and_the_report_says_runs_are_not_separated_by_it() {
    let (_, range) = test_range(1, 16);
    let (a, b) = two_tenants(&range, Some(65534));
    let (pid_a, pid_b) = (a.wait_ready(), b.wait_ready());
    assert_eq!(host_ids(pid_a), (65534, 65534));
    assert_eq!(host_ids(pid_b), (65534, 65534));
    // The namespaces still keep them apart from inside.
    for tenant in [&a, &b] {
        let found = tenant.look_around();
        assert_all_refused(&format!("inside {}", tenant.tag), &found);
    }
    for tenant in [a, b] {
        let (report, _) = tenant.finish();
        let e = &report["enforcement"];
        assert_eq!(e["hostUid"], 65534, "{e}");
        assert_eq!(e["hostIdentity"]["status"], "not_enforced", "{e}");
        let detail = e["hostIdentity"]["detail"].as_str().unwrap();
        assert!(
            detail.contains("not separated by host identity"),
            "{detail}"
        );
    }
}

/// Samples the host: every task whose uid is in `base..base+count`, by pid
/// namespace. Two pid namespaces (two sandboxes) with one uid at once is
/// sharing; a sighting is confirmed by reading both tasks again.
fn sample_sharing(base: u32, count: u32) -> Option<String> {
    let mut by_uid: BTreeMap<u32, Vec<(u32, String)>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let (uids, _) = ids_in(&entry.path().join("status"));
        let Some(&uid) = uids.iter().find(|u| (base..base + count).contains(u)) else {
            continue;
        };
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/pid")) else {
            continue;
        };
        by_uid
            .entry(uid)
            .or_default()
            .push((pid, ns.to_string_lossy().into_owned()));
    }
    for (uid, tasks) in by_uid {
        let namespaces: BTreeSet<&String> = tasks.iter().map(|(_, ns)| ns).collect();
        if namespaces.len() < 2 {
            continue;
        }
        // Read again: both still alive with that uid at once is sharing.
        let still: Vec<&(u32, String)> = tasks
            .iter()
            .filter(|(pid, ns)| {
                ids_in(Path::new(&format!("/proc/{pid}/status")))
                    .0
                    .contains(&uid)
                    && std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                        .is_ok_and(|now| now.to_string_lossy() == ns.as_str())
            })
            .collect();
        let live: BTreeSet<&String> = still.iter().map(|(_, ns)| ns).collect();
        if live.len() > 1 {
            return Some(format!("uid {uid} held by {still:?}"));
        }
    }
    None
}

#[test]
fn a_thousand_sandboxes_eight_at_a_time_never_share_a_live_uid_and_leave_none_held() {
    const RUNS: usize = 1000;
    const AT_ONCE: usize = 8;
    let count = 64;
    let (base, range) = test_range(2, count);
    let done = std::sync::atomic::AtomicBool::new(false);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (sharing, reports) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut seen = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if let Some(found) = sample_sharing(base, count) {
                    seen.push(found);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            seen
        });
        let workers: Vec<_> = (0..AT_ONCE)
            .map(|_| {
                scope.spawn(|| {
                    let mut reports = Vec::new();
                    while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < RUNS {
                        let out = Command::new(MOAT)
                            .args(["exec", "--json", "--uid-range", &range, "--"])
                            .args(["/bin/sh", "-c", "sleep 0.02"])
                            .stdin(Stdio::null())
                            .output()
                            .unwrap();
                        assert!(
                            out.status.success(),
                            "{}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
                        reports.push(doc["report"]["enforcement"].clone());
                    }
                    reports
                })
            })
            .collect();
        let reports: Vec<Value> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        (sampler.join().unwrap(), reports)
    });
    assert!(
        sharing.is_empty(),
        "live sandboxes shared a uid: {sharing:?}"
    );
    assert_eq!(reports.len(), RUNS);
    let mut used = BTreeSet::new();
    for e in &reports {
        assert_eq!(e["hostIdentity"]["status"], "enforced", "{e}");
        let uid = e["hostUid"].as_u64().unwrap() as u32;
        assert!((base..base + count).contains(&uid), "{e}");
        used.insert(uid);
    }
    assert!(used.len() > 1, "8 at once used one id: {used:?}");
    // Nothing is left held: every slot the runs used says free, and no task
    // holds any id of the block.
    for uid in base..base + count {
        let slot = Path::new(SLOTS).join(uid.to_string());
        if used.contains(&uid) {
            let text = std::fs::read_to_string(&slot).unwrap();
            assert_eq!(text.trim_end(), "free", "{uid}");
        }
        assert!(tasks_holding(&[uid]).is_empty(), "uid {uid} still held");
    }
}

fn exec_in_range(range: &str, program: &[&str]) -> (Output, PathBuf, tempfile::TempDir) {
    let records = tempfile::tempdir().unwrap();
    let events = records.path().join("events.jsonl");
    let out = Command::new(MOAT)
        .args(["exec", "--uid-range", range, "--events"])
        .arg(&events)
        .arg("--")
        .args(program)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out, events, records)
}

/// The run was refused before it started (exit 125) for a reason that says
/// `says`, on stderr and in its one `sandbox.exec.denied` event.
fn assert_refused(out: &Output, events: &Path, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
    let events = std::fs::read_to_string(events).unwrap();
    let denied: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "sandbox.exec.denied")
        .collect();
    assert_eq!(denied.len(), 1, "{events}");
    let reason = denied[0]["data"]["reason"].as_str().unwrap();
    assert!(reason.contains(says), "{reason}");
}

#[test]
fn a_killed_launchers_id_is_taken_again_only_once_nothing_of_it_is_left() {
    let (base, range) = test_range(3, 1);
    let slot = Path::new(SLOTS).join(base.to_string());
    let mut launcher = Command::new(MOAT)
        .args(["exec", "--uid-range", &range, "--", "/bin/sleep", "60"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the sandbox to run", Duration::from_secs(30), || {
        !tasks_holding(&[base]).is_empty()
    });
    assert!(
        std::fs::read_to_string(&slot)
            .unwrap()
            .starts_with("held by pid")
    );

    // While it runs, its one id is taken.
    let (busy, _, _) = exec_in_range(&range, &["/bin/true"]);
    assert_eq!(busy.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&busy.stderr).contains("1 held by running sandboxes"),
        "{}",
        String::from_utf8_lossy(&busy.stderr)
    );

    launcher.kill().unwrap();
    launcher.wait().unwrap();
    wait_until(
        "the killed run's processes to end",
        Duration::from_secs(30),
        || tasks_holding(&[base]).is_empty(),
    );
    assert!(
        std::fs::read_to_string(&slot)
            .unwrap()
            .starts_with("held by pid")
    );

    // Something of that id is still alive on the host (standing in for a
    // process of the killed run that outlived it): the id is not taken.
    let mut lingering = Command::new("setpriv")
        .args([
            &format!("--reuid={base}"),
            &format!("--regid={base}"),
            "--clear-groups",
        ])
        .args(["/bin/sleep", "60"])
        .spawn()
        .unwrap();
    wait_until("the lingering process", Duration::from_secs(10), || {
        pids_holding(&[base]).contains(&lingering.id())
    });
    let (refused, events, _records) = exec_in_range(&range, &["/bin/true"]);
    assert_refused(&refused, &events, "1 still owning a process");
    assert_eq!(
        pids_holding(&[base]),
        BTreeSet::from([lingering.id()]),
        "the refused run started something"
    );

    // Once nothing of it is left, the id is reclaimed.
    lingering.kill().unwrap();
    lingering.wait().unwrap();
    let (ok, _, _) = exec_in_range(&range, &["/bin/true"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(std::fs::read_to_string(&slot).unwrap().trim_end(), "free");
}

#[test]
fn a_bad_uid_range_is_refused_before_anything_runs() {
    // Malformed: a usage error (2), before any run exists.
    for (range, says) in [
        ("0:100", "root"),
        ("65000:1000", "nobody"),
        ("12:0", "at least one id"),
        ("abc", "BASE:COUNT"),
    ] {
        let (out, _, _) = exec_in_range(range, &["/bin/true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{range}: {stderr}");
        assert!(stderr.contains(says), "{range}: {stderr}");
    }
    // Claimed by something else: the run is refused in its user-mapping
    // layer (125), recorded as a denial, and no id of it was taken.
    for (range, first, says) in [
        ("1:2", 1, "/etc/passwd"),
        ("61184:10", 61184, "systemd's dynamic users"),
        ("1000000:10", 1000000, "systemd-nspawn's container range"),
    ] {
        let (out, events, _records) = exec_in_range(range, &["/bin/true"]);
        assert_refused(&out, &events, says);
        let slot = Path::new(SLOTS).join(first.to_string());
        assert!(!slot.exists(), "{range}: a slot was taken");
    }
}
