#![allow(clippy::expect_used, clippy::unwrap_used)]
//! A runner serves several runs at once, each in a slot of its own: a run
//! waiting for a person's approval or for its agent never keeps another run
//! from starting, the control plane never hands a runner more runs than its
//! slots, and a run nothing happens in is finished (`idle_timeout`) rather
//! than holding a slot for ever. Real `moat serve` and sealed runner
//! processes, on both storage backends.

mod common;

use std::time::{Duration, Instant};

use common::control::*;
use serde_json::{Value, json};

fn create_run(serve: &Serve, token: &str, id: &str) {
    let run = json!({"id": id, "inputs": [
        {"path": "input/data.txt", "content": "hello moat\n"},
        {"path": "input/sensitive/notes.txt", "content": "for approved eyes\n"},
    ]});
    let (status, body) = call("POST", &format!("{}/v1/runs", serve.url), token, Some(run));
    assert_eq!(status, 201, "{body}");
}

/// The agent ends `run`; the runner finishes it and frees its slot.
fn finish(serve: &Serve, token: &str, run: &str) {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs/{run}/finish", serve.url),
        token,
        None,
    );
    assert_eq!(status, 200, "{body}");
    wait_state(serve, token, run, "succeeded");
}

fn wc(serve: &Serve, token: &str, run: &str, id: &str) -> Value {
    let (status, op) = post_op(
        serve,
        token,
        run,
        envelope(
            id,
            "exec_argv",
            json!({"argv": ["/usr/bin/wc", "-c", "input/data.txt"]}),
        ),
    );
    assert_eq!(status, 200, "{op}");
    op
}

/// An operation the test policy sends to a person (`sensitive-read`).
fn ask() -> Value {
    envelope(
        "ask",
        "artifact_read",
        json!({"path": "input/sensitive/notes.txt", "maxBytes": 1000}),
    )
}

fn runner_slots(serve: &Serve, token: &str) -> (i64, i64, i64) {
    let (status, body) = call("GET", &format!("{}/v1/runners", serve.url), token, None);
    assert_eq!(status, 200, "{body}");
    let r = &body["runners"][0];
    (
        r["slots"].as_i64().unwrap(),
        r["slotsUsed"].as_i64().unwrap(),
        r["slotsFree"].as_i64().unwrap(),
    )
}

fn wait_slots_used(serve: &Serve, token: &str, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while runner_slots(serve, token).1 != want {
        assert!(
            Instant::now() < deadline,
            "slots used stayed {:?}, wanted {want}",
            runner_slots(serve, token)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_run_waiting_for_approval_never_keeps_another_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for db in databases(dir.path()) {
        let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let name = format!("runner-{}", db.url.len());
        let _runner = Runner::start_with(&serve, &setup, &acme, &name, &["--slots", "2"]);

        // Run A's operation waits for a person.
        create_run(&serve, &acme, "waits");
        let (status, pending) = call(
            "POST",
            &format!("{}/v1/runs/waits/ops", serve.url),
            &acme,
            Some(ask()),
        );
        assert_eq!(
            (status, pending["state"].as_str()),
            (202, Some("pending_approval")),
            "{pending}"
        );
        wait_state(&serve, &acme, "waits", "running");

        // Run B starts and answers meanwhile, in the second slot.
        create_run(&serve, &acme, "works");
        let op = wc(&serve, &acme, "works", "count");
        assert_eq!(op["state"], "succeeded", "{op}");
        assert!(op["result"].to_string().contains("11"), "{op}");
        assert_eq!(run_state(&serve, &acme, "waits"), "running");
        assert_eq!(runner_slots(&serve, &acme), (2, 2, 0));

        // Both slots are taken: run C is not handed to the runner...
        create_run(&serve, &acme, "third");
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(run_state(&serve, &acme, "third"), "queued");
        // ...until B is finished and its slot is free again.
        finish(&serve, &acme, "works");
        let op = wc(&serve, &acme, "third", "count");
        assert_eq!(op["state"], "succeeded", "{op}");

        // The approval releases A, which then finishes like any other run.
        let approval = pending["approval"]["id"].as_str().unwrap();
        let (status, body) = call(
            "POST",
            &format!("{}/v1/approvals/{approval}/approve", serve.url),
            &acme,
            Some(json!({})),
        );
        assert_eq!(status, 200, "{body}");
        for run in ["waits", "third"] {
            finish(&serve, &acme, run);
        }
        let (_, op) = call(
            "GET",
            &format!("{}/v1/runs/waits/ops/ask", serve.url),
            &acme,
            None,
        );
        assert_eq!(op["state"], "succeeded", "{op}");
        assert!(
            op["result"].to_string().contains("for approved eyes"),
            "{op}"
        );
        wait_slots_used(&serve, &acme, 0);
        assert_ledger_intact(&serve);
    }
}

#[test]
fn a_run_left_open_is_finished_after_the_idle_timeout_unless_it_waits_for_a_person() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for db in databases(dir.path()) {
        let serve = Serve::start_with(
            &setup,
            &db.url,
            "127.0.0.1:0",
            &["--run-idle-timeout", "3s"],
        );
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let name = format!("runner-{}", db.url.len());
        let _runner = Runner::start_with(&serve, &setup, &acme, &name, &["--slots", "2"]);

        // An agent runs one operation and walks away.
        create_run(&serve, &acme, "left-open");
        let op = wc(&serve, &acme, "left-open", "count");
        assert_eq!(op["state"], "succeeded", "{op}");
        // Another waits for a person for longer than the idle timeout.
        create_run(&serve, &acme, "waits");
        let (status, pending) = call(
            "POST",
            &format!("{}/v1/runs/waits/ops", serve.url),
            &acme,
            Some(ask()),
        );
        assert_eq!(status, 202, "{pending}");

        wait_state(&serve, &acme, "left-open", "succeeded");
        let (_, run) = call(
            "GET",
            &format!("{}/v1/runs/left-open", serve.url),
            &acme,
            None,
        );
        assert_eq!(run["error"], "idle_timeout", "{run}");
        let events = run_events(&serve, &acme, "left-open");
        let finished: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "run.finished")
            .collect();
        assert_eq!(finished.len(), 1, "{events:?}");
        assert_eq!(finished[0]["data"]["reason"], "idle_timeout");
        // Its slot is free again; the run waiting for a person is still open.
        wait_slots_used(&serve, &acme, 1);
        std::thread::sleep(Duration::from_secs(4));
        assert_eq!(run_state(&serve, &acme, "waits"), "running");
        assert_ledger_intact(&serve);
    }
}

/// The agent asks to finish `run`, and goes on without waiting for it.
fn ask_finish(serve: &Serve, token: &str, run: &str) {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs/{run}/finish", serve.url),
        token,
        None,
    );
    assert_eq!(status, 200, "{body}");
}

/// A run's last report claims the slot's next run (`thenClaimMs`), which
/// the same slot then serves: the teardown report of a run that ran an
/// operation (its shell torn down after its finish), the finish of one
/// that started nothing (its teardown goes with it). `--max-runs` counts
/// the runs claimed that way: the runner asks for none past it, and stops.
#[test]
fn a_slots_next_run_comes_with_its_runs_last_report_within_max_runs() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for db in databases(dir.path()) {
        let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let name = format!("chain-{}", db.url.len());
        let log = dir.path().join(format!("{name}.log"));
        let extra = ["--slots", "1", "--max-runs", "3"];
        let mut runner = Runner::start_logged(&serve, &setup, &acme, &name, &extra, &log);

        create_run(&serve, &acme, "first");
        let op = wc(&serve, &acme, "first", "count");
        assert_eq!(op["state"], "succeeded", "{op}");
        finish(&serve, &acme, "first");
        wait_run_event(&serve, &acme, "first", "run.destroyed");
        create_run(&serve, &acme, "second");
        finish(&serve, &acme, "second");
        // Two runs queued at once, while the second's finish waits for
        // the next: it takes the third (oldest), the runner's last.
        create_run(&serve, &acme, "third");
        create_run(&serve, &acme, "fourth");
        finish(&serve, &acme, "third");
        ask_finish(&serve, &acme, "fourth");

        assert!(exit_of(&mut runner, Duration::from_secs(30)).success());
        // No ask went past the third run: the fourth was never claimed.
        assert_eq!(run_state(&serve, &acme, "fourth"), "queued");
        assert_eq!(
            count(&run_events(&serve, &acme, "fourth"), "run.claimed"),
            0
        );

        let said = std::fs::read_to_string(&log).unwrap();
        for (run, after) in [("second", "first"), ("third", "second")] {
            assert!(
                said.contains(&format!("claimed run {run} with run {after}'s last report")),
                "{said}"
            );
        }
        for run in ["first", "second", "third"] {
            let types: Vec<String> = run_events(&serve, &acme, run)
                .iter()
                .map(|e| e["type"].as_str().unwrap_or_default().to_owned())
                .collect();
            assert_eq!(count(&run_events(&serve, &acme, run), "run.claimed"), 1);
            assert!(
                types.ends_with(&[
                    "run.usage".into(),
                    "run.finished".into(),
                    "run.destroyed".into()
                ]),
                "{run}: {types:?}"
            );
        }
        assert_ledger_intact(&serve);
    }
}

/// With a slot free and another's run ending, the claiming loop's claim and
/// that run's last report would both ask for a run: `--max-runs` counts the
/// ask in flight, so that only one of them asks for the last run allowed.
#[test]
fn an_ask_in_flight_counts_towards_max_runs() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for db in databases(dir.path()) {
        let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let name = format!("asks-{}", db.url.len());
        let extra = ["--slots", "2", "--max-runs", "2"];
        let mut runner = Runner::start_with(&serve, &setup, &acme, &name, &extra);

        create_run(&serve, &acme, "one");
        finish(&serve, &acme, "one");
        wait_run_event(&serve, &acme, "one", "run.destroyed");
        // Both slots free again, one run left to claim: one ask waits.
        for run in ["two", "three"] {
            create_run(&serve, &acme, run);
            ask_finish(&serve, &acme, run);
        }
        assert!(exit_of(&mut runner, Duration::from_secs(30)).success());
        wait_state(&serve, &acme, "two", "succeeded");
        assert_eq!(run_state(&serve, &acme, "three"), "queued");
        assert_eq!(count(&run_events(&serve, &acme, "three"), "run.claimed"), 0);
        assert_ledger_intact(&serve);
    }
}
