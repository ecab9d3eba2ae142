#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Co-tenancy on one host: two orgs' sealed runners (acme, globex) serve
//! three runs at once, two of them side by side on acme's runner. Each
//! run's program gets a host uid/gid of its own, which its
//! `sandbox.exec.finished` event reports as enforced; a program that got out
//! of its sandbox (`escapee.py` on the host, as one run's uid) can neither
//! signal, trace nor inspect another run's program, read, list or write its
//! workspace, reach its sockets, nor enter its cgroup; from inside, each
//! program finds nothing of its neighbour (`tenant.py`). Afterwards no
//! process of those ids is left. Real `moat serve` (SQLite) and runners.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::control::*;
use common::cotenancy::*;
use common::{make_world_accessible, token};
use serde_json::{Value, json};

/// Both orgs may run python3 without network; nothing else.
const POLICY: &str = r#"
@id("tenants")
permit(principal, action == Moat::Action::"exec_argv",
       resource == Moat::Executable::"/usr/bin/python3")
when { context.network == "off"
       && (principal in Moat::Org::"acme" || principal in Moat::Org::"globex") };
"#;

/// One run's program, as the host sees it.
struct Tenant {
    run: &'static str,
    /// The API token of the run's org.
    org: String,
    tag: String,
    /// The run's workspace on the host, and its `output/` (the program's DIR).
    workspace: PathBuf,
    dir: PathBuf,
    port: u16,
}

/// Waits for `path`; a finished op meanwhile means the program never got there.
fn wait_file(path: &Path, op: &std::thread::ScopedJoinHandle<'_, (u16, Value)>) {
    wait_written(path, op, |path| path.exists());
}

/// As [`wait_file`], until `path` holds a whole JSON object: the tenant
/// writes it in place, so it exists before it is written.
fn wait_json(path: &Path, op: &std::thread::ScopedJoinHandle<'_, (u16, Value)>) -> Value {
    wait_written(path, op, |path| {
        std::fs::read_to_string(path).is_ok_and(|t| t.ends_with('}'))
    });
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Waits until `written(path)`, failing once `op` ended or after 90 s.
fn wait_written(
    path: &Path,
    op: &std::thread::ScopedJoinHandle<'_, (u16, Value)>,
    written: impl Fn(&Path) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !written(path) {
        let waited = if op.is_finished() {
            "the op ended"
        } else {
            "timed out"
        };
        assert!(
            !op.is_finished() && Instant::now() < deadline,
            "{waited} before {path:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Lets every program end (DIR/go, DIR/stop), also when an assertion fails.
struct Release<'a>(&'a [Tenant]);

impl Release<'_> {
    fn say(&self, word: &str) {
        for t in self.0 {
            let _ = std::fs::write(t.dir.join(word), "");
        }
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.say("go");
        self.say("stop");
    }
}

/// Creates `t`'s run and posts its program as one `exec_argv` op, which
/// blocks until the program ends: in a thread of `s`.
fn start<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    serve: &'s Serve,
    t: &'s Tenant,
    other: &Tenant,
) -> std::thread::ScopedJoinHandle<'s, (u16, Value)> {
    let runs = format!("{}/v1/runs", serve.url);
    let (status, body) = call("POST", &runs, &t.org, Some(json!({"id": t.run})));
    assert_eq!(status, 201, "{body}");
    let (port, other_port) = (t.port.to_string(), other.port.to_string());
    let dir = "/workspace/output";
    let argv = json!([
        PYTHON, "-c", TENANT, t.tag, dir, other.tag, port, other_port
    ]);
    let op = envelope("tenant", "exec_argv", json!({"argv": argv}));
    s.spawn(move || post_op(serve, &t.org, t.run, op))
}

/// What escapee.py tries against `target` (program `pid`), and the file it
/// would create if it could write there.
fn escapee_spec(target: &Tenant, pid: u32) -> (Value, PathBuf) {
    let planted = target.dir.join(format!("escapee-{}", token()));
    let spec = json!({
        "pids": [pid],
        "read": [target.dir.join(format!("{}.txt", target.tag))],
        "list": [target.dir, target.workspace],
        "write": [planted],
        "unix": [
            target.dir.join(format!("{}.sock", target.tag)),
            format!("/proc/{pid}/root/tmp/{}.sock", target.tag),
        ],
        "abstract": [format!("moat-{}", target.tag)],
        "cgroup": cgroup_files(pid),
    });
    (spec, planted)
}

/// The run's sandbox reported the host ids its program was seen with, as
/// its own (`hostIdentity` enforced).
fn assert_reported(serve: &Serve, t: &Tenant, (uid, gid): (u32, u32)) {
    let events = run_events(serve, &t.org, t.run);
    let finished: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "sandbox.exec.finished")
        .collect();
    assert_eq!(finished.len(), 1, "{events:#?}");
    let enforcement = &finished[0]["data"]["enforcement"];
    let reported = (&enforcement["hostUid"], &enforcement["hostGid"]);
    assert_eq!(
        reported,
        (&json!(uid), &json!(gid)),
        "{}: {enforcement}",
        t.run
    );
    let status = &enforcement["hostIdentity"]["status"];
    assert_eq!(status, "enforced", "{}: {enforcement}", t.run);
}

/// What tenant.py looks for from inside: every one must be refused.
const INSIDE: [&str; 7] = [
    "abstract",
    "tcp",
    "msgqueue",
    "shm",
    "otherFile",
    "otherSocket",
    "otherProcess",
];

#[test]
fn runs_of_two_orgs_on_one_host_cannot_reach_each_other() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    // Traversable by anyone: what keeps a run's uid out of another run's
    // workspace must be the runner's own `runs/` (0700), not this directory.
    make_world_accessible(dir.path());
    let setup = setup_with(dir.path(), |m| {
        m["policyHash"] = json!(sha256_hex(POLICY.as_bytes()));
        m["limits"]["timeoutMs"] = json!(120_000);
    });
    std::fs::write(&setup.policy, POLICY).unwrap();
    // SQLite alone (the URL `databases` gives it), without PostgreSQL: the
    // backend plays no part in what is checked here.
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");

    // One block for both runners: leases are host-wide, so two runners'
    // sandboxes never share an id either.
    let (base, range) = test_range(0, 64);
    let extra = ["--slots", "2", "--uid-range", range.as_str()];
    let orgs: Vec<(String, Runner)> = ["acme", "globex"]
        .into_iter()
        .map(|name| {
            let token = org(&serve, name);
            prepare_org(&serve, &setup, &token);
            let runner = format!("{name}-runner");
            (
                token.clone(),
                Runner::start_with(&serve, &setup, &token, &runner, &extra),
            )
        })
        .collect();
    let tenant = |run, (org, runner): &(String, Runner)| {
        let workspace = runner.state.join("runs").join(run);
        Tenant {
            run,
            org: org.clone(),
            tag: format!("{run}-{}", &token()[..8]),
            dir: workspace.join("output"),
            workspace,
            port: common::free_port(),
        }
    };
    let tenants = [
        tenant("a1", &orgs[0]),
        tenant("a2", &orgs[0]),
        tenant("g1", &orgs[1]),
    ];
    // Who probes whom: a1 → g1, a2 → a1, g1 → a1.
    let probes = [2, 0, 0];

    let ids = std::thread::scope(|s| {
        let release = Release(&tenants);
        let ops: Vec<_> = (0..3)
            .map(|i| start(s, &serve, &tenants[i], &tenants[probes[i]]))
            .collect();
        for (t, op) in tenants.iter().zip(&ops) {
            wait_file(&t.dir.join("ready"), op);
        }

        // 1. Three programs, three host identities of their own.
        let pids: Vec<u32> = tenants
            .iter()
            .map(|t| tenant_pid(&t.tag).unwrap())
            .collect();
        let ids: Vec<(u32, u32)> = pids.iter().map(|p| host_ids(*p)).collect();
        let uids: BTreeSet<u32> = ids.iter().map(|i| i.0).collect();
        let gids: BTreeSet<u32> = ids.iter().map(|i| i.1).collect();
        assert_eq!((uids.len(), gids.len()), (3, 3), "{ids:?}");
        for id in uids.iter().chain(&gids) {
            assert!(
                ![0, 65534].contains(id) && (base..base + 64).contains(id),
                "{ids:?}"
            );
        }

        // 2. An escaped program, with one run's ids, against another run.
        for (i, t) in tenants.iter().enumerate() {
            let target = &tenants[probes[i]];
            let (spec, planted) = escapee_spec(target, pids[probes[i]]);
            let attempts = escape(ids[i].0, &spec);
            let what = format!("{} → {}", t.run, target.run);
            assert_eq!(attempts.len(), 15, "{what}: {attempts:#?}");
            for a in &attempts {
                let outcome = a["outcome"].as_str().unwrap();
                assert!(outcome.starts_with("refused"), "{what}: {a}");
            }
            assert!(!planted.exists(), "{what}: created {}", planted.display());
        }
        // The escapee does reach what is its own: its run's program, and the
        // runner's state directory above `runs/`.
        let own = json!({"pids": [pids[0]], "list": [orgs[0].1.state]});
        let reached: BTreeSet<String> = escape(ids[0].0, &own)
            .iter()
            .filter(|a| a["outcome"] == "reached")
            .map(|a| a["attempt"].as_str().unwrap().to_owned())
            .collect();
        assert!(
            reached.contains("signal") && reached.contains("list"),
            "{reached:?}"
        );

        // 3. From inside, each program looks for its neighbour.
        release.say("go");
        for (t, op) in tenants.iter().zip(&ops) {
            let found = t.dir.join(format!("{}.json", t.tag));
            let found = wait_json(&found, op);
            for check in INSIDE {
                let outcome = found[check].as_str().unwrap_or("missing");
                assert!(outcome.starts_with("refused"), "{} {check}: {found}", t.run);
            }
        }
        release.say("stop");
        for ((t, op), id) in tenants.iter().zip(ops).zip(&ids) {
            let (status, op) = op.join().unwrap();
            let state = op["state"].as_str();
            assert_eq!((status, state), (200, Some("succeeded")), "{op}");
            assert_reported(&serve, t, *id);
        }
        ids
    });

    // The ops have ended: nothing that ran as the three identities is left.
    let held: Vec<u32> = ids.iter().flat_map(|(u, g)| [*u, *g]).collect();
    let left = tasks_holding(&held);
    assert!(left.is_empty(), "left running as {held:?}: {left:?}");
    eprintln!("co-tenancy checks took {:?}", started.elapsed());
}
