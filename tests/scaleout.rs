#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The scale-out proof, on this machine over loopback: control-plane
//! replicas on one database, four sealed runners on two hosts, three orgs
//! under a dedicated-host rule and a quota, agents creating runs of two
//! operations each; midway one replica and one runner are killed -9 and
//! restarted. Afterwards, from the database and the ledger: every run
//! ended exactly once, no operation ran twice, every acknowledged
//! operation has its result, no placement rule or quota was broken, and
//! the hash chain verifies. (Throughput: `cargo bench --bench scaleout`.)

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::control::databases;
use common::scaleout::{Plane, check_invariants, drive, wait_all_ended};

/// Drives `runs` runs from `agents` agents; once half are done, kills -9
/// replica 0 (when there are two) and the runner of globex on host-2, then
/// restarts both.
fn scale_out(db: &str, dir: &std::path::Path, replicas: usize, runs: usize, agents: usize) {
    let mut plane = Plane::start(dir, db, replicas);
    let urls = plane.urls();
    let done = Arc::new(AtomicUsize::new(0));
    let outcome = std::thread::scope(|scope| {
        let tokens = plane.tokens.clone();
        let counter = Arc::clone(&done);
        let load = scope.spawn(move || drive(urls, &tokens, runs, agents, "so", counter));
        let deadline = Instant::now() + Duration::from_secs(900);
        while done.load(Ordering::SeqCst) < runs / 2 {
            assert!(Instant::now() < deadline, "the load stalled at {done:?}");
            if load.is_finished() {
                // An agent failed: its panic is the test's.
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if replicas > 1 {
            plane.replicas[0].child.as_mut().unwrap().kill().unwrap();
            plane.replicas[0].child.as_mut().unwrap().wait().unwrap();
        }
        // Dropped before its successor starts: a Runner's drop kills every
        // process whose command line names its state directory.
        drop(plane.runners.remove(2));
        eprintln!(
            "scale-out: killed -9 at {} runs done",
            done.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_secs(1));
        if replicas > 1 {
            plane.restart_replica(0);
        }
        let again = plane.start_runner(2);
        plane.runners.insert(2, again);
        load.join().unwrap()
    });
    eprintln!(
        "scale-out: {} runs, {} operations acknowledged, in {:?}",
        outcome.runs.len(),
        outcome.acknowledged.len(),
        outcome.elapsed
    );
    assert_eq!(outcome.runs.len(), runs);
    let urls = plane.urls();
    wait_all_ended(&urls, &plane.tokens, &outcome);
    check_invariants(db, &urls, &plane.tokens, &outcome);
}

#[test]
fn two_replicas_on_postgresql_serve_a_thousand_runs_through_failures() {
    let dir = tempfile::tempdir().unwrap();
    let dbs = databases(dir.path());
    let pg = dbs.iter().find(|d| !d.url.starts_with("sqlite:")).unwrap();
    scale_out(&pg.url, dir.path(), 2, 1000, 8);
}

#[test]
fn one_replica_on_sqlite_serves_runs_through_a_runner_failure() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    scale_out(&db, dir.path(), 1, 120, 4);
}
