#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Prometheus metrics: a real Prometheus (Debian's, unpacked by
//! tests/suite.sh) scrapes a control plane's and a runner's `/metrics`
//! while a run waits in the queue, runs an operation whose program is
//! refused `ptrace`, finishes and is torn down; its queries then return
//! what happened.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::control::*;
use common::free_port;
use serde_json::Value;

fn prometheus_binary() -> PathBuf {
    let path = std::env::var_os("MOAT_TEST_PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("MOAT_TEST_PROMETHEUS is not set: run the suite with `bash tests/suite.sh`, which unpacks Debian's prometheus")
        });
    assert!(
        path.exists(),
        "MOAT_TEST_PROMETHEUS={} does not exist",
        path.display()
    );
    path
}

/// Prometheus, killed (by its pid) when dropped.
struct Prometheus {
    child: Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(dir: &Path, targets: &[(&str, u16)]) -> Prometheus {
        let mut config = String::from("global:\n  scrape_interval: 1s\nscrape_configs:\n");
        for (job, port) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
            ));
        }
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let port = free_port();
        let child = Command::new(prometheus_binary())
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("starting prometheus");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        // Refused connections until it listens.
        while ureq::get(&format!("{}/-/ready", p.url)).call().is_err() {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready in 30 s: {}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// The instant vector of `query`: (labels, value) per series.
    fn query(&self, query: &str) -> Vec<(Value, f64)> {
        let url = format!(
            "{}/api/v1/query?query={}",
            self.url,
            moat_core::url::encode_component(query)
        );
        let (status, body) = get_text(&url);
        assert_eq!(status, 200, "{query}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        body["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let value = r["value"][1].as_str().unwrap().parse::<f64>().unwrap();
                (r["metric"].clone(), value)
            })
            .collect()
    }

    /// Waits (scrapes come every second) until `query` has one series
    /// and `accept` takes its value; returns it.
    fn wait_for(&self, query: &str, accept: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.query(query);
            if let [(_, value)] = found.as_slice()
                && accept(*value)
            {
                return *value;
            }
            assert!(Instant::now() < deadline, "{query}: {found:?} after 30 s");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

#[test]
fn prometheus_scrapes_what_a_run_did_from_the_control_plane_and_its_runner() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let (plane_port, runner_port) = (free_port(), free_port());
    let serve = Serve::start_with(
        &setup,
        &db,
        "127.0.0.1:0",
        &["--metrics-listen", &format!("127.0.0.1:{plane_port}")],
    );
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let prometheus = Prometheus::start(
        dir.path(),
        &[("control", plane_port), ("runner", runner_port)],
    );

    // Queued, no runner yet.
    let run = "run-metrics";
    create_run(&serve, &acme, run);
    prometheus.wait_for(
        "moat_runs_queued{job=\"control\",environment=\"test\"}",
        |v| v == 1.0,
    );
    prometheus.wait_for("moat_approvals_pending{job=\"control\"}", |v| v == 0.0);

    let runner = Runner::start_with(
        &serve,
        &setup,
        &acme,
        "runner-metrics",
        &["--metrics-listen", &format!("127.0.0.1:{runner_port}")],
    );
    python_op(
        &serve,
        &acme,
        run,
        "1",
        "import ctypes; print(ctypes.CDLL(None).ptrace(0, 0, 0, 0))",
    );
    finish_run(&serve, &acme, run);
    wait_run_event(&serve, &acme, run, "run.destroyed");

    // The control plane, from its ledger.
    let plane = |q: &str| q.replace("JOB", "job=\"control\"");
    for (query, want) in [
        ("moat_runs_finished_total{JOB,outcome=\"succeeded\"}", 1.0),
        ("moat_ops_total{JOB,op=\"exec_argv\",status=\"ok\"}", 1.0),
        ("moat_teardowns_total{JOB,outcome=\"clean\"}", 1.0),
        ("moat_programs_total{JOB}", 1.0),
        ("moat_op_duration_seconds_count{JOB,op=\"exec_argv\"}", 1.0),
    ] {
        prometheus.wait_for(&plane(query), |v| v == want);
    }
    prometheus.wait_for(&plane("moat_program_cpu_seconds_total{JOB}"), |v| v > 0.0);
    // At least the ptrace (the report counts every refusal of the program).
    prometheus.wait_for(
        &plane("moat_violations_total{JOB,layer=\"seccomp\"}"),
        |v| v >= 1.0,
    );
    // The run left the queue: its environment's series is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !prometheus.query(&plane("moat_runs_queued{JOB}")).is_empty() {
        assert!(Instant::now() < deadline, "moat_runs_queued still reported");
        std::thread::sleep(Duration::from_millis(250));
    }

    // The runner, from what it did.
    let on_runner = |q: &str| q.replace("JOB", "job=\"runner\"");
    for (query, want) in [
        ("moat_ops_total{JOB,op=\"exec_argv\",status=\"ok\"}", 1.0),
        ("moat_teardowns_total{JOB,outcome=\"clean\"}", 1.0),
        ("moat_runs_active{JOB}", 0.0),
    ] {
        prometheus.wait_for(&on_runner(query), |v| v == want);
    }
    prometheus.wait_for(
        &on_runner("moat_violations_total{JOB,layer=\"seccomp\"}"),
        |v| v >= 1.0,
    );
    // A query across both: every teardown was clean.
    prometheus.wait_for("sum(moat_teardown_checks_failed_total) or vector(0)", |v| {
        v == 0.0
    });
    drop(runner);
    assert_ledger_intact(&serve);
}
