#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Inspector's pages with 10,000 runs and 1,000,000 events in the
//! database, on SQLite and on PostgreSQL (target: every page under 100 ms of
//! server time; measured here as the whole request on loopback, which is an
//! upper bound). Filling the database takes a few minutes per backend.
//!
//!   cargo bench -p moat-control --bench inspector      (PostgreSQL as for the tests: see tests/suite.sh)

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use moat_control::PolicyEngine;
use moat_control::clock::SystemClock;
use moat_control::server::{self, AppState, Config};
use moat_core::Event;
use moat_core::EventData;
use moat_core::event_data::{CapabilityGranted, CapabilityRequested, PolicyDecision};
use moat_core::sign::PrivateKey;
use moat_store::{NewRun, Store, TempPostgres, typed_event};

const RUNS: usize = 10_000;
const EVENTS: usize = 1_000_000;
const TOKEN: &str = "moat_inspector_bench_token_0123456789";

fn fill(store: &Store) -> String {
    let started = Instant::now();
    let now = moat_core::time::ms(std::time::SystemTime::now());
    let org = store
        .create_org("bench", &moat_core::hash::sha256_hex(TOKEN.as_bytes()), now)
        .unwrap();
    for i in 0..RUNS {
        store
            .create_run(
                &NewRun {
                    org: &org,
                    id: &format!("run-{i:05}"),
                    environment: "prod",
                    inputs: &[],
                    blobs: &[],
                    max_attempts: 3,
                    manifest_hash: None,
                    needs_classes: &[],
                    volumes: &[],
                },
                now + i as i64,
            )
            .unwrap();
    }
    // The rest of the million, spread over the runs, in large transactions.
    let per_run = (EVENTS - RUNS) / RUNS;
    let mut batch: Vec<Event> = Vec::with_capacity(10_000);
    for i in 0..RUNS {
        let run = format!("run-{i:05}");
        for n in 0..per_run {
            let op = Some("artifact_read".to_owned());
            let data = if n % 2 == 0 {
                EventData::CapabilityRequested(CapabilityRequested {
                    op,
                    ..CapabilityRequested::default()
                })
            } else {
                EventData::CapabilityGranted(CapabilityGranted {
                    op,
                    decision: Some(PolicyDecision::Allow),
                    policies: Some(vec!["read-workspace".into()]),
                    resource: Some("Moat::Path::\"input/data.csv\"".into()),
                    ..CapabilityGranted::default()
                })
            };
            let mut e = typed_event(data, &run, now);
            e.op_id = Some(format!("op-{}", n / 2));
            batch.push(e);
        }
        if batch.len() >= 10_000 {
            store.append_events(&org, &batch).unwrap();
            batch.clear();
        }
    }
    store.append_events(&org, &batch).unwrap();
    let (head, _) = store.ledger_head().unwrap();
    eprintln!(
        "filled: {RUNS} runs, {head} events in {:.0?}",
        started.elapsed()
    );
    org
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let pg = TempPostgres::create()
        .expect("PostgreSQL is needed: bash tests/suite.sh starts a throwaway one (or set MOAT_TEST_POSTGRES)");
    let backends = [
        (
            "sqlite",
            format!("sqlite:{}", dir.path().join("inspector.db").display()),
        ),
        ("postgres", pg.url.clone()),
    ];
    for (backend, url) in backends {
        let store = Arc::new(Store::open(&url).unwrap());
        fill(&store);
        let state = AppState::new(Config {
            store: Arc::clone(&store),
            key: PrivateKey::from_seed([1; 32]),
            policy: PolicyEngine::new(moat_control::policy::DEFAULT_POLICY).unwrap(),
            admin_token_hash: moat_core::hash::sha256_hex(b"unused-admin-token"),
            environment: "prod".into(),
            clock: Arc::new(SystemClock),
            lease: Duration::from_secs(30),
            capability_ttl: Duration::from_secs(30),
            max_attempts: 3,
            approval_ttl: Duration::from_secs(900),
            vault: None,
            tools_allow_private: false,
            run_idle_timeout: Duration::from_secs(900),
            outputs: moat_store::Outputs::database(),
            host_minimum: Default::default(),
            advertise_url: None,
            placement: moat_control::placement::PlacementEngine::new(
                moat_control::placement::DEFAULT_PLACEMENT,
            )
            .expect("placement"),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        rt.spawn(async move { axum::serve(listener, server::router(state)).await });
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .build()
            .into();
        let cookie = format!("moat_inspector={TOKEN}");
        let mut group = c.benchmark_group(format!("inspector ({backend}, 10k runs, 1M events)"));
        group
            .sample_size(30)
            .measurement_time(Duration::from_secs(5));
        for (name, path) in [
            ("runs", "/ui/runs".to_owned()),
            ("runs, filtered", "/ui/runs?state=queued".to_owned()),
            ("run page (100 events)", "/ui/runs/run-04242".to_owned()),
            ("approvals", "/ui/approvals".to_owned()),
            ("runners", "/ui/runners".to_owned()),
            ("ledger", "/ui/ledger".to_owned()),
        ] {
            group.bench_function(name, |b| {
                b.iter(|| {
                    let mut response = agent
                        .get(&format!("{base}{path}"))
                        .header("cookie", &cookie)
                        .call()
                        .unwrap();
                    assert_eq!(response.status().as_u16(), 200, "{path}");
                    response.body_mut().read_to_vec().unwrap()
                })
            });
        }
        group.finish();
        drop(rt);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
