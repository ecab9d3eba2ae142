//! `Ledger::verify` over 1,000,000 events (target: under 5 s).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use moat_core::{Event, EventType};
use moat_ledger::Ledger;

fn verify_a_million(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
    let mut batch = Vec::with_capacity(10_000);
    for n in 0..1_000_000u64 {
        batch.push(Event {
            event_type: EventType::CapabilityGranted,
            at: "2026-11-29T00:00:00.000Z".into(),
            run_id: format!("run-{}", n % 100),
            op_id: Some(format!("op-{n}")),
            correlation_id: Some("c".into()),
            data: serde_json::json!({"op": "artifact_read", "n": n}),
        });
        if batch.len() == 10_000 {
            ledger.append(&batch).unwrap();
            batch.clear();
        }
    }
    let mut group = c.benchmark_group("ledger");
    group.sample_size(10);
    group.bench_function("verify_1m_events", |b| {
        b.iter(|| assert_eq!(ledger.verify().unwrap().unwrap().events, 1_000_000))
    });
    group.finish();
}

criterion_group!(benches, verify_a_million);
criterion_main!(benches);
