#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The managed path's speed, whole processes on loopback (release build),
//! on SQLite and on PostgreSQL:
//! - `artifact_read` end to end: agent → control plane (decision) → runner
//!   (capability check, shell, ledger) → result back to the agent
//!   (target: median under 5 ms);
//! - an approved operation's resume: from the approver's POST to the
//!   operation's result at the agent, execution included (target: the
//!   resume, which is part of it, under 50 ms);
//! - runs per second with 4 runners: create, claim, finish, recorded.
//!
//!   cargo bench --bench control      (PostgreSQL as for the tests: see tests/suite.sh)

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::control::*;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

/// Runs per measured batch in the throughput figure.
const BATCH: u64 = 40;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for db in databases(dir.path()) {
        let backend = if db.url.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        };
        let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let token = org(&serve, "acme");
        prepare_org(&serve, &setup, &token);
        let mut runners = vec![Runner::start(
            &serve,
            &setup,
            &token,
            &format!("{backend}-0"),
        )];
        let input = json!({"id": "bench", "inputs": [
            {"path": "input/data.txt", "content": "x".repeat(1024)},
            {"path": "input/sensitive/data.txt", "content": "y".repeat(1024)},
        ]});
        assert_eq!(
            call(
                "POST",
                &format!("{}/v1/runs", serve.url),
                &token,
                Some(input)
            )
            .0,
            201
        );
        let read = |id: String| {
            let (status, op) = post_op(
                &serve,
                &token,
                "bench",
                envelope(
                    &id,
                    "artifact_read",
                    json!({"path": "input/data.txt", "maxBytes": 4096}),
                ),
            );
            assert_eq!(
                (status, op["state"].as_str()),
                (200, Some("succeeded")),
                "{op}"
            );
        };
        read("warm".into());
        let mut n = 0u64;
        let mut group = c.benchmark_group("control plane");
        group
            .sample_size(50)
            .measurement_time(Duration::from_secs(10));
        group.bench_function(format!("artifact_read end to end ({backend})"), |b| {
            b.iter(|| {
                n += 1;
                read(format!("op-{n}"));
            })
        });
        // Each sample: an op that waits for approval, approved; timed from
        // the approval to the agent holding the result.
        group.bench_function(format!("approval to result ({backend})"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    let id = format!("approved-{n}");
                    let (status, pending) = call(
                        "POST",
                        &format!("{}/v1/runs/bench/ops", serve.url),
                        &token,
                        Some(envelope(
                            &id,
                            "artifact_read",
                            json!({"path": "input/sensitive/data.txt", "maxBytes": 4096}),
                        )),
                    );
                    assert_eq!(status, 202, "{pending}");
                    let approval = pending["approval"]["id"].as_str().unwrap().to_owned();
                    let start = Instant::now();
                    let (status, _) = call(
                        "POST",
                        &format!("{}/v1/approvals/{approval}/approve", serve.url),
                        &token,
                        Some(json!({})),
                    );
                    assert_eq!(status, 200);
                    let (_, op) = call(
                        "GET",
                        &format!("{}/v1/runs/bench/ops/{id}?wait_ms=10000", serve.url),
                        &token,
                        None,
                    );
                    total += start.elapsed();
                    assert_eq!(op["state"], "succeeded", "{op}");
                }
                total
            })
        });
        call(
            "POST",
            &format!("{}/v1/runs/bench/finish", serve.url),
            &token,
            None,
        );
        wait_state(&serve, &token, "bench", "succeeded");

        runners.extend(
            (1..4).map(|i| Runner::start(&serve, &setup, &token, &format!("{backend}-{i}"))),
        );
        let mut batch = 0u64;
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(20))
            .throughput(Throughput::Elements(BATCH));
        group.bench_function(format!("runs with 4 runners ({backend})"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    batch += 1;
                    let start = Instant::now();
                    for i in 0..BATCH {
                        let id = format!("b{batch}-{i}");
                        assert_eq!(
                            call(
                                "POST",
                                &format!("{}/v1/runs", serve.url),
                                &token,
                                Some(json!({"id": id}))
                            )
                            .0,
                            201
                        );
                        assert_eq!(
                            call(
                                "POST",
                                &format!("{}/v1/runs/{id}/finish", serve.url),
                                &token,
                                None
                            )
                            .0,
                            200
                        );
                    }
                    for i in 0..BATCH {
                        wait_state(&serve, &token, &format!("b{batch}-{i}"), "succeeded");
                    }
                    total += start.elapsed();
                }
                total
            })
        });
        group.finish();
        drop(runners);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
