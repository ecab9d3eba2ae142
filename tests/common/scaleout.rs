//! The scale-out proof's moving parts, shared by `tests/scaleout.rs` (with
//! failures injected, invariants checked) and `benches/scaleout.rs` (runs
//! per second): control-plane replicas on one database, sealed runners on
//! two hosts serving three orgs under a dedicated-host rule and a quota,
//! and agents that create runs of two operations each, failing over
//! between replicas as a load balancer would.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::control::*;

pub const ORGS: [&str; 3] = ["acme", "globex", "initech"];

/// Every org may read its inputs and write its outputs.
pub const POLICY: &str = r#"
@id("read-inputs")
permit(principal, action == Moat::Action::"artifact_read", resource);
@id("write-outputs")
permit(principal, action == Moat::Action::"artifact_write", resource);
"#;

/// A host labelled `dedicated=<org>` takes that org's runs only.
pub const PLACEMENT: &str = r#"
permit(principal, action == Moat::Action::"place", resource);
@id("dedicated-hosts")
@reason("the host is dedicated to another org")
forbid(principal, action == Moat::Action::"place", resource)
when { resource.labels has dedicated && resource.labels.dedicated != principal.name };
"#;

/// initech may hold this many runs at once.
pub const INITECH_CONCURRENT: u64 = 1;

/// The runners: (name, org, host, labels). host-1 is dedicated to acme,
/// so globex's runner there is never given a run.
pub const RUNNERS: [(&str, &str, &str, &str); 4] = [
    ("so-acme-1", "acme", "host-1", "dedicated=acme"),
    ("so-globex-1", "globex", "host-1", "dedicated=acme"),
    ("so-globex-2", "globex", "host-2", "zone=b"),
    ("so-initech-2", "initech", "host-2", "zone=b"),
];

/// A control plane of `replicas` replicas on `db`, four runners, three orgs.
pub struct Plane {
    // Runners first: fields drop in order, and a runner whose control
    // plane went first would retry until it is killed.
    pub runners: Vec<Runner>,
    pub setup: Setup,
    pub db: String,
    pub replicas: Vec<Serve>,
    /// Listen addresses, so that a replica comes back where it was.
    pub listen: Vec<String>,
    pub extra: Vec<String>,
    pub tokens: BTreeMap<&'static str, String>,
}

impl Plane {
    pub fn start(dir: &Path, db: &str, replicas: usize) -> Plane {
        let hash = sha256_hex(POLICY.as_bytes());
        let setup = setup_with(dir, |m| {
            m["policyHash"] = json!(hash);
            m["limits"]["cpuMillis"] = json!(100);
        });
        std::fs::write(&setup.policy, POLICY).unwrap();
        let placement = dir.join("placement.cedar");
        std::fs::write(&placement, PLACEMENT).unwrap();
        let extra = vec![
            "--placement-policy".to_owned(),
            placement.display().to_string(),
        ];
        let listen: Vec<String> = (0..replicas)
            .map(|_| format!("127.0.0.1:{}", super::free_port()))
            .collect();
        let flags: Vec<&str> = extra.iter().map(String::as_str).collect();
        let replicas: Vec<Serve> = listen
            .iter()
            .map(|addr| Serve::start_with(&setup, db, addr, &flags))
            .collect();
        let mut tokens = BTreeMap::new();
        for name in ORGS {
            let token = org(&replicas[0], name);
            prepare_org(&replicas[0], &setup, &token);
            tokens.insert(name, token);
        }
        let (status, body) = call(
            "PUT",
            &format!("{}/v1/orgs/initech/quota", replicas[0].url),
            ADMIN,
            Some(json!({"concurrentRuns": INITECH_CONCURRENT})),
        );
        assert_eq!(status, 200, "{body}");
        let mut plane = Plane {
            setup,
            db: db.to_owned(),
            replicas,
            listen,
            extra,
            runners: Vec::new(),
            tokens,
        };
        for i in 0..RUNNERS.len() {
            let runner = plane.start_runner(i);
            plane.runners.push(runner);
        }
        plane.wait_registered();
        plane
    }

    /// Runner `i` of [`RUNNERS`], on replica `i % replicas`.
    pub fn start_runner(&self, i: usize) -> Runner {
        let (name, org, host, label) = RUNNERS[i];
        let serve = &self.replicas[i % self.replicas.len()];
        Runner::start_with(
            serve,
            &self.setup,
            &self.tokens[org],
            name,
            &["--host-id", host, "--label", label, "--slots", "4"],
        )
    }

    /// Replica `i` again, on its address.
    pub fn restart_replica(&mut self, i: usize) {
        let flags: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.replicas[i] = Serve::start_with(&self.setup, &self.db, &self.listen[i], &flags);
    }

    pub fn urls(&self) -> Vec<String> {
        self.replicas.iter().map(|s| s.url.clone()).collect()
    }

    /// Waits until every runner serving now has registered.
    pub fn wait_registered(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let registered: usize = ORGS
                .iter()
                .map(|org| {
                    let (_, body) = call(
                        "GET",
                        &format!("{}/v1/runners", self.replicas[0].url),
                        &self.tokens[org],
                        None,
                    );
                    body["runners"].as_array().map_or(0, Vec::len)
                })
                .sum();
            if registered >= RUNNERS.len() {
                return;
            }
            assert!(Instant::now() < deadline, "{registered} runners registered");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// What the agents did.
#[derive(Default)]
pub struct Outcome {
    /// Every run created: (org, run id).
    pub runs: Vec<(String, String)>,
    /// Every operation a replica acknowledged: (org, run, op id).
    pub acknowledged: Vec<(String, String, String)>,
    pub elapsed: Duration,
}

/// An HTTP call to whichever replica answers, trying each in turn for up
/// to two minutes (a load balancer in front of replicas does the same).
fn call_any(
    urls: &[String],
    start: usize,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut i = start;
    loop {
        let url = format!("{}{path}", urls[i % urls.len()]);
        match try_call(method, &url, token, body.clone()) {
            Ok(answer) if answer.0 < 500 => return answer,
            Ok(answer) => {
                assert!(Instant::now() < deadline, "{method} {path}: {answer:?}");
            }
            Err(e) => assert!(Instant::now() < deadline, "{method} {path}: {e}"),
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One run of two operations, then its finish; what was acknowledged.
fn one_run(urls: &[String], agent: usize, org: &str, token: &str, run: &str, out: &mut Outcome) {
    let (status, body) = call_any(
        urls,
        agent,
        "POST",
        "/v1/runs",
        token,
        Some(json!({"id": run, "inputs": [{"path": "input/a.txt", "content": "scale-out\n"}]})),
    );
    // 409: created by an earlier try whose answer was lost.
    assert!(
        status == 201 || status == 409,
        "creating {run}: {status} {body}"
    );
    out.runs.push((org.to_owned(), run.to_owned()));
    let ops = [
        (
            "read",
            "artifact_read",
            json!({"path": "input/a.txt", "maxBytes": 100}),
        ),
        (
            "write",
            "artifact_write",
            json!({"path": "output/b.txt", "content": "done\n", "maxBytes": 100}),
        ),
    ];
    for (id, op, args) in ops {
        let (status, body) = call_any(
            urls,
            agent,
            "POST",
            &format!("/v1/runs/{run}/ops?wait_ms=100"),
            token,
            Some(envelope(id, op, args)),
        );
        assert!(status < 300 || status == 409, "{run}/{id}: {status} {body}");
        // 409: an earlier try was recorded but its answer was lost (the
        // replica was killed), or the run ended under it (dead-lettered
        // after its runners died). Only the first is acknowledged.
        let recorded = status < 300
            || call_any(
                urls,
                agent,
                "GET",
                &format!("/v1/runs/{run}/ops/{id}"),
                token,
                None,
            )
            .0 == 200;
        if recorded {
            out.acknowledged
                .push((org.to_owned(), run.to_owned(), id.to_owned()));
        } else {
            return;
        }
        // Waits for its result (the next op queues behind it anyway, but
        // an agent reads what it asked for).
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (_, op) = call_any(
                urls,
                agent,
                "GET",
                &format!("/v1/runs/{run}/ops/{id}?wait_ms=10000"),
                token,
                None,
            );
            if !matches!(
                op["state"].as_str(),
                Some("queued" | "dispatched" | "pending_approval")
            ) {
                break;
            }
            assert!(Instant::now() < deadline, "{run}/{id} never ended: {op}");
        }
    }
    let (status, body) = call_any(
        urls,
        agent,
        "POST",
        &format!("/v1/runs/{run}/finish"),
        token,
        None,
    );
    assert!(
        status < 300 || status == 409,
        "finishing {run}: {status} {body}"
    );
}

/// `runs` runs from `agents` agents, round-robin over the orgs; `done`
/// counts runs whose operations were answered. `urls` is read at each
/// call, so that a restarted replica is used again.
pub fn drive(
    urls: Vec<String>,
    tokens: &BTreeMap<&'static str, String>,
    runs: usize,
    agents: usize,
    prefix: &str,
    done: Arc<AtomicUsize>,
) -> Outcome {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..agents)
            .map(|agent| {
                let (urls, next, done) = (urls.clone(), Arc::clone(&next), Arc::clone(&done));
                scope.spawn(move || {
                    let mut out = Outcome::default();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= runs {
                            return out;
                        }
                        let org = ORGS[i % ORGS.len()];
                        one_run(
                            &urls,
                            agent,
                            org,
                            &tokens[org],
                            &format!("{prefix}-{i}"),
                            &mut out,
                        );
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = Outcome::default();
    for o in outcomes {
        all.runs.extend(o.runs);
        all.acknowledged.extend(o.acknowledged);
    }
    all.elapsed = started.elapsed();
    all
}

/// Waits until every run of `outcome` has ended; (org, run) → final state.
pub fn wait_all_ended(urls: &[String], tokens: &BTreeMap<&'static str, String>, outcome: &Outcome) {
    let deadline = Instant::now() + Duration::from_secs(300);
    for (org, run) in &outcome.runs {
        loop {
            let (_, view) = call_any(
                urls,
                0,
                "GET",
                &format!("/v1/runs/{run}"),
                &tokens[org.as_str()],
                None,
            );
            if matches!(
                view["state"].as_str(),
                Some("succeeded" | "failed" | "dead_lettered" | "cancelled")
            ) {
                break;
            }
            assert!(Instant::now() < deadline, "{run} never ended: {view}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The invariants, from the database and the ledger: every run ended
/// exactly once; no operation ran twice; every acknowledged operation has
/// its result; acme's dedicated host took acme's runs only; initech never
/// held more runs at once than its quota; the hash chain verifies.
pub fn check_invariants(
    db: &str,
    urls: &[String],
    tokens: &BTreeMap<&'static str, String>,
    outcome: &Outcome,
) {
    let store = moat_store::Store::open(db).unwrap();
    let events = store.all_events(0, 10_000_000).unwrap();
    let mut ended: BTreeMap<String, usize> = BTreeMap::new();
    let mut finished_ops: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut runner_host: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut run_org: BTreeMap<String, String> = BTreeMap::new();
    let org_names: BTreeMap<String, String> = store.orgs().unwrap().into_iter().collect();
    for org in ORGS {
        for r in call_any(urls, 0, "GET", "/v1/runners", &tokens[org], None).1["runners"]
            .as_array()
            .unwrap()
        {
            runner_host.insert(
                r["id"].as_str().unwrap().to_owned(),
                (
                    r["hostId"].as_str().unwrap_or_default().to_owned(),
                    r["labels"]["dedicated"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                ),
            );
        }
    }
    // Replayed in ledger order: runs held per org, claims per host.
    let mut live: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut most_held: BTreeMap<String, usize> = BTreeMap::new();
    for stored in &events {
        let e = &stored.event;
        let run = e.run_id.clone();
        match e.event_type.as_str() {
            "run.created" => {}
            "run.claimed" => {
                let org = run_org_of(&store, &mut run_org, &run);
                let runner = e.data["runnerId"].as_str().unwrap_or_default();
                let (host, dedicated) = runner_host
                    .get(runner)
                    .cloned()
                    .unwrap_or_else(|| panic!("run {run} claimed by unknown runner {runner}"));
                let name = &org_names[&org];
                assert!(
                    dedicated.is_empty() || dedicated == *name,
                    "placement broken: {name}'s run {run} on {host}, dedicated to {dedicated}"
                );
                let held = live.entry(org.clone()).or_default();
                held.insert(run.clone());
                let most = most_held.entry(org).or_default();
                *most = (*most).max(held.len());
            }
            "run.finished" | "run.dead_lettered" | "run.lease_expired" | "run.released" => {
                if let Some(org) = run_org.get(&run) {
                    live.entry(org.clone()).or_default().remove(&run);
                }
                if matches!(e.event_type.as_str(), "run.finished" | "run.dead_lettered") {
                    *ended.entry(run).or_default() += 1;
                }
            }
            "op.finished" => {
                let op = e.op_id.clone().unwrap_or_default();
                *finished_ops.entry((run, op)).or_default() += 1;
            }
            _ => {}
        }
    }
    let initech = org_names
        .iter()
        .find(|(_, n)| n.as_str() == "initech")
        .map(|(id, _)| id.clone())
        .unwrap();
    let held = most_held.get(&initech).copied().unwrap_or(0);
    assert!(
        held as u64 <= INITECH_CONCURRENT,
        "initech held {held} runs at once, over its quota of {INITECH_CONCURRENT}"
    );
    for (_, run) in &outcome.runs {
        assert_eq!(
            ended.get(run),
            Some(&1),
            "run {run} ended {:?} times",
            ended.get(run)
        );
    }
    for ((run, op), n) in &finished_ops {
        assert_eq!(*n, 1, "{run}/{op} finished {n} times");
    }
    for (org, run, op) in &outcome.acknowledged {
        let (_, view) = call_any(
            urls,
            0,
            "GET",
            &format!("/v1/runs/{run}/ops/{op}"),
            &tokens[org.as_str()],
            None,
        );
        assert!(
            matches!(
                view["state"].as_str(),
                Some("succeeded" | "failed" | "denied" | "timeout")
            ) && !view["result"].is_null(),
            "acknowledged {run}/{op} has no result: {view}"
        );
    }
    let (status, verdict) = call_any(urls, 0, "GET", "/v1/ledger/verify", ADMIN, None);
    assert_eq!((status, &verdict["ok"]), (200, &json!(true)), "{verdict}");
}

fn run_org_of(
    store: &moat_store::Store,
    cache: &mut BTreeMap<String, String>,
    run: &str,
) -> String {
    if let Some(org) = cache.get(run) {
        return org.clone();
    }
    let org = store
        .run_by_id(run)
        .unwrap()
        .expect("claimed run exists")
        .org_id;
    cache.insert(run.to_owned(), org.clone());
    org
}
