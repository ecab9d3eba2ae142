//! The control-plane store, every test on both backends: embedded SQLite
//! and a PostgreSQL database of its own (see `TempPostgres`).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;

use moat_core::EventType;
use moat_store::{
    ClaimAsk, ClaimLook, Claimed, NewApproval, NewArtifact, NewOp, NewRun, OpResult, OpState,
    RunState, RunnerRequest, RunnerRow, Store, TempPostgres, TokenKind,
};
use serde_json::json;

struct Backend {
    store: Arc<Store>,
    /// What `store` was opened with (another replica opens it too).
    url: String,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<TempPostgres>,
}

fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite_url = format!("sqlite:{}", dir.path().join("moat.db").display());
    let sqlite = Store::open(&sqlite_url).expect("sqlite store");
    let pg = TempPostgres::create().expect(
        "PostgreSQL is needed for the store tests: bash tests/suite.sh starts a throwaway one \
         (set MOAT_TEST_POSTGRES to a libpq key=value string to use another server)",
    );
    let postgres = Store::open(&pg.url).expect("postgres store");
    vec![
        Backend {
            store: Arc::new(sqlite),
            url: sqlite_url,
            _dir: Some(dir),
            _pg: None,
        },
        Backend {
            store: Arc::new(postgres),
            url: pg.url.clone(),
            _dir: None,
            _pg: Some(pg),
        },
    ]
}

fn org(store: &Store, name: &str) -> String {
    store
        .create_org(name, &format!("hash-{name}"), 1)
        .expect("org")
}

fn run(store: &Store, org: &str, id: &str, max_attempts: i64) {
    run_at(store, org, id, max_attempts, 10);
}

/// [`run`], created at `now`.
fn run_at(store: &Store, org: &str, id: &str, max_attempts: i64, now: i64) {
    store
        .create_run(
            &NewRun {
                org,
                id,
                environment: "test",
                inputs: &[],
                blobs: &[],
                manifest_hash: None,
                max_attempts,
                needs_classes: &[],
                volumes: &[],
            },
            now,
        )
        .expect("run");
}

/// Org `a` with run `r` (up to `attempts`), claimed by `runner-1` at
/// `now` for `lease` ms; the org's id.
fn held_run(store: &Store, attempts: i64, now: i64, lease: i64) -> String {
    let a = org(store, "a");
    run(store, &a, "r", attempts);
    store
        .claim_run(&a, "test", "runner-1", "m", now, lease)
        .unwrap()
        .expect("claim");
    a
}

/// A run's events when it was claimed twice and lost both leases (its
/// second, its last attempt, dead-lettering it).
const LAPSED_TWICE: [&str; 8] = [
    "run.created",
    "run.claimed",
    "run.lease_expired",
    "run.retried",
    "run.claimed",
    "run.lease_expired",
    "run.usage",
    "run.dead_lettered",
];

/// What run `r`'s `run.usage` event says.
fn usage_of_r(store: &Store) -> serde_json::Value {
    store
        .events_of_run("r")
        .unwrap()
        .into_iter()
        .find(|e| e.event.event_type == EventType::RunUsage)
        .expect("run.usage")
        .event
        .data
}

/// A queued op `id` of run `r` with an empty envelope and decision.
fn queued<'a>(org: &'a str, id: &'a str, empty: &'a serde_json::Value) -> NewOp<'a> {
    NewOp {
        org,
        run: "r",
        id,
        op: "artifact_read",
        state: OpState::Queued,
        envelope: empty,
        decision: empty,
        result: None,
        events: &[],
        approval: None,
    }
}

/// `op.finished` of an op of run `r` that runner-1 answered, at `at`.
fn op_finished(at: i64) -> moat_core::Event {
    moat_store::typed_event(
        moat_core::EventData::OpFinished(moat_core::event_data::OpFinished {
            status: moat_core::OpStatus::Ok,
            runner_id: "runner-1".into(),
            reason: None,
            artifacts: None,
            profile: None,
            message: None,
        }),
        "r",
        at,
    )
}

/// A manifest of environment `prod` (its signed text a stand-in).
fn prod_manifest(hash: &str, published: i64, key: &str) -> moat_store::ManifestRow {
    moat_store::ManifestRow {
        hash: hash.into(),
        environment: "prod".into(),
        signed: "{}".into(),
        signed_by: key.into(),
        expires_ms: 10_000,
        published_ms: published,
        revoked: false,
    }
}

fn event_types(store: &Store, run: &str) -> Vec<String> {
    store
        .all_events(0, 100_000)
        .expect("events")
        .into_iter()
        .filter(|e| e.event.run_id == run)
        .map(|e| e.event.event_type.as_str().to_owned())
        .collect()
}

#[test]
fn orgs_tokens_and_scoping() {
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        let other = org(s, "b");
        assert!(
            s.create_org("a", "x", 1).is_err(),
            "{}: duplicate org name",
            s.backend()
        );
        assert_eq!(
            s.org_of_api_token("hash-a").unwrap().as_deref(),
            Some(a.as_str())
        );
        assert_eq!(s.org_of_api_token("nope").unwrap(), None);
        run(s, &a, "run-1", 1);
        assert!(s.run(&a, "run-1").unwrap().is_some());
        assert!(
            s.run(&other, "run-1").unwrap().is_none(),
            "{}: other org sees the run",
            s.backend()
        );
        assert!(
            s.events(&other, Some("run-1"), 0, 100)
                .unwrap()
                .events
                .is_empty()
        );
        assert_eq!(s.events(&a, Some("run-1"), 0, 100).unwrap().events.len(), 1);

        s.add_token(&a, "boot", TokenKind::Bootstrap, 1_000)
            .unwrap();
        assert_eq!(
            s.spend_bootstrap_token("boot", 2_000).unwrap(),
            None,
            "expired token spent"
        );
        s.add_token(&a, "boot2", TokenKind::Bootstrap, 1_000)
            .unwrap();
        assert_eq!(
            s.spend_bootstrap_token("boot2", 500).unwrap().as_deref(),
            Some(a.as_str())
        );
        assert_eq!(
            s.spend_bootstrap_token("boot2", 500).unwrap(),
            None,
            "token spent twice"
        );
        assert_eq!(
            s.org_of_api_token("boot").unwrap(),
            None,
            "bootstrap token used as API token"
        );
    }
}

#[test]
fn a_token_another_replica_adds_works_at_once_and_a_bootstrap_token_never_passes_for_an_api_one() {
    for b in backends() {
        // Another replica of the control plane, on the same database.
        let (one, other) = (&b.store, Store::open(&b.url).expect("another store"));
        let a = org(one, "a");
        // Unknown here first: an unknown token is not remembered as such.
        assert_eq!(other.org_of_token("agent-1").unwrap(), None);
        one.add_token(&a, "agent-1", TokenKind::Agent, 0).unwrap();
        for _ in 0..2 {
            assert_eq!(
                other.org_of_token("agent-1").unwrap(),
                Some((a.clone(), TokenKind::Agent)),
                "{}",
                other.backend()
            );
        }
        assert_eq!(
            other.org_of_token("hash-a").unwrap(),
            Some((a.clone(), TokenKind::Api))
        );
        one.add_token(&a, "boot", TokenKind::Bootstrap, i64::MAX)
            .unwrap();
        for _ in 0..2 {
            assert_eq!(other.org_of_token("boot").unwrap(), None);
        }
        assert_eq!(
            other.spend_bootstrap_token("boot", 1).unwrap().as_deref(),
            Some(a.as_str())
        );
        assert_eq!(one.spend_bootstrap_token("boot", 1).unwrap(), None);
    }
}

#[test]
fn ops_finish_once_and_artifacts_stay_in_their_org() {
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        let other = org(s, "b");
        run(s, &a, "r", 1);
        let claimed = s
            .claim_run(&a, "test", "runner-1", "m", 20, 1_000)
            .unwrap()
            .expect("claim");
        assert_eq!(claimed.run.state, RunState::Claimed);
        let envelope = json!({"id": "op-1"});
        let decision = json!({"decision": "allow"});
        let new = NewOp {
            org: &a,
            run: "r",
            id: "op-1",
            op: "artifact_read",
            state: OpState::Queued,
            envelope: &envelope,
            decision: &decision,
            result: None,
            events: &[],
            approval: None,
        };
        s.insert_op(&new, 21).unwrap().expect("op");
        assert!(
            matches!(s.insert_op(&new, 22), Err(e) if e.to_string().contains("already exists"))
        );
        let other_new = NewOp { org: &other, ..new };
        assert!(
            s.insert_op(&other_new, 22).unwrap().is_none(),
            "op on another org's run"
        );
        assert!(
            s.dispatch_op(&a, "runner-2", "r", 23).unwrap().is_none(),
            "dispatch to a non-holder"
        );
        let op = s
            .dispatch_op(&a, "runner-1", "r", 23)
            .unwrap()
            .expect("dispatch");
        assert_eq!(op.state, OpState::Dispatched);
        // Its holder asking again has not had it (a lost answer): the same
        // operation, not the next one and not nothing.
        let again = s
            .dispatch_op(&a, "runner-1", "r", 23)
            .unwrap()
            .expect("handed over again");
        assert_eq!(
            (again.id.as_str(), again.state),
            ("op-1", OpState::Dispatched)
        );
        assert!(
            s.dispatch_op(&a, "runner-2", "r", 23).unwrap().is_none(),
            "a dispatched op handed to a non-holder"
        );
        let data = b"hello".to_vec();
        let artifact = NewArtifact {
            sha256: moat_core::hash::sha256_hex(&data),
            kind: "file".into(),
            label: "out.txt".into(),
            data,
            kept: moat_store::Kept::Database,
        };
        let ev = op_finished(24);
        let result = json!({"status": "ok"});
        let report = OpResult {
            org: &a,
            runner: "runner-1",
            run: "r",
            op: "op-1",
            succeeded: true,
            result: &result,
            events: std::slice::from_ref(&ev),
            artifacts: std::slice::from_ref(&artifact),
            held: &[],
            heads: &[],
        };
        // An artifact under a wrong hash fails the whole report: nothing recorded.
        let forged = NewArtifact {
            sha256: "00".repeat(32),
            ..artifact.clone()
        };
        let forged_report = OpResult {
            artifacts: std::slice::from_ref(&forged),
            ..report
        };
        assert!(
            s.finish_op(&forged_report, 24).is_err(),
            "artifact under a wrong hash"
        );
        assert_eq!(
            s.op(&a, "r", "op-1").unwrap().expect("op").state,
            OpState::Dispatched
        );
        assert!(s.finish_op(&report, 24).unwrap());
        assert!(!s.finish_op(&report, 25).unwrap(), "second report recorded");
        let finished = event_types(s, "r")
            .iter()
            .filter(|t| *t == "op.finished")
            .count();
        assert_eq!(finished, 1, "{}: side effect recorded twice", s.backend());
        assert_eq!(
            s.op(&a, "r", "op-1").unwrap().expect("op").state,
            OpState::Succeeded
        );
        assert_eq!(s.artifacts(&a, "r").unwrap().len(), 1);
        assert_eq!(
            s.artifact_bytes(&a, &artifact.sha256).unwrap().as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(
            s.artifact_bytes(&other, &artifact.sha256).unwrap(),
            None,
            "other org reads the blob"
        );
        assert!(s.verify_ledger().unwrap().is_ok());
    }
}

/// The common answer, only events (on PostgreSQL one statement records it,
/// ends its tool token and locks the ledger's head): recorded once, only
/// from the holder, the token ended with it and the chain intact.
#[test]
fn an_answer_with_only_events_ends_its_tool_token_only_from_the_holder() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 20, 1_000);
        let (held, open) = s
            .renew_lease_counting(&a, "runner-1", "r", 21, 1_000)
            .unwrap()
            .expect("held");
        assert_eq!((held.state, open), (RunState::Running, 0));
        assert!(
            s.renew_lease_counting(&a, "runner-2", "r", 21, 1_000)
                .unwrap()
                .is_none(),
            "renewed by a non-holder"
        );
        let empty = json!({});
        let asked = moat_store::typed_event(
            moat_core::EventData::CapabilityRequested(moat_core::event_data::CapabilityRequested {
                op: Some("artifact_read".into()),
                ..Default::default()
            }),
            "r",
            22,
        );
        let new = NewOp {
            events: std::slice::from_ref(&asked),
            ..queued(&a, "op-1", &empty)
        };
        s.insert_op(&new, 22).unwrap().expect("op");
        assert!(
            matches!(s.insert_op(&new, 22), Err(e) if e.to_string().contains("already exists")),
            "{}: a second insert of one op",
            s.backend()
        );
        let (_, open) = s
            .renew_lease_counting(&a, "runner-1", "r", 23, 1_000)
            .unwrap()
            .expect("held");
        assert_eq!(open, 1, "{}: the queued op is open", s.backend());
        s.dispatch_op(&a, "runner-1", "r", 23)
            .unwrap()
            .expect("dispatch");
        let token = moat_store::ToolTokenRow {
            org_id: a.clone(),
            run_id: "r".into(),
            op_id: "op-1".into(),
            tools: json!({}),
            expires_ms: 10_000,
        };
        s.put_tool_token("token-hash", &token).unwrap();
        let finished = op_finished(24);
        let result = json!({"status": "ok"});
        let report = OpResult {
            org: &a,
            runner: "runner-2",
            run: "r",
            op: "op-1",
            succeeded: true,
            result: &result,
            events: std::slice::from_ref(&finished),
            artifacts: &[],
            held: &[],
            heads: &[],
        };
        assert!(!s.finish_op(&report, 24).unwrap(), "a non-holder's answer");
        assert!(
            s.tool_token("token-hash", 24).unwrap().is_some(),
            "{}: a non-holder's answer ended the token",
            s.backend()
        );
        let report = OpResult {
            runner: "runner-1",
            ..report
        };
        assert!(s.finish_op(&report, 25).unwrap());
        assert!(!s.finish_op(&report, 26).unwrap(), "second report recorded");
        assert!(s.tool_token("token-hash", 26).unwrap().is_none());
        assert_eq!(
            event_types(s, "r"),
            [
                "run.created",
                "run.claimed",
                "capability.requested",
                "op.finished"
            ],
            "{}",
            s.backend()
        );
        assert!(s.verify_ledger().unwrap().is_ok());
        let (_, open) = s
            .renew_lease_counting(&a, "runner-1", "r", 27, 1_000)
            .unwrap()
            .expect("held");
        assert_eq!(open, 0);

        // What judging an answer reads: the org's name and its secrets.
        assert_eq!(
            s.org_name_and_secrets(&a).unwrap(),
            (Some("a".into()), vec![])
        );
        s.put_secret(&a, "b", b"n2", b"c2", 28).unwrap();
        s.put_secret(&a, "a", b"n1", b"c1", 28).unwrap();
        let (name, secrets) = s.org_name_and_secrets(&a).unwrap();
        assert_eq!(name.as_deref(), Some("a"));
        assert_eq!(
            secrets.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(
            s.org_name_and_secrets("no-such-org").unwrap(),
            (None, vec![])
        );
    }
}

#[test]
fn a_lost_lease_retries_then_dead_letters() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 2, 100, 50);
        let empty = json!({});
        s.insert_op(&queued(&a, "o", &empty), 101).unwrap();
        s.dispatch_op(&a, "runner-1", "r", 102)
            .unwrap()
            .expect("dispatch");
        assert!(
            s.expire_leases(149).unwrap().is_empty(),
            "lease expired early"
        );
        assert_eq!(
            s.expire_leases(151).unwrap(),
            vec![("r".to_owned(), RunState::Queued)]
        );
        let op = s.op(&a, "r", "o").unwrap().expect("op");
        assert_eq!(op.state, OpState::Failed);
        assert_eq!(op.result.expect("result")["error"]["reason"], "interrupted");
        assert!(
            s.renew_lease(&a, "runner-1", "r", 152, 50)
                .unwrap()
                .is_none(),
            "old holder renewed"
        );
        s.claim_run(&a, "test", "runner-2", "m", 200, 50)
            .unwrap()
            .expect("second claim");
        assert!(
            s.renew_lease(&a, "runner-2", "r", 220, 50)
                .unwrap()
                .is_some()
        );
        assert_eq!(
            s.expire_leases(300).unwrap(),
            vec![("r".to_owned(), RunState::DeadLettered)]
        );
        assert_eq!(
            s.run(&a, "r").unwrap().expect("run").state,
            RunState::DeadLettered
        );
        assert!(
            !s.finish_run(&a, "runner-2", "r", (RunState::Succeeded, None), &[], 301)
                .unwrap()
        );
        assert_eq!(event_types(s, "r"), LAPSED_TWICE, "{}", s.backend());
    }
}

#[test]
fn a_finish_records_what_the_end_closed_once_and_only_from_the_holder() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 100, 50);
        let closed = moat_store::typed_event(
            moat_core::EventData::CapabilityGranted(Default::default()),
            "r",
            120,
        );
        let ended = |runner: &str| {
            s.finish_run(
                &a,
                runner,
                "r",
                (RunState::Succeeded, None),
                std::slice::from_ref(&closed),
                130,
            )
            .unwrap()
        };
        // An op still open: a finish that does not end the run leaves it.
        let empty = json!({});
        s.insert_op(&queued(&a, "o", &empty), 110)
            .unwrap()
            .expect("op");
        let op_state = || s.op(&a, "r", "o").unwrap().expect("op").state;
        assert!(!ended("runner-2"), "another runner finished the run");
        assert_eq!(op_state(), OpState::Queued, "{}", s.backend());
        assert!(ended("runner-1"));
        assert_eq!(op_state(), OpState::Failed, "{}", s.backend());
        // Sent again (its answer lost): nothing more is recorded.
        assert!(!ended("runner-1"));
        let types = event_types(s, "r");
        let count = types.iter().filter(|t| *t == "capability.granted").count();
        assert_eq!(count, 1, "{types:?}");
    }
}

#[test]
fn a_claim_says_whether_other_runs_wait_in_its_queue() {
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        let other = org(s, "b");
        run(s, &a, "r1", 1);
        run(s, &a, "r2", 1);
        // Another org's queued run is not this queue's.
        run(s, &other, "elsewhere", 1);
        let claim = |runner: &str| {
            s.claim_run(&a, "test", runner, "m", 20, 1_000)
                .unwrap()
                .map(|c| (c.run.id, c.more_queued))
        };
        assert_eq!(claim("w1"), Some(("r1".into(), true)), "{}", s.backend());
        assert_eq!(claim("w2"), Some(("r2".into(), false)), "{}", s.backend());
        assert_eq!(claim("w3"), None, "{}", s.backend());
    }
}

#[test]
fn a_claim_says_finish_now_only_for_a_run_asked_to_finish_with_nothing_open() {
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        let empty = serde_json::json!({});
        // Taken in id order (created together): asked to finish with
        // nothing open; asked to finish with an operation queued; not asked.
        run(s, &a, "done", 1);
        s.request_finish(&a, "done", 11).unwrap().expect("done");
        run(s, &a, "r", 1);
        s.insert_op(&queued(&a, "o", &empty), 12).unwrap();
        s.request_finish(&a, "r", 13).unwrap().expect("r");
        run(s, &a, "waiting", 1);
        let claim = |runner: &str| {
            s.claim_run(&a, "test", runner, "m", 20, 1_000)
                .unwrap()
                .map(|c| (c.run.id, c.finish_now))
        };
        let backend = s.backend();
        assert_eq!(claim("w1"), Some(("done".into(), true)), "{backend}");
        assert_eq!(claim("w2"), Some(("r".into(), false)), "{backend}");
        assert_eq!(claim("w3"), Some(("waiting".into(), false)), "{backend}");
        // The claim changed nothing else: the finish it said is the
        // runner's to report, from the claim.
        assert!(
            s.finish_run(&a, "w1", "done", (RunState::Succeeded, None), &[], 30)
                .unwrap(),
            "{backend}"
        );
        assert!(s.verify_ledger().unwrap().is_ok(), "{backend}");
    }
}

#[test]
fn concurrent_claims_take_each_run_once() {
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        for i in 0..100 {
            run(s, &a, &format!("r{i:03}"), 1);
        }
        let handles: Vec<_> = (0..4)
            .map(|w| {
                let s = Arc::clone(&b.store);
                let a = a.clone();
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(Claimed { run: r, .. }) = s
                        .claim_run(&a, "test", &format!("w{w}"), "m", 1_000, 60_000)
                        .expect("claim")
                    {
                        assert!(
                            s.finish_run(
                                &a,
                                &format!("w{w}"),
                                &r.id,
                                (RunState::Succeeded, None),
                                &[],
                                1_001
                            )
                            .expect("finish")
                        );
                        mine.push(r.id);
                    }
                    mine
                })
            })
            .collect();
        let mut all: Vec<String> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker"))
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 100, "{}", s.backend());
        let events = s.all_events(0, 100_000).unwrap();
        let claims = events
            .iter()
            .filter(|e| e.event.event_type == EventType::RunClaimed)
            .count();
        let ends = events
            .iter()
            .filter(|e| e.event.event_type == EventType::RunFinished)
            .count();
        assert_eq!((claims, ends), (100, 100), "{}", s.backend());
        assert!(
            s.verify_ledger().unwrap().is_ok(),
            "{}: chain forked",
            s.backend()
        );
    }
}

/// runner-1 answers operation `op` of run `r` (of org `org`) as succeeded,
/// at `now`: whether this answer was the one recorded.
fn answer(s: &Store, org: &str, op: &str, now: i64) -> bool {
    let result = json!({"status": "ok"});
    s.finish_op(
        &moat_store::OpResult {
            org,
            runner: "runner-1",
            run: "r",
            op,
            succeeded: true,
            result: &result,
            events: &[],
            artifacts: &[],
            held: &[],
            heads: &[],
        },
        now,
    )
    .expect("finish")
}

#[test]
fn concurrent_dispatches_hand_ops_out_in_order_and_each_is_answered_once() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 20, 60_000);
        let empty = json!({});
        for i in 0..60 {
            let id = format!("op-{i:02}");
            let row = s
                .insert_op(&queued(&a, &id, &empty), 21)
                .unwrap()
                .expect("op");
            assert_eq!(row.n, i + 1, "{}: numbered in order", s.backend());
        }
        // Four askers at once for the holder (a retried long poll beside the
        // one whose answer was lost): each is handed the oldest unanswered
        // operation, never one past it, and each operation is answered once.
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (s, a) = (Arc::clone(&b.store), a.clone());
                std::thread::spawn(move || {
                    let (mut seen, mut answered) = (Vec::new(), Vec::new());
                    loop {
                        // Nothing to hand over while another asker's answer
                        // is being recorded: asked again until all are in.
                        let Some(op) = s.dispatch_op(&a, "runner-1", "r", 22).expect("dispatch")
                        else {
                            let (_, open) =
                                s.run_with_open_ops(&a, "r").expect("run").expect("run");
                            if open == 0 {
                                break;
                            }
                            continue;
                        };
                        assert_eq!(op.state, OpState::Dispatched);
                        seen.push(op.n);
                        if answer(&s, &a, &op.id, 23) {
                            answered.push(op.n);
                        }
                    }
                    (seen, answered)
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            let (seen, answered) = h.join().expect("dispatcher");
            assert!(
                seen.windows(2).all(|w| w[0] <= w[1]),
                "out of order: {seen:?}"
            );
            all.extend(answered);
        }
        all.sort_unstable();
        assert_eq!(all, (1..=60).collect::<Vec<i64>>(), "{}", s.backend());
        // Another runner's dispatch takes nothing, even with ops queued.
        s.insert_op(&queued(&a, "late", &empty), 23)
            .unwrap()
            .expect("op");
        assert!(s.dispatch_op(&a, "runner-2", "r", 24).unwrap().is_none());
    }
}

#[test]
fn a_run_that_ends_fails_its_waiting_ops_expires_its_approvals_and_counts_its_usage() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 20, 60_000);
        let (empty, summary) = (json!({}), json!({"op": "artifact_read", "args": {}}));
        let waiting = NewOp {
            state: OpState::PendingApproval,
            approval: Some(NewApproval {
                id: "apr",
                rule: "sensitive",
                risk: "high",
                summary: &summary,
                expires_ms: 1_000_000,
            }),
            ..queued(&a, "o", &empty)
        };
        s.insert_op(&waiting, 21).unwrap().expect("op");
        s.insert_op(&queued(&a, "q", &empty), 21)
            .unwrap()
            .expect("op");
        // One that had failed before: counted with those the end fails.
        let failed_before = NewOp {
            state: OpState::Failed,
            ..queued(&a, "f", &empty)
        };
        s.insert_op(&failed_before, 21).unwrap().expect("op");
        // What its runner reported: counted at the end.
        let request: moat_core::event_data::NetworkRequest = serde_json::from_value(json!({
            "host": "example.test", "method": "GET", "port": 443, "decision": "allowed",
            "bytesOut": 300, "bytesIn": 7000,
        }))
        .expect("network.request");
        s.append_events(
            &a,
            &[moat_store::typed_event(
                moat_core::EventData::NetworkRequest(request),
                "r",
                21,
            )],
        )
        .unwrap();
        assert!(
            s.force_end_run(&a, "r", RunState::Failed, "operator", 22)
                .unwrap()
        );
        let queued_op = s.op(&a, "r", "q").unwrap().expect("op");
        assert_eq!(queued_op.state, OpState::Failed, "{}", s.backend());
        assert_eq!(
            queued_op.result.expect("result")["error"]["reason"],
            "run_ended"
        );
        assert_eq!(
            s.run(&a, "r").unwrap().expect("run").state,
            RunState::Failed
        );
        // Its usage, as the event says and as the org's day adds it up:
        // the ops counted once, failed, the request's bytes.
        let usage = usage_of_r(s);
        assert_eq!(usage["ops"], json!({"failed": 3}), "{}", s.backend());
        assert_eq!(
            (
                &usage["egressRequests"],
                &usage["egressBytesOut"],
                &usage["egressBytesIn"]
            ),
            (&json!(1), &json!(300), &json!(7000)),
            "{}",
            s.backend()
        );
        let day = s.usage_days(&a, 1).unwrap();
        assert_eq!(
            day.iter()
                .map(|d| (d.runs, d.ops, d.ops_failed, d.egress_bytes_in))
                .collect::<Vec<_>>(),
            [(1, 3, 3, 7000)],
            "{}",
            s.backend()
        );
        let approval = s.approval(&a, "apr").unwrap().expect("approval");
        assert_eq!(approval.state, moat_store::ApprovalState::Expired);
        let op = s.op(&a, "r", "o").unwrap().expect("op");
        assert_eq!(op.state, OpState::Failed, "{}", s.backend());
        let events = s.events_of_run("r").unwrap();
        let expired = events
            .iter()
            .find(|e| e.event.event_type == EventType::ApprovalExpired)
            .expect("approval.expired");
        let data = moat_core::EventData::parse(expired.event.event_type, &expired.event.data)
            .expect("of its schema");
        let moat_core::EventData::ApprovalExpired(data) = data else {
            panic!("{data:?}");
        };
        assert_eq!(
            (
                data.rule.as_deref(),
                data.risk.as_deref(),
                data.via.as_deref()
            ),
            (Some("sensitive"), Some("high"), Some("run_end")),
            "{}",
            s.backend()
        );
        assert_eq!(expired.event.op_id.as_deref(), Some("o"));
    }
}

#[test]
fn nonces_manifests_and_builds() {
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        s.register_runner(&RunnerRow {
            runner_hash: "h1".into(),
            manifest_hash: "m1".into(),
            environment: "prod".into(),
            slots: 1,
            ..runner_on(&a, "runner", None)
        })
        .unwrap();
        let fresh = |nonce: &str, verified: bool| match s
            .runner_request("runner", nonce, 2, 100, None, |_| verified)
            .unwrap()
        {
            RunnerRequest::Checked(standing) => Some(standing.fresh_nonce),
            RunnerRequest::Refused(_) => None,
            RunnerRequest::UnknownRunner => panic!("runner not found"),
        };
        assert_eq!(fresh("n0", false), None, "unverified request checked");
        assert_eq!(
            fresh("n0", true),
            Some(true),
            "a refused request spent its nonce"
        );
        assert_eq!(fresh("n1", true), Some(true));
        assert_eq!(fresh("n1", true), Some(false), "replayed nonce accepted");
        assert!(matches!(
            s.runner_request("nobody", "n2", 2, 100, None, |_| true)
                .unwrap(),
            RunnerRequest::UnknownRunner
        ));
        // A request the caller verified with the runner's current key: no
        // second check, the nonce spent once all the same.
        let known = |nonce: &str, key: &str, verified: bool| {
            let mut asked = false;
            let answer = match s
                .runner_request("runner", nonce, 2, 100, Some(key), |_| {
                    asked = true;
                    verified
                })
                .unwrap()
            {
                RunnerRequest::Checked(standing) => Some(standing.fresh_nonce),
                RunnerRequest::Refused(_) => None,
                RunnerRequest::UnknownRunner => panic!("runner not found"),
            };
            (answer, asked)
        };
        assert_eq!(known("n3", "k", false), (Some(true), false));
        assert_eq!(known("n3", "k", true), (Some(false), false), "replay");
        // A key that is no longer the runner's: checked again with the
        // current one, nothing recorded when that fails.
        assert_eq!(known("n4", "old", false), (None, true));
        assert_eq!(known("n4", "old", true), (Some(true), true));
        assert!(matches!(
            s.runner_request("nobody", "n5", 2, 100, Some("k"), |_| true)
                .unwrap(),
            RunnerRequest::UnknownRunner
        ));
        assert_eq!(s.prune_nonces(200).unwrap(), 4);

        s.allow_runner_build(&a, "h1", "v1", 1).unwrap();
        assert!(s.runner_build_allowed(&a, "h1").unwrap());
        assert!(!s.runner_build_allowed(&a, "h2").unwrap());
        assert!(s.revoke_runner_build(&a, "h1").unwrap());
        assert!(!s.runner_build_allowed(&a, "h1").unwrap());

        s.publish_manifest(&a, &prod_manifest("m1", 1, "k1"))
            .unwrap();
        s.publish_manifest(&a, &prod_manifest("m2", 2, "k2"))
            .unwrap();
        assert_eq!(
            s.current_manifest(&a, "prod")
                .unwrap()
                .expect("current")
                .hash,
            "m2"
        );
        s.revoke_signing_key(&a, "k2").unwrap();
        assert_eq!(
            s.current_manifest(&a, "prod")
                .unwrap()
                .expect("current")
                .hash,
            "m1"
        );
        assert!(s.revoke_manifest(&a, "m1").unwrap());
        assert!(s.current_manifest(&a, "prod").unwrap().is_none());
    }
}

#[test]
fn moving_an_event_to_another_org_or_run_breaks_the_chain() {
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        run(s, &a, "r1", 1);
        run(s, &a, "r2", 1);
        assert!(s.verify_ledger().unwrap().is_ok());
        for tamper in [
            "UPDATE events SET org_id = 'elsewhere' WHERE seq = 1",
            "UPDATE events SET run_id = 'r2' WHERE seq = 1",
            "UPDATE events SET event_type = 'run.finished' WHERE seq = 1",
        ] {
            let (org_id, run_id, kind): (String, String, String) = s
                .tx(|tx| {
                    let row = tx
                        .query_one(
                            "SELECT org_id, run_id, event_type FROM events WHERE seq = 1",
                            &[],
                        )?
                        .unwrap();
                    Ok((
                        row.text("org_id")?,
                        row.text("run_id")?,
                        row.text("event_type")?,
                    ))
                })
                .unwrap();
            s.tx(|tx| tx.execute(tamper, &[])).unwrap();
            assert_eq!(
                s.verify_ledger().unwrap(),
                Err(moat_ledger::VerifyError::Edited(1)),
                "{}: {tamper}",
                s.backend()
            );
            s.tx(|tx| {
                tx.execute(
                    "UPDATE events SET org_id = ?, run_id = ?, event_type = ? WHERE seq = 1",
                    &[
                        org_id.as_str().into(),
                        run_id.as_str().into(),
                        kind.as_str().into(),
                    ],
                )
            })
            .unwrap();
            assert!(s.verify_ledger().unwrap().is_ok());
        }
    }
}

#[test]
fn a_released_run_is_queued_again_uncounted_only_between_operations() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 10, 1_000);
        let empty = json!({});
        s.insert_op(&queued(&a, "op-1", &empty), 11)
            .unwrap()
            .expect("op");
        s.dispatch_op(&a, "runner-1", "r", 12)
            .unwrap()
            .expect("dispatch");
        assert!(
            s.release_run(&a, "runner-1", "r", 13).unwrap().is_none(),
            "an operation is dispatched: its outcome would be lost"
        );
        assert!(answer(s, &a, "op-1", 14));
        assert!(
            s.release_run(&a, "runner-2", "r", 15).unwrap().is_none(),
            "only its holder gives a run back"
        );
        let released = s
            .release_run(&a, "runner-1", "r", 15)
            .unwrap()
            .expect("released");
        assert_eq!((released.state, released.attempts), (RunState::Queued, 0));
        assert_eq!(released.runner_id, None);
        assert_eq!(
            released.manifest_hash, None,
            "back to the pin it was created with (none), not the claimer's manifest"
        );
        let events = s.all_events(0, 1000).unwrap();
        let last = &events.last().unwrap().event;
        assert_eq!(last.event_type.as_str(), "run.released");
        assert_eq!(last.data["runnerId"], "runner-1");
        // Its one attempt is still there: another runner takes it.
        let again = s
            .claim_run(&a, "test", "runner-2", "m", 16, 1_000)
            .unwrap()
            .expect("claim");
        assert_eq!(again.run.attempts, 1);
        assert!(s.release_run(&a, "runner-1", "r", 17).unwrap().is_none());
    }
}

#[test]
fn rejected_files_are_quarantined_and_held_ones_wait_for_their_approval() {
    use moat_core::event_data::ArtifactRejected;
    use moat_core::exports::{RejectRule, Rejection};
    use moat_store::{ApprovalState, HeldExport, HeldOutcome, Settled, Settlement, typed_event};
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        let other = org(s, "b");
        run(s, &a, "r", 1);
        s.claim_run(&a, "test", "runner-1", "m", 20, 1_000)
            .unwrap()
            .expect("claim");
        let (envelope, decision) = (json!({"id": "clean"}), json!({"decision": "allow"}));
        let clean = NewOp {
            org: &a,
            run: "r",
            id: "clean",
            op: "exec_argv",
            state: OpState::Queued,
            envelope: &envelope,
            decision: &decision,
            result: None,
            events: &[],
            approval: None,
        };
        s.insert_op(&clean, 21).unwrap().expect("op");
        s.dispatch_op(&a, "runner-1", "r", 22)
            .unwrap()
            .expect("dispatch");
        let tool = b"\x7fELF...".to_vec();
        let reasons = vec![Rejection {
            rule: RejectRule::Executable,
            detail: "an executable (ELF) never leaves".into(),
        }];
        let mut rejected = typed_event(
            moat_core::EventData::ArtifactRejected(ArtifactRejected {
                path: "output/tool".into(),
                size: tool.len() as u64,
                sha256: Some(moat_core::hash::sha256_hex(&tool)),
                reasons: reasons.clone(),
                runner_id: Some("runner-1".into()),
                runner_hash: None,
                manifest_hash: None,
            }),
            "r",
            23,
        );
        rejected.op_id = Some("clean".into());
        let report = b"client,total\nall,1.00\n".to_vec();
        let held = HeldExport {
            path: "output/client/report.csv".into(),
            sha256: moat_core::hash::sha256_hex(&report),
            exported_as: "csv".into(),
            data: report.clone(),
            approval_id: "apr_held".into(),
            rule: "client-deliverable".into(),
            risk: "high".into(),
            summary: json!({"op": "export", "args": {"path": "output/client/report.csv"}}),
            expires_ms: 10_000,
        };
        let result = json!({"status": "ok"});
        assert!(
            s.finish_op(
                &OpResult {
                    org: &a,
                    runner: "runner-1",
                    run: "r",
                    op: "clean",
                    succeeded: true,
                    result: &result,
                    events: std::slice::from_ref(&rejected),
                    artifacts: &[],
                    held: std::slice::from_ref(&held),
                    heads: &[],
                },
                24,
            )
            .unwrap()
        );

        // The rejected file: its reasons, by hash, in its org only.
        let sha = moat_core::hash::sha256_hex(&tool);
        let q = s.quarantined(&a, &sha).unwrap().expect("quarantined");
        assert_eq!((q.run_id.as_str(), q.path.as_str()), ("r", "output/tool"));
        assert_eq!(q.reasons, reasons);
        assert!(s.quarantined(&other, &sha).unwrap().is_none());
        assert_eq!(s.run_quarantine(&a, "r").unwrap().len(), 1);
        assert!(s.artifact_bytes(&a, &sha).unwrap().is_none());

        // The held one: stored, not downloadable, its approval pending.
        assert!(s.artifact_bytes(&a, &held.sha256).unwrap().is_none());
        let h = s.held_export(&a, &held.sha256).unwrap().expect("held");
        assert_eq!(h.approval_id, "apr_held");
        assert!(s.held_export(&other, &held.sha256).unwrap().is_none());
        assert_eq!(
            s.held_prefix(&a, "apr_held", 6).unwrap().as_deref(),
            Some(&b"client"[..])
        );
        assert_eq!(
            s.held_prefix(&a, "apr_held", 4096).unwrap(),
            Some(report.clone())
        );
        assert!(s.held_prefix(&other, "apr_held", 4096).unwrap().is_none());
        assert_eq!(s.held_bytes(&a, "apr_held").unwrap(), Some(report.clone()));
        assert!(s.held_bytes(&other, "apr_held").unwrap().is_none());
        assert_eq!(
            s.held_for(&a, "apr_held").unwrap().expect("held").path,
            "output/client/report.csv"
        );
        let pending = s.approvals(&a, Some(ApprovalState::Pending), 10).unwrap();
        assert_eq!(pending.len(), 1);

        // Approved: an artifact of its op, no longer held.
        let settled = s
            .settle_approval(
                &a,
                "apr_held",
                &Settlement {
                    state: ApprovalState::Approved,
                    by: Some("admin"),
                    reason: None,
                    op_result: None,
                    events: &[],
                    export: Some(HeldOutcome::Promote(moat_store::Kept::Database)),
                },
                25,
            )
            .unwrap();
        assert!(matches!(settled, Settled::Done(_)));
        assert_eq!(s.artifact_bytes(&a, &held.sha256).unwrap(), Some(report));
        assert!(s.held_export(&a, &held.sha256).unwrap().is_none());
        let listed = s.artifacts(&a, "r").unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].kind.as_str(), listed[0].label.as_str()),
            ("export", "output/client/report.csv")
        );
        // The op it came from is as it was.
        assert_eq!(
            s.op(&a, "r", "clean").unwrap().expect("op").state,
            OpState::Succeeded
        );

        // Denied: quarantined with its reasons, not downloadable.
        let draft_op = NewOp {
            id: "draft",
            ..clean
        };
        s.insert_op(&draft_op, 26).unwrap().expect("op");
        s.dispatch_op(&a, "runner-1", "r", 27)
            .unwrap()
            .expect("dispatch");
        let draft = b"client,total\ndraft,0.00\n".to_vec();
        let held_draft = HeldExport {
            path: "output/client/draft.csv".into(),
            sha256: moat_core::hash::sha256_hex(&draft),
            data: draft,
            approval_id: "apr_draft".into(),
            ..held.clone()
        };
        assert!(
            s.finish_op(
                &OpResult {
                    org: &a,
                    runner: "runner-1",
                    run: "r",
                    op: "draft",
                    succeeded: true,
                    result: &result,
                    events: &[],
                    artifacts: &[],
                    held: std::slice::from_ref(&held_draft),
                    heads: &[],
                },
                28,
            )
            .unwrap()
        );
        let denial = vec![Rejection {
            rule: RejectRule::NotApproved,
            detail: "denied by the approver: no".into(),
        }];
        let settled = s
            .settle_approval(
                &a,
                "apr_draft",
                &Settlement {
                    state: ApprovalState::Denied,
                    by: Some("admin"),
                    reason: Some("no"),
                    op_result: None,
                    events: &[],
                    export: Some(HeldOutcome::Reject(&denial)),
                },
                29,
            )
            .unwrap();
        assert!(matches!(settled, Settled::Done(_)));
        let q = s
            .quarantined(&a, &held_draft.sha256)
            .unwrap()
            .expect("quarantined");
        assert_eq!(q.reasons, denial);
        assert!(s.held_for(&a, "apr_draft").unwrap().is_none());
        assert!(s.artifact_bytes(&a, &held_draft.sha256).unwrap().is_none());
        assert!(
            !s.artifact_of_kind(&a, &held_draft.sha256, &["export", "input"])
                .unwrap()
        );
    }
}

#[test]
fn volume_chunks_and_snapshots_are_answered_per_org_and_one_writer_holds_a_volume() {
    use moat_store::{Attach, StoreError, VolumeBytes};
    for b in backends() {
        let s = &b.store;
        let (a, z) = (org(s, "a"), org(s, "z"));
        let vol = s.create_volume(&a, "cache", 1).expect("volume");
        assert!(matches!(
            s.create_volume(&a, "cache", 2),
            Err(StoreError::Conflict(_))
        ));
        // Another org may have a volume of the same name: another volume.
        let theirs = s.create_volume(&z, "cache", 2).expect("their volume");
        assert_ne!(vol.id, theirs.id);

        // Over a statement's batch of names: every one answered.
        let names: Vec<String> = (0..1200).map(|i| format!("{i:064x}")).collect();
        for (i, sha) in names.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
            let data = vec![u8::try_from(i % 251).unwrap_or(0); 4];
            s.record_chunk(&a, sha, 4, VolumeBytes::Database(&data), 3)
                .expect("chunk");
        }
        let missing = s.missing_chunks(&a, &names).expect("missing");
        assert_eq!(missing.len(), 800);
        assert!(
            missing
                .iter()
                .all(|m| names.iter().position(|n| n == m).unwrap_or(0) % 3 != 0)
        );
        // What org a stored is missing, and unreadable, for org z.
        assert_eq!(s.missing_chunks(&z, &names).expect("missing").len(), 1200);
        assert!(s.chunk(&z, &names[0]).expect("chunk").is_none());
        assert_eq!(
            s.chunk(&a, &names[0]).expect("chunk"),
            Some(Some(vec![0; 4]))
        );

        // A snapshot is read back only through the volume it was stored for.
        let id = "ab".repeat(32);
        s.record_snapshot(
            &a,
            &vol.id,
            &id,
            1,
            4,
            VolumeBytes::Database(b"{}"),
            2,
            "r1",
            4,
        )
        .expect("snapshot");
        assert!(s.has_snapshot(&a, &vol.id, &id).expect("has"));
        assert!(!s.has_snapshot(&z, &theirs.id, &id).expect("has"));
        assert!(s.snapshot(&z, &vol.id, &id).expect("snapshot").is_none());

        // One live writer; readers any number; the other org's name is not found.
        let attach = |run: &str, volume: &str, read_only: bool, org: &str| {
            s.create_run(
                &NewRun {
                    org,
                    id: run,
                    environment: "test",
                    inputs: &[],
                    blobs: &[],
                    manifest_hash: None,
                    max_attempts: 1,
                    needs_classes: &[],
                    volumes: &[Attach {
                        volume,
                        path: "state",
                        read_only,
                    }],
                },
                5,
            )
        };
        attach("w1", "cache", false, &a).expect("writer");
        assert!(matches!(
            attach("w2", "cache", false, &a),
            Err(StoreError::InUse(_))
        ));
        attach("r2", "cache", true, &a).expect("reader");
        assert!(matches!(
            attach("x1", "nope", true, &a),
            Err(StoreError::NoSuch(_))
        ));
        assert_eq!(
            s.volume(&a, "cache")
                .expect("volume")
                .and_then(|v| v.writer),
            Some("w1".to_owned())
        );
        // The writer's end frees it.
        assert!(
            s.force_end_run(&a, "w1", RunState::Cancelled, "cancelled", 6)
                .expect("cancel")
        );
        attach("w3", "cache", false, &a).expect("next writer");
    }
}

/// A queue of org `a` whose consumer needs nothing: its deliveries' plan.
fn queue(store: &Store, org: &str, name: &str, max_attempts: i64) {
    store
        .put_queue(
            &moat_store::QueueRow {
                org_id: org.into(),
                name: name.into(),
                environment: "test".into(),
                module_sha256: "0".repeat(64),
                inputs: Vec::new(),
                namespaces: vec!["config".into()],
                max_attempts,
                backoff_ms: 100,
                consumer: json!({}),
                created_ms: 0,
                updated_ms: 0,
            },
            &[],
            1,
        )
        .expect("queue");
}

fn deliver(store: &Store, now: i64) -> Vec<String> {
    let mut n = 0;
    store
        .deliver_due(now, 10, &mut |message, _queue, snapshot| {
            n += 1;
            assert!(snapshot.contains_key("config"), "{snapshot:?}");
            Ok(moat_store::Delivery {
                run_id: format!("{}-{n}-{now}", message.id),
                op_id: "op".into(),
                envelope: json!({}),
                decision: json!({}),
                events: Vec::new(),
                needs_classes: Vec::new(),
            })
        })
        .expect("deliver")
}

#[test]
fn queue_messages_are_sent_once_per_key_retried_with_backoff_dead_lettered_and_redriven() {
    use moat_store::{MessageState, NewMessage, Settle, queue_effects};
    for backend in backends() {
        let s = &*backend.store;
        let a = org(s, "a");
        queue(s, &a, "jobs", 2);
        queue(s, &a, "next", 1);
        let body = json!({"n": 1});
        let send = |id: &str, key: Option<&str>| {
            s.enqueue(
                &NewMessage {
                    org: &a,
                    queue: "jobs",
                    id,
                    body: &body,
                    idempotency_key: key,
                },
                10,
            )
            .expect("enqueue")
        };
        let (first, duplicate) = send("m1", Some("k"));
        assert!(!duplicate);
        let (again, duplicate) = send("m2", Some("k"));
        assert!(duplicate);
        assert_eq!(again.id, first.id);
        // No such queue: refused, nothing stored.
        let missing = s.enqueue(
            &NewMessage {
                org: &a,
                queue: "nope",
                id: "m3",
                body: &body,
                idempotency_key: None,
            },
            10,
        );
        assert!(matches!(missing, Err(moat_store::StoreError::NoSuch(_))));
        // Delivered once, to one run; not again while it runs.
        let runs = deliver(s, 20);
        assert_eq!(runs.len(), 1);
        assert!(deliver(s, 21).is_empty());
        // A failure: retried after the backoff, not before.
        let failed = s
            .settle_message(&runs[0], &Settle::Failed { error: "exit 1" }, 30)
            .expect("settle")
            .expect("message");
        assert_eq!(
            (failed.state, failed.attempts, failed.visible_ms),
            (MessageState::Ready, 1, 130)
        );
        assert!(deliver(s, 129).is_empty());
        let runs = deliver(s, 130);
        assert_eq!(runs.len(), 1);
        // A second failure with 2 attempts: dead, until redriven.
        let dead = s
            .settle_message(&runs[0], &Settle::Failed { error: "exit 1" }, 140)
            .expect("settle")
            .expect("message");
        assert_eq!(dead.state, MessageState::Dead);
        assert!(deliver(s, 10_000).is_empty());
        assert!(
            s.redrive(&a, "jobs", "nope", 150)
                .expect("redrive")
                .is_none()
        );
        let redriven = s
            .redrive(&a, "jobs", "m1", 150)
            .expect("redrive")
            .expect("dead one");
        assert_eq!(
            (redriven.state, redriven.attempts),
            (MessageState::Ready, 0)
        );
        assert!(s.redrive(&a, "jobs", "m1", 151).expect("redrive").is_none());
        // Success makes its writes and sends, in the settling transaction;
        // settling twice does nothing.
        let runs = deliver(s, 160);
        let kv = [queue_effects::KvWrite {
            namespace: "config".into(),
            key: "seen".into(),
            value: Some(b"yes".to_vec()),
        }];
        let sends = [queue_effects::Send {
            queue: "next".into(),
            id: "n1".into(),
            body: json!({"from": "m1"}),
            idempotency_key: None,
        }];
        let done = s
            .settle_message(
                &runs[0],
                &Settle::Succeeded {
                    kv: &kv,
                    sends: &sends,
                },
                170,
            )
            .expect("settle")
            .expect("message");
        assert_eq!(done.state, MessageState::Done);
        assert!(
            s.settle_message(&runs[0], &Settle::Failed { error: "late" }, 171)
                .expect("settle")
                .is_none()
        );
        assert_eq!(
            s.kv_get(&a, "config", "seen").expect("kv"),
            Some(b"yes".to_vec())
        );
        let next = s.messages(&a, "next", None, 10).expect("messages");
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].body, json!({"from": "m1"}));
        // Every step is on the record.
        let steps: Vec<String> = s
            .events(&a, None, 0, 1000)
            .expect("events")
            .events
            .iter()
            .filter(|e| e.event.event_type == EventType::QueueMessage)
            .map(|e| e.event.data["state"].as_str().unwrap_or("").to_owned())
            .collect();
        assert_eq!(
            steps,
            [
                "received",
                "duplicate",
                "delivered",
                "retrying",
                "delivered",
                "deadLettered",
                "redriven",
                "delivered",
                "received",
                "acknowledged"
            ]
        );
    }
}

/// A store on a fresh PostgreSQL database whose `ops` and `runs`
/// autovacuum leaves alone (so the planner has no statistics: every table
/// looks one row long and usable indexes tie), with a raw connection to
/// the database.
///
/// (Autovacuum visits a new database within seconds when the server holds
/// many, as while the tests run, and an analysis of a one-page table
/// rightly plans a sequential scan, which the counts below would then
/// take for a statement reading everything.)
fn store_without_statistics() -> (Store, postgres::Client, TempPostgres) {
    let pg = TempPostgres::create().expect("PostgreSQL (see backends())");
    let store = Store::open(&pg.url).expect("postgres store");
    let mut raw = raw_connection(&pg);
    raw.batch_execute(
        "ALTER TABLE ops SET (autovacuum_enabled = false);
         ALTER TABLE runs SET (autovacuum_enabled = false);",
    )
    .expect("autovacuum off");
    (store, raw, pg)
}

/// A connection of the test's own to `pg`, beside the store's.
fn raw_connection(pg: &TempPostgres) -> postgres::Client {
    pg.url
        .parse::<postgres::Config>()
        .expect("url")
        .connect(postgres::NoTls)
        .expect("connect")
}

/// Rows of `table` read (by sequential and index scans) over the life of
/// `store`, once `inserted` rows are counted (each connection reports its
/// counters when it closes).
fn rows_read(store: Store, raw: &mut postgres::Client, table: &str, inserted: i64) -> i64 {
    drop(store);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // (Each statement is a transaction of its own: fresh figures.)
        let row = raw
            .query_one(
                "SELECT n_tup_ins, COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) AS read
                 FROM pg_stat_user_tables WHERE relname = $1",
                &[&table],
            )
            .expect("counters");
        let (ins, read): (i64, i64) = (row.get("n_tup_ins"), row.get("read"));
        if ins >= inserted {
            return read;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{table}: {ins} of {inserted} inserts counted"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// On PostgreSQL, a long run's operations are found by index, not by
/// reading the run: queued, looked up by id, handed out, answered and
/// counted, a run's 200 operations read a few rows each from `ops`. This
/// holds before the planner has any statistics; with the indexes before
/// migration V13, the lookups went through an index by run and read every
/// earlier op of the run, 100,500 rows over these 200 ops. (PostgreSQL's
/// planner only: SQLite's prefers a fully matched unique key without
/// statistics.)
#[test]
fn a_long_runs_ops_are_read_by_index_before_any_statistics() {
    const OPS: i64 = 200;
    let (store, mut raw, _pg) = store_without_statistics();
    let a = held_run(&store, 1, 20, 600_000);
    let empty = json!({});
    for i in 0..OPS {
        let id = format!("op-{i:03}");
        store
            .insert_op(&queued(&a, &id, &empty), 21)
            .unwrap()
            .expect("queued");
        assert_eq!(store.op(&a, "r", &id).unwrap().expect("op").n, i + 1);
        let op = store
            .dispatch_op(&a, "runner-1", "r", 22)
            .unwrap()
            .expect("handed out");
        assert_eq!(op.id, id);
        assert!(answer(&store, &a, &id, 23));
        let (_, open) = store.run_with_open_ops(&a, "r").unwrap().expect("run");
        assert_eq!(open, 0);
    }
    let read = rows_read(store, &mut raw, "ops", OPS);
    assert!(
        read < 10 * OPS,
        "{read} rows of ops read for {OPS} operations: a statement reads the whole run"
    );
}

/// On PostgreSQL, an org's runs are found by index, not by reading the
/// org's runs: 200 runs created, looked up, claimed and renewed one after
/// another, each asked to finish and finished 50 runs later (so 50 are live
/// at once), read a few rows each from `runs`, before the planner has any
/// statistics. (With the indexes before migration V13, the lookups went
/// through the org's runs by time: 161,147 rows over 200 runs finished one
/// at a time. With a unique index on (org, id) beside the org's runs by
/// time, which of the two a lookup took turned on the indexes' heights:
/// 39,200 rows whenever autovacuum visited the database's other tables
/// meanwhile, as it does while the suite runs.)
#[test]
fn an_orgs_runs_are_read_by_index_before_any_statistics() {
    const RUNS: i64 = 200;
    const LIVE: i64 = 50;
    let (store, mut raw, _pg) = store_without_statistics();
    let a = org(&store, "a");
    let id = |i: i64| format!("run-{i:03}");
    for i in 0..RUNS {
        run(&store, &a, &id(i), 1);
        assert!(store.run(&a, &id(i)).unwrap().is_some());
        let claimed = store
            .claim_run(&a, "test", "runner-1", "m", 20, 60_000)
            .unwrap()
            .expect("claimed");
        assert_eq!(claimed.run.id, id(i));
        assert!(
            store
                .renew_lease(&a, "runner-1", &id(i), 21, 60_000)
                .unwrap()
                .is_some()
        );
        if i >= LIVE {
            let done = id(i - LIVE);
            assert!(store.request_finish(&a, &done, 22).unwrap().is_some());
            assert!(
                store
                    .finish_run(&a, "runner-1", &done, (RunState::Succeeded, None), &[], 23)
                    .unwrap()
            );
        }
    }
    let read = rows_read(store, &mut raw, "runs", RUNS);
    assert!(
        read < 20 * RUNS,
        "{read} rows of runs read for {RUNS} runs: a statement reads the org's runs"
    );
}

/// On PostgreSQL the pool's connections plan a statement generically from
/// its first use, not five times for its parameters first (each pooled
/// connection prepares its statements anew after a table doubled). The
/// tests that count rows read on a fresh database (above) hold with it.
#[test]
fn pooled_connections_plan_generically_from_a_statements_first_use() {
    let b = postgres_backend();
    let mode = b
        .store
        .read(|tx| tx.query_one("SELECT current_setting('plan_cache_mode') AS mode", &[]))
        .unwrap()
        .expect("a row");
    assert_eq!(mode.text("mode").unwrap(), "force_generic_plan");
}

/// On PostgreSQL, a lookup planned while its table was one page long is
/// planned again once the table has grown, without waiting for new
/// statistics: a run looked up by key often enough for the plan to settle
/// (a sequential scan, rightly, for one page), then 3,000 runs added,
/// then the same lookup 200 times reads a few hundred rows of `runs`, not
/// 600,000 (one whole table a lookup, as the settled plan did before the
/// store looked at its tables' sizes).
#[test]
fn a_lookups_plan_follows_its_tables_growth() {
    const ADDED: i64 = 3_000;
    const LOOKUPS: i64 = 200;
    let (store, mut raw, _pg) = store_without_statistics();
    let a = org(&store, "a");
    run(&store, &a, "run-0", 1);
    // Statistics of a one-row table, as autovacuum takes them on a new
    // database, and no other while the table grows.
    raw.batch_execute("ANALYZE runs").expect("analyze");
    for _ in 0..20 {
        assert!(store.run(&a, "run-0").unwrap().is_some());
    }
    // Grown behind the store's back, in one statement of its own.
    let added = raw
        .execute(
            "INSERT INTO runs SELECT (json_populate_record(r,
                 json_build_object('id', 'bulk-' || g))).*
             FROM runs r, generate_series(1, $1::bigint) g WHERE r.id = 'run-0'",
            &[&ADDED],
        )
        .expect("bulk insert");
    assert_eq!(added, ADDED as u64);
    // The store looks at its tables' sizes at most once a second.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    for _ in 0..LOOKUPS {
        assert!(store.run(&a, "run-0").unwrap().is_some());
    }
    let read = rows_read(store, &mut raw, "runs", ADDED + 1);
    assert!(
        read < 5 * LOOKUPS,
        "{read} rows of runs read, {LOOKUPS} lookups by key of a run among {} of them",
        ADDED + 1
    );
}

/// What deciding an op reads, in one statement: the run, its org's name,
/// the manifest it decides under (the environment's current one until a
/// claim pins the run's own, revoked or not) and the org's secrets, by
/// name; nothing for another org's run.
#[test]
fn an_ops_context_is_its_run_its_manifest_and_its_orgs_secrets() {
    for b in backends() {
        let s = &b.store;
        let a = org(s, "a");
        let other = org(s, "other");
        run(s, &a, "r", 1);
        let context = |org: &str| s.op_context(org, "r").unwrap();
        let bare = context(&a).expect("context");
        assert_eq!(
            (bare.run.id.as_str(), bare.org_name.as_str()),
            ("r", "a"),
            "{}",
            s.backend()
        );
        assert!(
            bare.manifest.is_none() && bare.secrets.is_empty() && bare.runner_classes.is_none()
        );
        assert!(
            context(&other).is_none(),
            "{}: another org's run",
            s.backend()
        );

        let manifest = |hash: &str, published: i64, key: &str| moat_store::ManifestRow {
            hash: hash.into(),
            environment: "test".into(),
            signed: format!("{{\"{hash}\": true}}"),
            signed_by: key.into(),
            expires_ms: 10_000,
            published_ms: published,
            revoked: false,
        };
        s.publish_manifest(&a, &manifest("m1", 1, "k1")).unwrap();
        s.publish_manifest(&a, &manifest("m2", 2, "k2")).unwrap();
        s.publish_manifest(&other, &manifest("m3", 3, "k3"))
            .unwrap();
        s.put_secret(&a, "zeta", b"n2", b"c2", 5).unwrap();
        s.put_secret(&a, "alpha", b"n1", b"c1", 4).unwrap();
        s.put_secret(&other, "beta", b"n3", b"c3", 6).unwrap();
        let current = context(&a).expect("context");
        assert_eq!(
            current.manifest,
            Some(manifest("m2", 2, "k2")),
            "{}",
            s.backend()
        );
        let names: Vec<_> = current.secrets.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["alpha", "zeta"], "{}", s.backend());
        assert_eq!(
            (
                current.secrets[0].nonce.as_slice(),
                current.secrets[0].ciphertext.as_slice()
            ),
            (&b"n1"[..], &b"c1"[..])
        );
        assert_eq!(current.secrets[1].updated_ms, 5);
        s.revoke_signing_key(&a, "k2").unwrap();
        assert_eq!(
            context(&a).unwrap().manifest.unwrap().hash,
            "m1",
            "{}",
            s.backend()
        );

        // Claimed under m2, the run keeps deciding under m2.
        s.claim_run(&a, "test", "runner-1", "m2", 20, 60_000)
            .unwrap()
            .expect("claim");
        let claimed = context(&a).expect("context");
        assert_eq!(
            claimed.manifest.expect("pinned").hash,
            "m2",
            "{}",
            s.backend()
        );
        assert_eq!(claimed.secrets.len(), 2);
    }
}

/// `runner-1`'s claim in `org`'s environment `test` at time 20, with
/// nothing reserved.
fn runner_1_asks(org: &str, oldest_only: bool) -> ClaimAsk<'_> {
    ClaimAsk {
        org,
        environment: "test",
        runner: "runner-1",
        manifest_hash: "m",
        now: 20,
        lease_ms: 1_000,
        cpu_millis: 0,
        memory_bytes: 0,
        oldest_only,
    }
}

/// On PostgreSQL a claim skips a queued run that another writer holds
/// locked for the moment (its finish being asked as it is claimed), and
/// says so: no change may follow to wake the claim, so it must look again
/// itself. Once the lock is gone the run is taken, and with nothing left
/// the answer is that there is nothing.
#[test]
fn a_claim_says_when_a_run_it_could_take_is_locked() {
    let pg = TempPostgres::create().expect("PostgreSQL (see backends())");
    let store = Store::open(&pg.url).expect("postgres store");
    let mut raw = raw_connection(&pg);
    let a = org(&store, "a");
    run(&store, &a, "r", 1);
    let ask = runner_1_asks(&a, false);
    let claim = || store.claim(&ask, &mut |_| Ok(None)).expect("claim");
    let mut holding = raw.transaction().expect("begin");
    holding
        .execute("SELECT 1 FROM runs WHERE id = 'r' FOR UPDATE", &[])
        .expect("lock");
    assert!(matches!(claim(), ClaimLook::Locked));
    holding.commit().expect("commit");
    match claim() {
        ClaimLook::Took(claimed) => assert_eq!(claimed.run.id, "r"),
        other => panic!("the unlocked run is taken: {other:?}"),
    }
    assert!(matches!(claim(), ClaimLook::Nothing));
}

/// A claim that looks at the oldest queued run only (the placement policy
/// places anywhere) locks no other: an agent's write to the next queued
/// run (its finish) does not wait for the claim, as it does while a claim
/// holds every candidate the policy may pass over for it.
#[test]
fn a_claim_for_the_oldest_run_only_locks_no_other_queued_run() {
    let pg = TempPostgres::create().expect("PostgreSQL (see backends())");
    let store = Store::open(&pg.url).expect("postgres store");
    let mut raw = raw_connection(&pg);
    for (name, oldest_only) in [("a", true), ("b", false)] {
        let org_id = org(&store, name);
        let (older, younger) = (format!("{name}-older"), format!("{name}-younger"));
        run_at(&store, &org_id, &older, 1, 11);
        run_at(&store, &org_id, &younger, 1, 12);
        let ask = runner_1_asks(&org_id, oldest_only);
        let mut placed = Vec::new();
        let mut younger_locked = None;
        let look = store
            .claim(&ask, &mut |candidate| {
                placed.push(candidate.run.id.clone());
                // Another session's write to the younger run, while the
                // claim's transaction is open.
                let write = raw.query(
                    "SELECT 1 FROM runs WHERE id = $1 FOR UPDATE NOWAIT",
                    &[&younger],
                );
                younger_locked = Some(match write {
                    Ok(_) => false,
                    Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                        true
                    }
                    Err(e) => panic!("the younger run's lock: {e}"),
                });
                Ok(None)
            })
            .expect("claim");
        match look {
            ClaimLook::Took(claimed) => assert_eq!(claimed.run.id, older, "oldest first"),
            other => panic!("the oldest run is taken: {other:?}"),
        }
        assert_eq!(
            placed,
            std::slice::from_ref(&older),
            "placed once, the oldest"
        );
        assert_eq!(
            younger_locked,
            Some(!oldest_only),
            "oldest_only: {oldest_only}"
        );
        // The younger run is still queued and is the next claim's.
        match store.claim(&ask, &mut |_| Ok(None)).expect("claim") {
            ClaimLook::Took(claimed) => assert_eq!(claimed.run.id, younger),
            other => panic!("the younger run is taken next: {other:?}"),
        }
    }
}

#[test]
fn a_run_event_is_appended_only_to_a_run_of_the_org() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 20, 60_000);
        let other = org(s, "b");
        let destroyed = |run: &str| {
            moat_store::typed_event(
                moat_core::EventData::RunDestroyed(moat_core::event_data::RunDestroyed {
                    runner_id: "runner-1".into(),
                    ok: true,
                    checks: Vec::new(),
                }),
                run,
                30,
            )
        };
        let before = s.all_events(0, 100_000).unwrap().len();
        assert!(!s.append_run_event(&a, &destroyed("nope")).unwrap());
        assert!(!s.append_run_event(&other, &destroyed("r")).unwrap());
        assert_eq!(s.all_events(0, 100_000).unwrap().len(), before);
        assert!(s.append_run_event(&a, &destroyed("r")).unwrap());
        assert_eq!(
            event_types(s, "r").last().map(String::as_str),
            Some("run.destroyed"),
            "{}",
            s.backend()
        );
        assert!(s.verify_ledger().unwrap().is_ok(), "{}", s.backend());
    }
}

/// The PostgreSQL backend of [`backends`], for what only it can show.
fn postgres_backend() -> Backend {
    backends()
        .into_iter()
        .find(|b| b.store.backend() == "postgres")
        .expect("the PostgreSQL backend")
}

/// Whether, within about 10 s, at least `n` sessions on the database at
/// `url` wait for a lock (a row another writer holds).
fn lock_waiters_reach(url: &str, n: i64) -> bool {
    let mut watcher = postgres::Client::connect(url, postgres::NoTls).expect("connect");
    (0..1000).any(|_| {
        let row = watcher
            .query_one(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .expect("pg_stat_activity");
        let waiting: i64 = row.get(0);
        waiting >= n || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        }
    })
}

/// PostgreSQL only (SQLite has one connection, no pool): more store calls
/// at once than the pool opens connections; those beyond it wait for a
/// connection and each is woken as one comes back.
#[test]
fn store_calls_beyond_the_pools_connections_wait_and_all_complete() {
    let b = postgres_backend();
    let s = Arc::clone(&b.store);
    let a = org(&s, "a");
    run(&s, &a, "r", 1);
    // The run's row held by another writer: every call below blocks on
    // it, holding its connection, until that writer commits.
    let mut writer = postgres::Client::connect(&b.url, postgres::NoTls).expect("connect");
    let mut holding = writer.transaction().expect("begin");
    holding
        .execute("UPDATE runs SET updated_ms = 11 WHERE id = 'r'", &[])
        .expect("lock the run");
    const CALLS: i64 = 40;
    let (done, finished) = std::sync::mpsc::channel();
    for i in 0..CALLS {
        let (s, a, done) = (Arc::clone(&s), a.clone(), done.clone());
        std::thread::spawn(move || {
            let asked = s.request_finish(&a, "r", 20 + i).map(|run| run.is_some());
            let _ = done.send(asked);
        });
    }
    // The pool full: 32 calls wait for the row, the rest for a connection.
    assert!(
        lock_waiters_reach(&b.url, 32),
        "the pool's connections never all waited on the row"
    );
    holding.commit().expect("commit");
    for _ in 0..CALLS {
        let asked = finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("a store call waiting for a connection was never woken");
        assert!(asked.expect("request_finish"));
    }
}

/// PostgreSQL only: on SQLite one transaction writes at a time, so no
/// op's result can be half-written as a run ends.
#[test]
fn a_run_ended_while_its_ops_result_is_being_recorded_counts_the_result() {
    let b = postgres_backend();
    let s = Arc::clone(&b.store);
    let a = held_run(&s, 1, 20, 60_000);
    let empty = json!({});
    s.insert_op(&queued(&a, "o", &empty), 21)
        .unwrap()
        .expect("op");
    s.dispatch_op(&a, "runner-1", "r", 22)
        .unwrap()
        .expect("dispatched");
    // Another writer records the op's result and has not committed when
    // the run's end begins: the end waits for it, then leaves the op
    // succeeded, as it became.
    let mut writer = postgres::Client::connect(&b.url, postgres::NoTls).expect("connect");
    let mut result = writer.transaction().expect("begin");
    result
        .execute(
            "UPDATE ops SET state = 'succeeded' WHERE run_id = 'r' AND id = 'o'",
            &[],
        )
        .expect("the op's result");
    let ending = {
        let (s, a) = (Arc::clone(&s), a.clone());
        std::thread::spawn(move || s.force_end_run(&a, "r", RunState::Failed, "operator", 30))
    };
    // Until the end's statement waits for the op's row.
    assert!(
        lock_waiters_reach(&b.url, 1),
        "the run's end never waited for the op's row"
    );
    result.commit().expect("commit");
    assert!(ending.join().expect("the end's thread").unwrap());
    assert_eq!(
        s.op(&a, "r", "o").unwrap().expect("op").state,
        OpState::Succeeded
    );
    let usage = usage_of_r(&s);
    assert_eq!(usage["ops"], json!({"succeeded": 1}));
    let day = s.usage_days(&a, 1).unwrap();
    assert_eq!(
        day.iter()
            .map(|d| (d.ops, d.ops_failed))
            .collect::<Vec<_>>(),
        [(1, 0)]
    );
    assert!(s.verify_ledger().unwrap().is_ok());
}

/// PostgreSQL only (as above). An operation being queued holds its run's
/// row (its number comes from the run's counter) and has not committed
/// when the run's finish begins: the finish waits for it, then fails the
/// new operation too. (Ending the run in the statement that found it live,
/// with no read and lock before, missed it: that statement's snapshot was
/// taken before the operation committed, and the operation stayed queued
/// on an ended run.)
#[test]
fn a_run_finished_while_an_op_is_being_queued_fails_that_op_too() {
    let b = postgres_backend();
    let s = Arc::clone(&b.store);
    let a = held_run(&s, 1, 20, 60_000);
    let empty = json!({});
    s.insert_op(&queued(&a, "o1", &empty), 21)
        .unwrap()
        .expect("op");
    let mut writer = postgres::Client::connect(&b.url, postgres::NoTls).expect("connect");
    let mut queuing = writer.transaction().expect("begin");
    let n: i64 = queuing
        .query_one(
            "UPDATE runs SET last_op_n = last_op_n + 1 WHERE id = 'r' RETURNING last_op_n",
            &[],
        )
        .expect("the run's counter")
        .get(0);
    queuing
        .execute(
            "INSERT INTO ops SELECT (json_populate_record(o,
                 json_build_object('id', 'o2', 'n', $1::bigint))).*
             FROM ops o WHERE o.run_id = 'r' AND o.id = 'o1'",
            &[&n],
        )
        .expect("the second op");
    let finishing = {
        let (s, a) = (Arc::clone(&s), a.clone());
        std::thread::spawn(move || {
            s.finish_run(&a, "runner-1", "r", (RunState::Succeeded, None), &[], 30)
        })
    };
    assert!(
        lock_waiters_reach(&b.url, 1),
        "the finish never waited for the run's row"
    );
    queuing.commit().expect("commit");
    assert!(finishing.join().expect("the finish's thread").unwrap());
    for op in ["o1", "o2"] {
        assert_eq!(
            s.op(&a, "r", op).unwrap().expect("op").state,
            OpState::Failed,
            "{op}"
        );
    }
    assert_eq!(usage_of_r(&s)["ops"], json!({"failed": 2}));
    assert!(s.verify_ledger().unwrap().is_ok());
}

#[test]
fn a_new_runs_context_is_what_its_separate_reads_say() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 20, 60_000);
        let context =
            |env: &str, pinned: Option<&str>| s.new_run_context(&a, env, pinned, 30).unwrap();
        // Nothing set: the org's name, its (one) runner-less context.
        let bare = context("prod", None);
        assert_eq!(bare.org_name.as_deref(), Some("a"), "{}", s.backend());
        assert!(bare.secrets.is_empty() && bare.manifest.is_none());
        assert!(bare.quota_reached.is_none());
        for (hash, published, key) in [("m1", 1, "k1"), ("m2", 2, "k2")] {
            s.publish_manifest(&a, &prod_manifest(hash, published, key))
                .unwrap();
        }
        s.put_secret(&a, "zeta", b"n1", b"c1", 3).unwrap();
        s.put_secret(&a, "alpha", b"n2", b"c2", 4).unwrap();
        // One run is held (held_run): a quota of one concurrent run is
        // reached.
        let quota: moat_core::quota::Quota =
            serde_json::from_value(json!({"concurrentRuns": 1})).expect("quota");
        s.set_quota(&a, &quota, 5).unwrap();
        // Its runners, registered out of id order (the list is oldest
        // first, whatever their environment); another org's is not its.
        let b_org = org(s, "b");
        for (org, id, registered_ms, environment, classes) in [
            (&a, "w-2", 7, "test", 3),
            (&a, "w-1", 8, "prod", 1),
            (&b_org, "w-0", 6, "test", 1),
        ] {
            s.register_runner(&RunnerRow {
                registered_ms,
                environment: environment.into(),
                classes,
                ..runner_on(org, id, None)
            })
            .unwrap();
        }
        // One draining: read as it is.
        assert!(s.drain_runner(&a, "w-1").unwrap());
        for (env, pinned) in [("prod", None), ("prod", Some("m1")), ("test", None)] {
            let got = context(env, pinned);
            let (name, secrets) = s.org_name_and_secrets(&a).unwrap();
            let manifest = match pinned {
                Some(hash) => s.manifest(&a, hash).unwrap(),
                None => s.current_manifest(&a, env).unwrap(),
            };
            assert_eq!(got.org_name, name, "{}", s.backend());
            assert_eq!(
                got.secrets.iter().map(|x| &x.name).collect::<Vec<_>>(),
                ["alpha", "zeta"]
            );
            assert_eq!(
                format!("{:?}", got.secrets),
                format!("{secrets:?}"),
                "{}",
                s.backend()
            );
            assert_eq!(
                got.manifest.as_ref().map(|m| m.hash.as_str()),
                manifest.as_ref().map(|m| m.hash.as_str()),
                "{env} {pinned:?} {}",
                s.backend()
            );
            assert_eq!(
                got.quota_reached.as_ref().map(|(e, _)| e.to_string()),
                s.quota_reached(&a, 30).unwrap().map(|(e, _)| e.to_string()),
            );
            assert!(got.quota_reached.is_some(), "{}", s.backend());
            assert_eq!(
                got.runners
                    .iter()
                    .map(|w| (w.id.as_str(), w.environment.as_str()))
                    .collect::<Vec<_>>(),
                [("w-2", "test"), ("w-1", "prod")],
                "{}",
                s.backend()
            );
            assert_eq!(
                got.runners,
                s.runner_presence(&a).unwrap(),
                "{}",
                s.backend()
            );
            assert_eq!(
                got.runners
                    .iter()
                    .map(|w| (w.classes, w.draining))
                    .collect::<Vec<_>>(),
                [(3, false), (1, true)],
                "{}",
                s.backend()
            );
        }
        assert_eq!(
            context("prod", None).manifest.map(|m| m.hash),
            Some("m2".to_owned())
        );
        // No such org: nothing.
        let none = s.new_run_context("no-such-org", "prod", None, 30).unwrap();
        assert!(none.org_name.is_none() && none.secrets.is_empty() && none.manifest.is_none());
    }
}

#[test]
fn a_finish_with_its_teardown_records_the_teardown_last_ended_or_not() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 20, 60_000);
        let torn_down = moat_store::typed_event(
            moat_core::EventData::RunDestroyed(moat_core::event_data::RunDestroyed {
                runner_id: "runner-1".into(),
                ok: true,
                checks: Vec::new(),
            }),
            "r",
            30,
        );
        let finish = |run: &str| {
            s.finish_torn_down_run(
                &a,
                "runner-1",
                run,
                (RunState::Succeeded, None),
                &[],
                &torn_down,
                30,
            )
            .unwrap()
        };
        let other = org(s, "b");
        let before = s.all_events(0, 100_000).unwrap().len();
        assert_eq!(finish("nope"), None, "{}", s.backend());
        // Another org's runner: its run is not there, whatever its id.
        let theirs = s
            .finish_torn_down_run(
                &other,
                "runner-1",
                "r",
                (RunState::Failed, None),
                &[],
                &torn_down,
                30,
            )
            .unwrap();
        assert_eq!(theirs, None, "{}", s.backend());
        assert_eq!(s.all_events(0, 100_000).unwrap().len(), before);
        assert_eq!(
            s.run(&a, "r").unwrap().expect("run").state,
            RunState::Claimed
        );
        assert_eq!(finish("r"), Some(true), "{}", s.backend());
        assert_eq!(
            s.run(&a, "r").unwrap().expect("run").state,
            RunState::Succeeded
        );
        let types = event_types(s, "r");
        assert!(
            types.ends_with(&[
                "run.usage".into(),
                "run.finished".into(),
                "run.destroyed".into()
            ]),
            "{types:?} {}",
            s.backend()
        );
        // Sent again (its answer lost): the finish records nothing more,
        // the teardown is recorded as a second report of it would be.
        assert_eq!(finish("r"), Some(false), "{}", s.backend());
        let again = event_types(s, "r");
        assert_eq!(again.len(), types.len() + 1, "{again:?}");
        assert_eq!(again.last().map(String::as_str), Some("run.destroyed"));
        assert!(s.verify_ledger().unwrap().is_ok(), "{}", s.backend());
    }
}

/// Appends from several connections at once, of one event or several (on
/// PostgreSQL the database computes the chain in the statement that
/// appends up to eight; more go in batches after the head is locked):
/// one chain, every event in it once, each linked to the one before.
#[test]
fn concurrent_appends_make_one_chain() {
    for b in backends() {
        let a = org(&b.store, "a");
        let before = b.store.all_events(0, 100_000).unwrap().len();
        let handles: Vec<_> = (0..4)
            .map(|t: usize| {
                let s = Arc::clone(&b.store);
                let a = a.clone();
                std::thread::spawn(move || {
                    let mut appended = 0;
                    for i in 0..20 {
                        let n = [1, 3, 12][(i + t) % 3];
                        let events: Vec<_> = (0..n)
                            .map(|k| {
                                moat_store::typed_event(
                                    moat_core::EventData::RunReleased(
                                        moat_core::event_data::RunReleased {
                                            runner_id: format!("w{t}"),
                                            attempts: k as i64,
                                        },
                                    ),
                                    &format!("rün-{t}-{i}"),
                                    1,
                                )
                            })
                            .collect();
                        let stored = s.append_events(&a, &events).expect("append");
                        assert_eq!(stored.len(), n);
                        for pair in stored.windows(2) {
                            assert_eq!(pair[1].seq, pair[0].seq + 1);
                            assert_eq!(pair[1].prev_hash, pair[0].hash);
                        }
                        appended += n;
                    }
                    appended
                })
            })
            .collect();
        let appended: usize = handles
            .into_iter()
            .map(|h| h.join().expect("appender"))
            .sum();
        let all = b.store.all_events(0, 100_000).unwrap();
        assert_eq!(all.len(), before + appended, "{}", b.store.backend());
        assert!(
            all.windows(2).all(|p| p[1].prev_hash == p[0].hash),
            "{}",
            b.store.backend()
        );
        assert!(
            b.store.verify_ledger().unwrap().is_ok(),
            "{}",
            b.store.backend()
        );
    }
}

/// A runner `id` of `org` on `host` (build `h`, manifest `m` of
/// environment `test`, key `k`; it stands once the caller allows both).
fn runner_on(org: &str, id: &str, host: Option<&str>) -> RunnerRow {
    RunnerRow {
        host_id: host.map(str::to_owned),
        ..moat_store::runner_row(org, id)
    }
}

/// Org `name` where a runner of [`runner_on`] stands (its build allowed,
/// its manifest published); the org's id.
fn org_runners_stand_in(s: &Store, name: &str) -> String {
    let id = org(s, name);
    s.allow_runner_build(&id, "h", "1", 1).unwrap();
    s.publish_manifest(
        &id,
        &moat_store::ManifestRow {
            environment: "test".into(),
            ..prod_manifest("m", 1, "k")
        },
    )
    .unwrap();
    id
}

/// A standing runner's claim (on PostgreSQL the queued runs are read with
/// its figures) is offered the queued runs oldest first, whatever their
/// ids, passes over those the placement policy refuses, and takes the
/// first it allows.
#[test]
fn a_standing_runners_claim_is_offered_the_oldest_queued_runs_first() {
    for b in backends() {
        let s = &b.store;
        let acme = org_runners_stand_in(s, "acme");
        for id in ["w1", "w2"] {
            s.register_runner(&runner_on(&acme, id, None)).unwrap();
        }
        for (id, now) in [("r-c", 11), ("r-a", 12), ("r-b", 13)] {
            run_at(s, &acme, id, 1, now);
        }
        let claim = |runner: &str, refused: &[&str]| {
            let ask = ClaimAsk {
                org: &acme,
                environment: "test",
                runner,
                manifest_hash: "m",
                now: 20,
                lease_ms: 60_000,
                cpu_millis: 0,
                memory_bytes: 0,
                oldest_only: false,
            };
            let mut offered = Vec::new();
            let look = s
                .claim(&ask, &mut |candidate| {
                    offered.push(candidate.run.id.clone());
                    Ok(refused.contains(&candidate.run.id.as_str()).then(|| {
                        moat_store::PlacementRefusal {
                            reason: "placement_waiting: refused by the test".into(),
                            policies: Vec::new(),
                        }
                    }))
                })
                .unwrap();
            let took = match look {
                ClaimLook::Took(claimed) => Some(claimed.run.id),
                _ => None,
            };
            (offered, took)
        };
        let backend = s.backend();
        assert_eq!(
            claim("w1", &["r-c"]),
            (
                vec!["r-c".to_owned(), "r-a".to_owned()],
                Some("r-a".to_owned())
            ),
            "{backend}"
        );
        assert_eq!(
            claim("w2", &["r-c", "r-b"]),
            (vec!["r-c".to_owned(), "r-b".to_owned()], None),
            "{backend}"
        );
    }
}

/// What the placement policy is told about a claiming runner's host: the
/// names of the other orgs whose runs runners on that host hold now
/// (runners that named no host count as one host), its own org never.
#[test]
fn a_claim_tells_placement_the_other_tenants_of_the_runners_host() {
    for b in backends() {
        let s = &b.store;
        let orgs: Vec<String> = ["acme", "globex", "initech"]
            .iter()
            .map(|name| org_runners_stand_in(s, name))
            .collect();
        let (acme, globex, initech) = (&orgs[0], &orgs[1], &orgs[2]);
        for (org, id, host) in [
            (globex, "g1", Some("host-1")),
            (initech, "i0", None),
            (acme, "a1", Some("host-1")),
            (acme, "a2", Some("host-2")),
            (acme, "a0", None),
        ] {
            s.register_runner(&runner_on(org, id, host)).unwrap();
        }
        // globex holds a run on host-1, initech one on a runner of no host.
        run(s, globex, "g-run", 1);
        run(s, initech, "i-run", 1);
        assert!(
            s.claim_run(globex, "test", "g1", "m", 2, 60_000)
                .unwrap()
                .is_some()
        );
        assert!(
            s.claim_run(initech, "test", "i0", "m", 2, 60_000)
                .unwrap()
                .is_some()
        );
        let seen = |runner: &str, id: &str| {
            run(s, acme, id, 1);
            let mut tenants = None;
            let ask = ClaimAsk {
                org: acme,
                environment: "test",
                runner,
                manifest_hash: "m",
                now: 3,
                lease_ms: 60_000,
                cpu_millis: 0,
                memory_bytes: 0,
                oldest_only: false,
            };
            let look = s
                .claim(&ask, &mut |candidate| {
                    tenants = Some(candidate.tenants.to_vec());
                    Ok(None)
                })
                .unwrap();
            assert!(matches!(look, ClaimLook::Took(_)), "{}", s.backend());
            tenants.expect("placement asked")
        };
        assert_eq!(seen("a1", "a-1"), ["globex"], "{}", s.backend());
        assert!(seen("a2", "a-2").is_empty(), "{}", s.backend());
        assert_eq!(seen("a0", "a-0"), ["initech"], "{}", s.backend());
    }
}

/// A run's end with more events than one statement appends (a runner's
/// finish reports up to thousands): all of them recorded, after the run's
/// usage and end, in one chain.
#[test]
fn a_runs_end_with_many_events_records_them_all() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 1, 20, 60_000);
        let reported: Vec<_> = (0..40).map(|i| op_finished(30 + i)).collect();
        assert!(
            s.finish_run(
                &a,
                "runner-1",
                "r",
                (RunState::Succeeded, None),
                &reported,
                100
            )
            .unwrap(),
            "{}",
            s.backend()
        );
        let types = event_types(s, "r");
        let ended = types
            .iter()
            .position(|t| t == "run.finished")
            .expect("run.finished");
        assert_eq!(types[ended - 1], "run.usage", "{}", s.backend());
        assert_eq!(
            types[ended + 1..]
                .iter()
                .filter(|t| *t == "op.finished")
                .count(),
            40,
            "{}",
            s.backend()
        );
        assert!(s.verify_ledger().unwrap().is_ok(), "{}", s.backend());
    }
}

/// PostgreSQL only (SQLite has one connection, no pool): a store call that
/// panics (a handler's panic is caught, the server goes on) gives its
/// connection's slot back, and what it wrote before panicking is not kept.
/// More panics than the pool has connections, then store calls still
/// complete.
#[test]
fn store_calls_that_panic_give_their_connections_back_and_keep_nothing() {
    let b = postgres_backend();
    let s = Arc::clone(&b.store);
    let a = org(&s, "a");
    run(&s, &a, "r", 1);
    let (done, answered) = std::sync::mpsc::channel();
    let owner = a.clone();
    // On a thread of its own: with slots lost, a call waits for ever.
    std::thread::spawn(move || {
        // Each panic prints its message: the hook is the whole test binary's.
        for i in 0..40 {
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if i % 2 == 0 {
                    let _ = s.read(|_| -> Result<(), moat_store::StoreError> {
                        panic!("a reader's bug")
                    });
                } else {
                    let _ = s.tx(|tx| -> Result<(), moat_store::StoreError> {
                        tx.execute("UPDATE runs SET updated_ms = 99 WHERE id = 'r'", &[])?;
                        panic!("a writer's bug, after its write")
                    });
                }
            }));
            assert!(panicked.is_err(), "call {i} did not panic");
        }
        let _ = done.send(s.run(&owner, "r").map(|r| r.map(|r| r.updated_ms)));
    });
    let updated = answered
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("store calls after panics waited for connections that never came back");
    assert_eq!(
        updated.expect("run").expect("the run"),
        10,
        "a panicked transaction's write was kept"
    );
}

/// A claim that was never handed over lapses at once, as a lost lease
/// does, but only that claim: naming an older attempt, or another runner,
/// lapses nothing. Its last attempt's lapse dead-letters the run.
#[test]
fn only_the_claim_named_lapses() {
    for b in backends() {
        let s = &b.store;
        let a = held_run(s, 2, 20, 60_000);
        assert_eq!(s.lapse_claim(&a, "runner-1", "r", 0, 30).unwrap(), None);
        assert_eq!(s.lapse_claim(&a, "runner-2", "r", 1, 30).unwrap(), None);
        assert_eq!(s.run(&a, "r").unwrap().unwrap().state, RunState::Claimed);
        assert_eq!(
            s.lapse_claim(&a, "runner-1", "r", 1, 30).unwrap(),
            Some(RunState::Queued),
            "{}",
            s.backend()
        );
        let again = s.run(&a, "r").unwrap().unwrap();
        assert_eq!((again.state, again.attempts), (RunState::Queued, 1));
        // Claimed again: the first claim's attempt names it no more.
        s.claim_run(&a, "test", "runner-1", "m", 40, 60_000)
            .unwrap()
            .expect("claimed again");
        assert_eq!(s.lapse_claim(&a, "runner-1", "r", 1, 50).unwrap(), None);
        assert_eq!(
            s.lapse_claim(&a, "runner-1", "r", 2, 50).unwrap(),
            Some(RunState::DeadLettered)
        );
        assert_eq!(event_types(s, "r"), LAPSED_TWICE, "{}", s.backend());
    }
}
