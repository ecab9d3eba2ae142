//! The chain catches every kind of tampering, on a real SQLite file.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use moat_core::{Event, EventType};
use moat_ledger::{Ledger, VerifyError};

fn event(n: usize) -> Event {
    Event {
        event_type: EventType::CapabilityRequested,
        at: "2026-11-29T00:00:00.000Z".into(),
        run_id: format!("run-{}", n % 3),
        op_id: Some(format!("op-{n}")),
        correlation_id: None,
        data: serde_json::json!({"n": n}),
    }
}

fn ledger_with(n: usize) -> (tempfile::TempDir, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
    let events: Vec<Event> = (0..n).map(event).collect();
    for chunk in events.chunks(7) {
        ledger.append(chunk).unwrap();
    }
    (dir, ledger)
}

#[test]
fn an_untouched_ledger_verifies_and_reopens() {
    let (dir, ledger) = ledger_with(50);
    let ok = ledger.verify().unwrap().unwrap();
    assert_eq!(ok.events, 50);
    drop(ledger);
    let reopened = Ledger::open(&dir.path().join("ledger.db")).unwrap();
    assert_eq!(reopened.verify().unwrap().unwrap().events, 50);
    let run1 = reopened.events(Some("run-1"), 0, 1000).unwrap();
    assert!(run1.iter().all(|e| e.event.run_id == "run-1"));
    assert_eq!(run1.len(), 17);
}

#[test]
fn an_edited_event_is_named() {
    let (_dir, ledger) = ledger_with(20);
    ledger
        .connection()
        .execute(
            "UPDATE events SET body = replace(body, '\"n\":12', '\"n\":13') WHERE seq = 13",
            [],
        )
        .unwrap();
    assert_eq!(ledger.verify().unwrap(), Err(VerifyError::Edited(13)));
}

#[test]
fn a_deleted_event_is_named() {
    let (_dir, ledger) = ledger_with(20);
    ledger
        .connection()
        .execute("DELETE FROM events WHERE seq = 5", [])
        .unwrap();
    assert_eq!(ledger.verify().unwrap(), Err(VerifyError::Missing(5)));
}

#[test]
fn deleting_the_newest_events_is_caught_by_the_head() {
    let (_dir, ledger) = ledger_with(20);
    ledger
        .connection()
        .execute("DELETE FROM events WHERE seq > 17", [])
        .unwrap();
    assert_eq!(
        ledger.verify().unwrap(),
        Err(VerifyError::TruncatedTail { last: 17, head: 20 })
    );
}

#[test]
fn reordered_events_are_caught() {
    let (_dir, ledger) = ledger_with(20);
    let c = ledger.connection();
    c.execute("UPDATE events SET seq = -1 WHERE seq = 8", [])
        .unwrap();
    c.execute("UPDATE events SET seq = 8 WHERE seq = 9", [])
        .unwrap();
    c.execute("UPDATE events SET seq = 9 WHERE seq = -1", [])
        .unwrap();
    assert_eq!(ledger.verify().unwrap(), Err(VerifyError::Reordered(8)));
}

#[test]
fn a_rewritten_chain_without_the_head_is_caught() {
    // Editing an event and recomputing every later hash still leaves the head.
    let (_dir, mut ledger) = ledger_with(5);
    ledger.append(&[event(99)]).unwrap();
    ledger
        .connection()
        .execute("DELETE FROM events WHERE seq = 6", [])
        .unwrap();
    ledger
        .connection()
        .execute("INSERT INTO events SELECT 6, run_id, event_type, body, prev_hash, hash FROM events WHERE seq = 5", [])
        .unwrap();
    assert!(ledger.verify().unwrap().is_err());
}
