#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Runs per second through the whole stack on PostgreSQL: agents over HTTP
//! on loopback, control-plane replicas, four sealed runners on two hosts,
//! three orgs under a dedicated-host rule and a quota (the scale-out test's
//! plane, `tests/common/scaleout.rs`), with one replica and then with two.
//! Each figure is the second of two passes (the first warms the database
//! and the page cache). Beside each, where the CPU went: the share of the
//! machine's CPU time each part used (control planes, runners with the
//! shells and sandboxes they started, PostgreSQL, the agents), read from
//! /proc: the profile that says what saturates.
//!
//!   cargo bench --bench scaleout            (MOAT_SCALEOUT_RUNS, default 300)
//!
//! Writes target/bench/scaleout.json too. It needs PostgreSQL as the tests
//! do (tests/suite.sh starts one; MOAT_TEST_POSTGRES points at it).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use common::scaleout::{Plane, drive, wait_all_ended};
use serde_json::json;

/// CPU ticks (user + system, with reaped children) of process `pid`.
fn ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command (which may hold spaces), from field 3 on.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime, stime, cutime, cstime are fields 14..=17 (index 11..=14 here).
    fields.get(11..15).map_or(0, |f| f.iter().sum())
}

/// Ticks of every process whose command name is `name`.
fn ticks_named(name: &str) -> u64 {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .map(ticks)
        .sum()
}

/// The machine's busy ticks (all CPUs) from /proc/stat.
fn machine_busy() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cpu: Vec<u64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // All but idle (3) and iowait (4).
    cpu.iter().sum::<u64>() - cpu[3] - cpu[4]
}

/// PostgreSQL's own counters for the bench's database: transactions
/// committed, rows written, and events in the ledger.
fn db_counters(store: &moat_store::Store) -> (i64, i64, i64) {
    store
        .read(|tx| {
            let row = tx
                .query_one(
                    "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted AS written,
                        (SELECT COUNT(*) FROM events) AS events
                     FROM pg_stat_database WHERE datname = current_database()",
                    &[],
                )?
                .expect("pg_stat_database");
            Ok((
                row.int("xact_commit")?,
                row.int("written")?,
                row.int("events")?,
            ))
        })
        .unwrap()
}

struct Sample {
    serve: u64,
    runners: u64,
    postgres: u64,
    me: u64,
    busy: u64,
}

fn sample(plane: &Plane) -> Sample {
    Sample {
        serve: plane
            .replicas
            .iter()
            .filter_map(|s| s.child.as_ref())
            .map(|c| ticks(c.id()))
            .sum(),
        runners: plane.runners.iter().map(|r| ticks(r.child.id())).sum(),
        postgres: ticks_named("postgres"),
        me: ticks(std::process::id()),
        busy: machine_busy(),
    }
}

fn measure(replicas: usize, runs: usize) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let pg = moat_store::TempPostgres::create()
        .expect("PostgreSQL: run under tests/suite.sh's, or set MOAT_TEST_POSTGRES");
    let plane = Plane::start(dir.path(), &pg.url, replicas);
    let store = moat_store::Store::open(&pg.url).unwrap();
    let mut result = json!({});
    for pass in ["warm-up", "measured"] {
        // PostgreSQL flushes its statistics about once a second.
        std::thread::sleep(Duration::from_secs(2));
        let db_before = db_counters(&store);
        let before = sample(&plane);
        let outcome = drive(
            plane.urls(),
            &plane.tokens,
            runs,
            8,
            pass,
            Arc::new(AtomicUsize::new(0)),
        );
        wait_all_ended(&plane.urls(), &plane.tokens, &outcome);
        let after = sample(&plane);
        std::thread::sleep(Duration::from_secs(2));
        let db_after = db_counters(&store);
        let ops = (2 * runs) as f64;
        let per_op = |a: i64, b: i64| (((a - b) as f64 / ops) * 10.0).round() / 10.0;
        let busy = (after.busy - before.busy).max(1) as f64;
        let share = |a: u64, b: u64| ((a - b) as f64 / busy * 100.0).round();
        let secs = outcome.elapsed.as_secs_f64();
        result = json!({
            "replicas": replicas,
            "runs": runs,
            "seconds": (secs * 10.0).round() / 10.0,
            "runsPerSecond": ((runs as f64 / secs) * 100.0).round() / 100.0,
            "cpuShare": {
                "controlPlanes": share(after.serve, before.serve),
                "runnersAndSandboxes": share(after.runners, before.runners),
                "postgres": share(after.postgres, before.postgres),
                "agents": share(after.me, before.me),
            },
            "perOperation": {
                "transactions": per_op(db_after.0, db_before.0),
                "rowsWritten": per_op(db_after.1, db_before.1),
                "events": per_op(db_after.2, db_before.2),
            },
            "eventsPerSecond": (((db_after.2 - db_before.2) as f64 / secs) * 10.0).round() / 10.0,
            "machineBusy": ((busy / (outcome.elapsed.as_secs_f64() * 100.0 * cores())) * 100.0).round(),
        });
        eprintln!("scaleout: {replicas} replica(s), {pass}: {result}");
    }
    result
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

fn main() {
    let runs = std::env::var("MOAT_SCALEOUT_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let one = measure(1, runs);
    std::thread::sleep(Duration::from_secs(2));
    let two = measure(2, runs);
    let ratio = two["runsPerSecond"].as_f64().unwrap() / one["runsPerSecond"].as_f64().unwrap();
    let report = json!({
        "oneReplica": one,
        "twoReplicas": two,
        "ratio": (ratio * 100.0).round() / 100.0,
        "cores": cores(),
    });
    println!("{report:#}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("scaleout.json"), format!("{report:#}\n")).unwrap();
}
