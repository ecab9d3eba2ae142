#![allow(clippy::expect_used, clippy::unwrap_used)]
//! A runner's slots, through `moat up`'s whole stack (release build, control
//! plane on SQLite, one sealed runner, agents speaking HTTP on loopback):
//! - 4 agents, each running 25 `exec_argv /usr/bin/true` in a run of its
//!   own, on a runner with 4 slots, against one slot doing all 100 in one
//!   run (target: at most 0.6x; 0.5x is the floor on 2 cores);
//! - one `exec_argv /usr/bin/true` end to end, agent to result and back,
//!   with 4 slots (it must not regress from one slot).
//!
//!   cargo bench --bench slots

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::MOAT;
use common::control::call;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

/// A `moat up` of the bench's own, stopped (by pid) when dropped.
struct Up {
    child: Child,
    url: String,
    token: String,
    _dir: tempfile::TempDir,
}

impl Up {
    fn start(slots: u16) -> Up {
        let dir = tempfile::tempdir().unwrap();
        let listen = format!("127.0.0.1:{}", common::free_port());
        let mut child = Command::new(MOAT)
            .args(["up", "--listen", &listen, "--slots", &slots.to_string()])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        for line in stdout.lines() {
            if line.unwrap().starts_with("Stop with Ctrl-C") {
                break;
            }
        }
        let token = std::fs::read_to_string(dir.path().join("agent-token")).unwrap();
        Up {
            child,
            url: format!("http://{listen}"),
            token: token.trim().to_owned(),
            _dir: dir,
        }
    }

    fn new_run(&self, prefix: &str) -> String {
        let id = format!("{prefix}-{}", moat_core::random::new_id(""));
        let (status, body) = call(
            "POST",
            &format!("{}/v1/runs", self.url),
            &self.token,
            Some(json!({"id": id, "inputs": []})),
        );
        assert_eq!(status, 201, "{body}");
        id
    }

    /// One operation by the agent with HTTP client `client`, to its result.
    fn true_op(&self, client: &ureq::Agent, run: &str, n: usize) {
        let op =
            json!({"id": format!("t{n}"), "op": "exec_argv", "args": {"argv": ["/usr/bin/true"]}});
        let mut answer = client
            .post(&format!("{}/v1/runs/{run}/ops?wait_ms=30000", self.url))
            .header("authorization", &format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .send(op.to_string().as_bytes())
            .unwrap();
        let status = answer.status().as_u16();
        let body: Value =
            serde_json::from_slice(&answer.body_mut().read_to_vec().unwrap()).unwrap();
        assert_eq!(
            (status, &body["state"]),
            (200, &Value::from("succeeded")),
            "{body}"
        );
    }

    fn finish(&self, run: &str) {
        let (status, body) = call(
            "POST",
            &format!("{}/v1/runs/{run}/finish", self.url),
            &self.token,
            None,
        );
        assert_eq!(status, 200, "{body}");
    }

    /// `agents` agents side by side, each with `ops` operations in a run of
    /// its own; the time until the last result is in.
    fn batch(&self, agents: usize, ops: usize) -> Duration {
        let runs: Vec<String> = (0..agents).map(|_| self.new_run("bench")).collect();
        let start = Instant::now();
        std::thread::scope(|scope| {
            for run in &runs {
                // Each agent is a client of its own, with its own connection.
                scope.spawn(move || {
                    let client = client();
                    for n in 0..ops {
                        self.true_op(&client, run, n);
                    }
                });
            }
        });
        let took = start.elapsed();
        for run in &runs {
            self.finish(run);
        }
        took
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// Times `up.batch(agents, ops)` under criterion; every batch's time.
fn batches(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    up: &Up,
    agents: usize,
    ops: usize,
) -> Vec<Duration> {
    let mut times = Vec::new();
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let took = up.batch(agents, ops);
                times.push(took);
                total += took;
            }
            total
        })
    });
    times
}

fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn bench(c: &mut Criterion) {
    let one = Up::start(1);
    let four = Up::start(4);
    // Warm both stacks (first sandbox, first shell, page cache).
    one.batch(1, 5);
    four.batch(4, 5);

    let mut group = c.benchmark_group("slots");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(60));
    let serial = batches(&mut group, "1 slot, 1 agent x 100 exec_argv", &one, 1, 100);
    let parallel = batches(&mut group, "4 slots, 4 agents x 25 exec_argv", &four, 4, 25);
    group.finish();

    let mut group = c.benchmark_group("slots latency");
    group
        .sample_size(50)
        .measurement_time(Duration::from_secs(10));
    let mut latency = |name: &str, up: &Up| {
        let run = up.new_run("latency");
        let client = client();
        let mut n = 0;
        let mut times = Vec::new();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    n += 1;
                    let one_op = Instant::now();
                    up.true_op(&client, &run, n);
                    times.push(one_op.elapsed());
                }
                start.elapsed()
            })
        });
        up.finish(&run);
        median(times)
    };
    let latency_one = latency("exec_argv /usr/bin/true, 1 slot", &one);
    let latency_four = latency("exec_argv /usr/bin/true, 4 slots", &four);
    group.finish();

    let (serial, parallel) = (median(serial), median(parallel));
    println!(
        "\nslots: 100 exec_argv /usr/bin/true: one slot {:.0} ms; 4 agents on 4 slots {:.0} ms: {:.2}x (target <= 0.6x)",
        serial.as_secs_f64() * 1e3,
        parallel.as_secs_f64() * 1e3,
        parallel.as_secs_f64() / serial.as_secs_f64()
    );
    println!(
        "slots: one exec_argv end to end: {:.2} ms with 1 slot, {:.2} ms with 4 slots ({:.2}x)",
        latency_one.as_secs_f64() * 1e3,
        latency_four.as_secs_f64() * 1e3,
        latency_four.as_secs_f64() / latency_one.as_secs_f64()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
