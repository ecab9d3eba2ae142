//! Prometheus metrics of a control plane or a runner.
//!
//! The control plane's are a function of its ledger: [`Metrics::observe`]
//! takes every batch of events the store committed, so a counter moves
//! whichever handler wrote the event, and only once it is recorded. A
//! runner has no ledger of its own to speak of; it calls
//! [`Metrics::op_finished`], [`Metrics::report`] and [`Metrics::teardown`]
//! as its operations end. Both serve the text format at `/metrics`
//! ([`Metrics::encode`]; [`serve`] for a process without an HTTP server).
//!
//! Counters are per process: with several replicas, Prometheus sums them.
//! Nothing secret goes in a label: environment names, operation kinds,
//! statuses, layers and teardown checks only.

mod serve;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use moat_core::{Event, EventType};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::Value;

pub use serve::{ServeError, serve};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpStatus {
    op: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpKind {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LayerLabel {
    layer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Check {
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Direction {
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EnvironmentLabel {
    environment: String,
}

type Seconds = Family<OpKind, Histogram, fn() -> Histogram>;

fn op_buckets() -> Histogram {
    // 1 ms to about 9 hours: a step that waits for a person is an operation too.
    Histogram::new(exponential_buckets(0.001, 4.0, 13))
}

/// Operations whose request was seen, for their kind and latency when they
/// end (bounded: an operation requested on another replica ends `unknown`).
const REMEMBERED_OPS: usize = 100_000;

/// One process's metrics.
pub struct Metrics {
    registry: Registry,
    runs_finished: Family<Outcome, Counter>,
    ops: Family<OpStatus, Counter>,
    op_seconds: Seconds,
    violations: Family<LayerLabel, Counter>,
    teardowns: Family<Outcome, Counter>,
    teardown_checks_failed: Family<Check, Counter>,
    programs: Counter,
    program_cpu_seconds: Counter<f64, AtomicU64>,
    program_wall_seconds: Counter<f64, AtomicU64>,
    egress_requests: Counter,
    egress_bytes: Family<Direction, Counter>,
    artifact_validation_failures: Family<RuleLabel, Counter>,
    runs_queued: Family<EnvironmentLabel, Gauge>,
    approvals_pending: Gauge,
    runs_active: Gauge,
    requested: Mutex<Requested>,
}

#[derive(Default)]
struct Requested {
    by_op: HashMap<(String, String), (String, Instant)>,
    order: VecDeque<(String, String)>,
}

/// Which process the metrics describe: each registers only what it fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    ControlPlane,
    Runner,
}

impl Metrics {
    pub fn new(role: Role) -> Metrics {
        let m = Metrics {
            registry: Registry::default(),
            runs_finished: Family::default(),
            ops: Family::default(),
            op_seconds: Family::new_with_constructor(op_buckets),
            violations: Family::default(),
            teardowns: Family::default(),
            teardown_checks_failed: Family::default(),
            programs: Counter::default(),
            program_cpu_seconds: Counter::default(),
            program_wall_seconds: Counter::default(),
            egress_requests: Counter::default(),
            egress_bytes: Family::default(),
            artifact_validation_failures: Family::default(),
            runs_queued: Family::default(),
            approvals_pending: Gauge::default(),
            runs_active: Gauge::default(),
            requested: Mutex::new(Requested::default()),
        };
        let mut registry = Registry::with_prefix("moat");
        registry.register(
            "ops",
            "Operations ended, by kind and status (ok, denied, error, timeout...)",
            m.ops.clone(),
        );
        registry.register(
            "op_duration_seconds",
            "From an operation's request to its end (approval waits included)",
            m.op_seconds.clone(),
        );
        registry.register(
            "violations",
            "Accesses the sandbox's layers refused (landlock, seccomp) and requests the egress \
             proxy refused (egress)",
            m.violations.clone(),
        );
        registry.register(
            "teardowns",
            "Runs torn down on a runner host: clean (nothing left) or unclean",
            m.teardowns.clone(),
        );
        registry.register(
            "teardown_checks_failed",
            "Teardown checks that found something left (processes, cgroups, mounts, files)",
            m.teardown_checks_failed.clone(),
        );
        match role {
            Role::ControlPlane => {
                registry.register(
                    "runs_finished",
                    "Runs ended, by outcome (succeeded, failed, cancelled, dead_lettered)",
                    m.runs_finished.clone(),
                );
                registry.register("programs", "Programs run in a sandbox", m.programs.clone());
                registry.register(
                    "program_cpu_seconds",
                    "CPU time (user and system) of sandboxed programs' whole trees",
                    m.program_cpu_seconds.clone(),
                );
                registry.register(
                    "program_wall_seconds",
                    "Wall-clock time of sandboxed programs",
                    m.program_wall_seconds.clone(),
                );
                registry.register(
                    "egress_requests",
                    "Requests through the egress proxy, allowed or not",
                    m.egress_requests.clone(),
                );
                registry.register(
                    "egress_bytes",
                    "Bytes through the egress proxy, by direction (out, in)",
                    m.egress_bytes.clone(),
                );
                registry.register(
                    "artifact_validation_failures",
                    "Files refused at the export boundary, by broken rule (a file counts once per rule)",
                    m.artifact_validation_failures.clone(),
                );
                registry.register(
                    "runs_queued",
                    "Runs waiting for a runner, by environment (at the scrape)",
                    m.runs_queued.clone(),
                );
                registry.register(
                    "approvals_pending",
                    "Approval requests nobody has decided yet (at the scrape)",
                    m.approvals_pending.clone(),
                );
            }
            Role::Runner => {
                registry.register(
                    "runs_active",
                    "Runs this runner is serving now",
                    m.runs_active.clone(),
                );
            }
        }
        Metrics { registry, ..m }
    }

    /// The text format Prometheus scrapes.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The control plane: what one committed batch of events says.
    pub fn observe(&self, events: &[Event]) {
        for event in events {
            self.observe_one(event);
        }
    }

    fn observe_one(&self, e: &Event) {
        let d = &e.data;
        let text = |key: &str| d[key].as_str().unwrap_or("unknown").to_owned();
        match e.event_type {
            EventType::RunFinished => self.count_run(&text("state")),
            EventType::RunDeadLettered => self.count_run("dead_lettered"),
            EventType::CapabilityRequested => {
                if let Some(op) = &e.op_id {
                    self.remember(&e.run_id, op, &text("op"));
                }
            }
            EventType::CapabilityDenied if d.get("runnerId").is_none() => {
                // Refused by the control plane's decision: the operation
                // ends here, with no op.finished.
                if let Some(op) = &e.op_id {
                    let kind = self.forget(&e.run_id, op).map(|(kind, _)| kind);
                    self.count_op(&kind.unwrap_or_else(|| text("op")), "denied", None);
                }
            }
            EventType::OpFinished => {
                if let Some(op) = &e.op_id {
                    let seen = self.forget(&e.run_id, op);
                    let (kind, since) = match seen {
                        Some((kind, at)) => (kind, Some(at.elapsed().as_secs_f64())),
                        None => ("unknown".to_owned(), None),
                    };
                    self.count_op(&kind, &text("status"), since);
                }
            }
            EventType::SandboxExecFinished => self.report(d),
            EventType::NetworkDenied => self.count_violations("egress", 1),
            EventType::ArtifactRejected => {
                let rules = moat_core::exports::RejectRule::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>();
                for reason in d["reasons"].as_array().into_iter().flatten() {
                    let rule = reason["rule"].as_str().unwrap_or("unknown");
                    self.artifact_validation_failures
                        .get_or_create(&RuleLabel {
                            rule: known(rule, &rules),
                        })
                        .inc();
                }
            }
            EventType::RunDestroyed => {
                let failed: Vec<String> = d["checks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["ok"] != true)
                    .filter_map(|c| c["check"].as_str().map(str::to_owned))
                    .collect();
                self.count_teardown(&failed);
            }
            EventType::RunUsage => {
                let n = |key: &str| d[key].as_u64().unwrap_or(0);
                self.programs.inc_by(n("programs"));
                self.program_cpu_seconds.inc_by(n("cpuMs") as f64 / 1000.0);
                self.program_wall_seconds
                    .inc_by(n("programWallMs") as f64 / 1000.0);
                self.egress_requests.inc_by(n("egressRequests"));
                for (direction, key) in [("out", "egressBytesOut"), ("in", "egressBytesIn")] {
                    self.egress_bytes
                        .get_or_create(&Direction {
                            direction: direction.into(),
                        })
                        .inc_by(n(key));
                }
            }
            _ => {}
        }
    }

    /// The refusals one sandbox report lists (`violations`, or the seccomp
    /// refusals of a report from before them).
    pub fn report(&self, report: &Value) {
        match report.get("violations").and_then(Value::as_array) {
            Some(listed) => {
                for v in listed {
                    let layer = v["layer"].as_str().unwrap_or("unknown");
                    self.count_violations(layer, v["count"].as_u64().unwrap_or(1));
                }
            }
            None => {
                for d in report["deniedSyscalls"].as_array().into_iter().flatten() {
                    self.count_violations("seccomp", d["count"].as_u64().unwrap_or(1));
                }
            }
        }
    }

    /// A runner: one operation ended.
    pub fn op_finished(&self, op: &str, status: &str, seconds: f64) {
        self.count_op(op, status, Some(seconds));
    }

    /// A runner: one run's teardown, with the checks that failed (by name).
    pub fn teardown(&self, failed: &[String]) {
        self.count_teardown(failed);
    }

    /// A runner: a run began (`+1`) or ended (`-1`) being served.
    pub fn run_active(&self, delta: i64) {
        self.runs_active.inc_by(delta);
    }

    /// The control plane, at a scrape: what waits now.
    pub fn set_waiting(&self, queued_runs: &[(String, u64)], pending_approvals: u64) {
        // Environments that emptied read 0 rather than their last count.
        self.runs_queued.clear();
        for (environment, n) in queued_runs {
            self.runs_queued
                .get_or_create(&EnvironmentLabel {
                    environment: environment.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.approvals_pending
            .set(i64::try_from(pending_approvals).unwrap_or(i64::MAX));
    }

    fn count_run(&self, outcome: &str) {
        self.runs_finished
            .get_or_create(&Outcome {
                outcome: known(
                    outcome,
                    &["succeeded", "failed", "cancelled", "dead_lettered"],
                ),
            })
            .inc();
    }

    fn count_op(&self, op: &str, status: &str, seconds: Option<f64>) {
        let op = if op == "unknown" || moat_core::OpKind::ALL.iter().any(|k| k.as_str() == op) {
            op.to_owned()
        } else {
            "other".to_owned()
        };
        self.ops
            .get_or_create(&OpStatus {
                op: op.clone(),
                status: known(status, &["ok", "denied", "error", "timeout"]),
            })
            .inc();
        if let Some(seconds) = seconds {
            self.op_seconds
                .get_or_create(&OpKind { op })
                .observe(seconds);
        }
    }

    fn count_violations(&self, layer: &str, count: u64) {
        self.violations
            .get_or_create(&LayerLabel {
                layer: known(layer, &["landlock", "seccomp", "egress"]),
            })
            .inc_by(count);
    }

    fn count_teardown(&self, failed: &[String]) {
        let outcome = if failed.is_empty() {
            "clean"
        } else {
            "unclean"
        };
        self.teardowns
            .get_or_create(&Outcome {
                outcome: outcome.into(),
            })
            .inc();
        for check in failed {
            self.teardown_checks_failed
                .get_or_create(&Check {
                    check: known(check, &["processes", "files", "mounts", "cgroups"]),
                })
                .inc();
        }
    }

    fn remember(&self, run: &str, op: &str, kind: &str) {
        let Ok(mut requested) = self.requested.lock() else {
            return;
        };
        let key = (run.to_owned(), op.to_owned());
        if requested
            .by_op
            .insert(key.clone(), (kind.to_owned(), Instant::now()))
            .is_none()
        {
            requested.order.push_back(key);
        }
        while requested.order.len() > REMEMBERED_OPS {
            if let Some(oldest) = requested.order.pop_front() {
                requested.by_op.remove(&oldest);
            }
        }
    }

    fn forget(&self, run: &str, op: &str) -> Option<(String, Instant)> {
        let mut requested = self.requested.lock().ok()?;
        // `order` keeps the key until it is the oldest: a lookup there is
        // what the bound costs, not each end.
        requested.by_op.remove(&(run.to_owned(), op.to_owned()))
    }
}

/// `value` if it is one of `names`, else `other`: label values come from
/// what runners report, and a family must not grow without bound.
fn known(value: &str, names: &[&str]) -> String {
    if names.contains(&value) {
        value.to_owned()
    } else {
        "other".to_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: EventType, op: Option<&str>, data: Value) -> Event {
        Event {
            event_type: kind,
            at: "2026-12-02T00:00:00.000Z".into(),
            run_id: "r1".into(),
            op_id: op.map(str::to_owned),
            correlation_id: None,
            data,
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn a_run_s_events_become_counters() {
        let m = Metrics::new(Role::ControlPlane);
        m.observe(&[
            event(
                EventType::CapabilityRequested,
                Some("a"),
                json!({"op": "exec_argv"}),
            ),
            event(
                EventType::CapabilityRequested,
                Some("b"),
                json!({"op": "artifact_read"}),
            ),
            event(
                EventType::CapabilityDenied,
                Some("b"),
                json!({"op": "artifact_read", "reason": "policy"}),
            ),
            event(
                EventType::SandboxExecFinished,
                Some("a"),
                json!({"violations": [
                    {"layer": "landlock", "access": "fs.read_file", "count": 3},
                    {"layer": "seccomp", "access": "syscall", "object": "mount", "count": 1}]}),
            ),
            // The shell's own denial of a path, relayed by a runner: the
            // operation's end is its op.finished, not this.
            event(
                EventType::CapabilityDenied,
                Some("a"),
                json!({"op": "exec_argv", "runnerId": "runner_1"}),
            ),
            event(
                EventType::OpFinished,
                Some("a"),
                json!({"status": "ok", "runnerId": "runner_1"}),
            ),
            event(
                EventType::RunDestroyed,
                None,
                json!({"checks": [{"check": "processes", "ok": true},
                    {"check": "mounts", "ok": false}]}),
            ),
            event(EventType::RunFinished, None, json!({"state": "succeeded"})),
            event(
                EventType::ArtifactRejected,
                Some("a"),
                json!({"path": "out/x", "size": 1, "reasons": [
                    {"rule": "executable", "detail": "ELF"}, {"rule": "nonsense", "detail": "?"}]}),
            ),
            event(
                EventType::RunUsage,
                None,
                json!({"programs": 2, "cpuMs": 1500, "programWallMs": 2000,
                    "egressRequests": 1, "egressBytesOut": 10, "egressBytesIn": 20}),
            ),
        ]);
        m.set_waiting(&[("local".into(), 3)], 2);
        let text = m.encode();
        for want in [
            "moat_ops_total{op=\"exec_argv\",status=\"ok\"} 1",
            "moat_ops_total{op=\"artifact_read\",status=\"denied\"} 1",
            "moat_violations_total{layer=\"landlock\"} 3",
            "moat_violations_total{layer=\"seccomp\"} 1",
            "moat_teardowns_total{outcome=\"unclean\"} 1",
            "moat_teardown_checks_failed_total{check=\"mounts\"} 1",
            "moat_runs_finished_total{outcome=\"succeeded\"} 1",
            "moat_programs_total 2",
            "moat_program_cpu_seconds_total 1.5",
            "moat_egress_bytes_total{direction=\"in\"} 20",
            "moat_runs_queued{environment=\"local\"} 3",
            "moat_approvals_pending 2",
            "moat_op_duration_seconds_count{op=\"exec_argv\"} 1",
            "moat_artifact_validation_failures_total{rule=\"executable\"} 1",
            "moat_artifact_validation_failures_total{rule=\"other\"} 1",
        ] {
            assert!(text.lines().any(|l| l == want), "{want}\n{text}");
        }
        // Only one of the two capability.denied ended an operation.
        assert!(line(&text, "moat_ops_total{op=\"exec_argv\",status=\"denied\"}").is_none());
        m.set_waiting(&[], 0);
        assert!(line(&m.encode(), "moat_runs_queued{").is_none());
    }

    #[test]
    fn a_runner_registers_its_own() {
        let m = Metrics::new(Role::Runner);
        m.op_finished("exec_argv", "ok", 0.02);
        m.run_active(1);
        let text = m.encode();
        assert!(text.contains("moat_runs_active 1"), "{text}");
        assert!(text.contains("moat_ops_total{op=\"exec_argv\",status=\"ok\"} 1"));
        assert!(!text.contains("moat_runs_queued"), "{text}");
    }
}
