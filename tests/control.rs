#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The managed path end to end, with real processes on both storage
//! backends: `moat serve` (SQLite file, then a PostgreSQL database of its
//! own), a sealed runner started with a bootstrap token, an agent speaking
//! HTTP. Operations are decided by Cedar, executed by the runner's shell
//! under a capability, and recorded once in the control plane's ledger.

mod common;

use std::time::{Duration, Instant};

use common::control::*;
use common::{MOAT, path_str};
use moat_store::TempPostgres;
use serde_json::{Value, json};

#[test]
fn operations_flow_agent_to_runner_and_back_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for db in databases(dir.path()) {
        let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let acme = org(&serve, "acme");
        let other = org(&serve, "other");
        prepare_org(&serve, &setup, &acme);
        let runner = Runner::start(&serve, &setup, &acme, &format!("runner-{}", db.url.len()));

        let run = json!({"id": "run-1", "inputs": [
            {"path": "input/data.txt", "content": "hello moat\n"},
            {"path": "input/secret.txt", "content": "do not read\n"},
        ]});
        let (status, body) = call("POST", &format!("{}/v1/runs", serve.url), &acme, Some(run));
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["state"], "queued");

        // Allowed operations run on the runner, under their capability.
        let (status, op) = post_op(
            &serve,
            &acme,
            "run-1",
            envelope(
                "1",
                "artifact_read",
                json!({"path": "input/data.txt", "maxBytes": 1000}),
            ),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "{op}"
        );
        assert_eq!(op["result"]["status"], "ok", "{op}");
        assert!(op["result"].to_string().contains("hello moat"), "{op}");
        let (status, op) = post_op(
            &serve,
            &acme,
            "run-1",
            envelope(
                "2",
                "exec_argv",
                json!({"argv": ["/usr/bin/wc", "-c", "input/data.txt"]}),
            ),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "{op}"
        );
        assert!(op["result"].to_string().contains("11"), "{op}");
        let (status, op) = post_op(
            &serve,
            &acme,
            "run-1",
            envelope(
                "3",
                "artifact_write",
                json!({"path": "output/report.md", "content": "# report\n", "maxBytes": 1000}),
            ),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "{op}"
        );

        // A program with network waits for a person; denied, it never runs.
        let (status, pending) = call(
            "POST",
            &format!("{}/v1/runs/run-1/ops", serve.url),
            &acme,
            Some(envelope(
                "4",
                "exec_argv",
                json!({"argv": ["/usr/bin/python3", "-c", "1"], "network": "allowlist"}),
            )),
        );
        assert_eq!(
            (status, pending["state"].as_str()),
            (202, Some("pending_approval")),
            "{pending}"
        );
        let approval = pending["approval"]["id"].as_str().unwrap();
        let (status, body) = call(
            "POST",
            &format!("{}/v1/approvals/{approval}/deny", serve.url),
            &acme,
            Some(json!({"reason": "no network for this run"})),
        );
        assert_eq!(
            (status, body["state"].as_str()),
            (200, Some("denied")),
            "{body}"
        );
        let (_, op) = call(
            "GET",
            &format!("{}/v1/runs/run-1/ops/4", serve.url),
            &acme,
            None,
        );
        assert_eq!(
            (op["state"].as_str(), op["result"]["reason"].as_str()),
            (Some("denied"), Some("approval_denied")),
            "{op}"
        );

        // Denials, each with its reason, none reaching the runner.
        for (id, op, args, reason) in [
            (
                "5",
                "artifact_read",
                json!({"path": "input/secret.txt", "maxBytes": 100}),
                "policy_denied",
            ),
            (
                "6",
                "exec_argv",
                json!({"argv": ["/bin/sh", "-c", "id"]}),
                "policy_denied",
            ),
            (
                "7",
                "http_request",
                json!({"method": "GET", "url": "https://example.com/"}),
                "op_not_in_manifest",
            ),
        ] {
            let (status, body) = post_op(&serve, &acme, "run-1", envelope(id, op, args));
            assert_eq!(
                (status, body["error"]["reason"].as_str()),
                (403, Some(reason)),
                "{body}"
            );
            assert_eq!(body["op"]["state"], "denied");
        }
        // A repeated id is refused; a capability cannot be smuggled in.
        let (status, _) = post_op(
            &serve,
            &acme,
            "run-1",
            envelope("1", "artifact_list", json!({"path": "."})),
        );
        assert_eq!(status, 409);
        let mut forged = envelope("8", "artifact_list", json!({"path": "."}));
        forged["capability"] = json!("x.y");
        assert_eq!(post_op(&serve, &acme, "run-1", forged).0, 400);

        let (status, _) = call(
            "POST",
            &format!("{}/v1/runs/run-1/finish", serve.url),
            &acme,
            None,
        );
        assert_eq!(status, 200);
        wait_state(&serve, &acme, "run-1", "succeeded");
        // The runner's teardown is the run's last event.
        wait_run_event(&serve, &acme, "run-1", "run.destroyed");

        let events = run_events(&serve, &acme, "run-1");
        // Denied operations never reached the runner: its own ledger has
        // nothing of them, and the secret's content is nowhere.
        let local = moat_ledger::Ledger::open(&runner.state.join("shell/ledger.db")).unwrap();
        let local: Vec<_> = local.events(Some("run-1"), 0, 10_000).unwrap();
        assert!(!local.is_empty(), "the runner's ledger is empty");
        for denied in ["4", "5", "6", "7"] {
            assert!(
                !local
                    .iter()
                    .any(|e| e.event.op_id.as_deref() == Some(denied)),
                "denied op {denied} reached the runner"
            );
        }
        let (_, ops) = call(
            "GET",
            &format!("{}/v1/runs/run-1/ops", serve.url),
            &acme,
            None,
        );
        let everything = format!("{ops}{}", Value::Array(events.clone()));
        assert!(!everything.contains("do not read"), "the secret leaked");
        for (kind, n) in [
            ("run.created", 1),
            ("run.claimed", 1),
            ("capability.denied", 4),
            ("op.finished", 3),
            ("sandbox.exec.finished", 1),
            ("artifact.created", 1),
            ("run.usage", 1),
            ("run.finished", 1),
            ("run.destroyed", 1),
        ] {
            assert_eq!(count(&events, kind), n, "{kind} in {events:#?}");
        }
        // Each allowed op: granted by the control plane, then its capability
        // accepted by the runner's shell (reported with the runner's id).
        let granted = |by_runner: bool| {
            events
                .iter()
                .filter(|e| {
                    e["type"] == "capability.granted"
                        && e["data"]["runnerId"].is_string() == by_runner
                })
                .count()
        };
        assert_eq!((granted(false), granted(true)), (3, 3), "{events:#?}");
        let denied: Vec<_> = events
            .iter()
            .filter(|e| e["type"] == "capability.denied")
            .map(|e| e["data"]["reason"].clone())
            .collect();
        assert_eq!(
            denied,
            [
                json!("approval_denied"),
                json!("policy_denied"),
                json!("policy_denied"),
                json!("op_not_in_manifest")
            ]
        );
        assert!(
            !events
                .iter()
                .any(|e| e["type"] == "capability.denied" && e["data"]["runnerId"].is_string()),
            "the runner refused a capability: {events:#?}"
        );

        // Artifacts: listed, downloadable, verifiable — and only by their org.
        let (_, listed) = call(
            "GET",
            &format!("{}/v1/runs/run-1/artifacts", serve.url),
            &acme,
            None,
        );
        let report = listed["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["label"] == "output/report.md")
            .cloned()
            .unwrap_or_else(|| panic!("no report artifact in {listed}"));
        let sha = report["sha256"].as_str().unwrap();
        let (status, bytes) = download(&format!("{}/v1/artifacts/{sha}", serve.url), &acme);
        assert_eq!((status, bytes.as_slice()), (200, &b"# report\n"[..]));
        let (_, verified) = call(
            "GET",
            &format!("{}/v1/artifacts/{sha}/verify", serve.url),
            &acme,
            None,
        );
        assert_eq!(verified["ok"], true);
        for path in [
            "/v1/runs/run-1",
            "/v1/runs/run-1/events",
            "/v1/runs/run-1/ops",
            "/v1/runs/run-1/ops/1",
            "/v1/runs/run-1/artifacts",
            &format!("/v1/artifacts/{sha}"),
        ] {
            let (status, _) = call("GET", &format!("{}{path}", serve.url), &other, None);
            assert_eq!(status, 404, "{path} visible to another org");
        }
        let (status, _) = post_op(
            &serve,
            &other,
            "run-1",
            envelope("9", "artifact_list", json!({"path": "."})),
        );
        assert_eq!(status, 404);
        let (_, runners) = call("GET", &format!("{}/v1/runners", serve.url), &other, None);
        assert_eq!(runners["runners"], json!([]));
        let (status, _) = call(
            "GET",
            &format!("{}/v1/runs", serve.url),
            "moat_not_a_token",
            None,
        );
        assert_eq!(status, 401);

        // The same events as a server-sent stream (it ends: the run has ended).
        let stream = stream_text(&format!("{}/v1/runs/run-1/events/stream", serve.url), &acme);
        let streamed: Vec<&str> = stream
            .lines()
            .filter_map(|l| l.strip_prefix("event: "))
            .collect();
        let listed: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(streamed, listed, "{stream}");
        let tail = stream_text_after(
            &format!("{}/v1/runs/run-1/events/stream", serve.url),
            &acme,
            events[2]["seq"].as_i64().unwrap(),
        );
        assert_eq!(
            tail.lines().filter(|l| l.starts_with("event: ")).count(),
            listed.len() - 3,
            "resumed after Last-Event-ID"
        );
        let (status, _) = call(
            "GET",
            &format!("{}/v1/runs/run-1/events/stream", serve.url),
            &other,
            None,
        );
        assert_eq!(status, 404);

        // The runner's provenance, recorded at its start.
        let store = moat_store::Store::open(&db.url).unwrap();
        let all = store.all_events(0, 100_000).unwrap();
        for kind in [
            "runner.registered",
            "runner.selected",
            "runner.started",
            "runner.policy.loaded",
            "runner.manifest.loaded",
        ] {
            let found = all
                .iter()
                .filter(|e| e.event.event_type.as_str() == kind)
                .count();
            assert_eq!(found, 1, "{kind}");
        }
        assert_ledger_intact(&serve);
    }
}

/// A run the agent asked to finish while it was queued is finished from
/// its claim: the claim's answer says so and the runner reports the end
/// without asking for a next step, so the lease the claim took is the
/// run's last (an ask would have renewed it).
#[test]
fn a_run_asked_to_finish_while_queued_is_finished_from_its_claim() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for db in databases(dir.path()) {
        let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        create_run(&serve, &acme, "early");
        let (status, body) = call(
            "POST",
            &format!("{}/v1/runs/early/finish", serve.url),
            &acme,
            None,
        );
        assert_eq!((status, &body["state"]), (200, &json!("queued")), "{body}");
        let _runner = Runner::start(&serve, &setup, &acme, "runner-1");
        wait_state(&serve, &acme, "early", "succeeded");
        let destroyed = wait_run_event(&serve, &acme, "early", "run.destroyed");
        assert_eq!(destroyed["data"]["ok"], true, "{destroyed}");
        let events = run_events(&serve, &acme, "early");
        let claimed: Vec<_> = events
            .iter()
            .filter(|e| e["type"] == "run.claimed")
            .collect();
        assert_eq!(claimed.len(), 1, "{events:?}");
        let (_, run) = call("GET", &format!("{}/v1/runs/early", serve.url), &acme, None);
        assert_eq!(
            run["leaseUntil"], claimed[0]["data"]["leaseUntil"],
            "the lease was renewed after the claim: the runner asked for a next step ({run})"
        );
        assert_ledger_intact(&serve);
    }
}

#[test]
fn a_killed_runner_loses_its_run_and_a_restarted_control_plane_is_rejoined() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for (i, db) in databases(dir.path()).into_iter().enumerate() {
        let mut serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let mut first = Runner::start(&serve, &setup, &acme, &format!("first-{i}"));
        let (status, _) = call(
            "POST",
            &format!("{}/v1/runs", serve.url),
            &acme,
            Some(json!({"id": "r", "maxAttempts": 2})),
        );
        assert_eq!(status, 201);
        // A long operation; the runner dies in the middle of it.
        let slow = envelope(
            "slow",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c", "import time; time.sleep(20)"]}),
        );
        let (status, op) = call(
            "POST",
            &format!("{}/v1/runs/r/ops", serve.url),
            &acme,
            Some(slow),
        );
        assert_eq!(status, 201, "{op}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while call(
            "GET",
            &format!("{}/v1/runs/r/ops/slow", serve.url),
            &acme,
            None,
        )
        .1["state"]
            != "dispatched"
        {
            assert!(
                Instant::now() < deadline,
                "the operation was never dispatched"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        first.kill();
        // The lease (3 s) runs out: the op fails, the run is queued again.
        wait_state(&serve, &acme, "r", "queued");
        let (_, op) = call(
            "GET",
            &format!("{}/v1/runs/r/ops/slow", serve.url),
            &acme,
            None,
        );
        assert_eq!(
            (
                op["state"].as_str(),
                op["result"]["error"]["reason"].as_str()
            ),
            (Some("failed"), Some("interrupted")),
            "{op}"
        );

        let _second = Runner::start(&serve, &setup, &acme, &format!("second-{i}"));
        wait_state(&serve, &acme, "r", "running");
        // The control plane restarts mid-run (same address, same database).
        let port = serve.port().to_owned();
        serve.stop();
        let serve = Serve::start(&setup, &db.url, &format!("127.0.0.1:{port}"));
        let (status, op) = post_op(
            &serve,
            &acme,
            "r",
            envelope(
                "after",
                "artifact_write",
                json!({"path": "output/x", "content": "x", "maxBytes": 10}),
            ),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "{op}"
        );
        call(
            "POST",
            &format!("{}/v1/runs/r/finish", serve.url),
            &acme,
            None,
        );
        wait_state(&serve, &acme, "r", "succeeded");

        let events = run_events(&serve, &acme, "r");
        for (kind, n) in [
            ("run.claimed", 2),
            ("run.lease_expired", 1),
            ("run.retried", 1),
            ("run.finished", 1),
            ("op.finished", 1),
        ] {
            assert_eq!(count(&events, kind), n, "{kind} in {events:#?}");
        }
        assert_ledger_intact(&serve);
    }
}

#[test]
fn a_1000_runs_on_two_control_planes_and_four_runners_are_each_claimed_and_finished_once() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let pg = TempPostgres::create()
        .expect("PostgreSQL: bash tests/suite.sh starts one (or set MOAT_TEST_POSTGRES)");
    let planes = [
        Serve::start(&setup, &pg.url, "127.0.0.1:0"),
        Serve::start(&setup, &pg.url, "127.0.0.1:0"),
    ];
    let acme = org(&planes[0], "acme");
    prepare_org(&planes[1], &setup, &acme);
    let _runners: Vec<Runner> = (0..4)
        .map(|i| Runner::start(&planes[i % 2], &setup, &acme, &format!("r{i}")))
        .collect();
    const RUNS: usize = 1000;
    let creators: Vec<_> = (0..2)
        .map(|p| {
            let (url, token) = (planes[p].url.clone(), acme.clone());
            std::thread::spawn(move || {
                for i in (p..RUNS).step_by(2) {
                    let id = format!("run-{i:04}");
                    let (status, body) = call(
                        "POST",
                        &format!("{url}/v1/runs"),
                        &token,
                        Some(json!({"id": id})),
                    );
                    assert_eq!(status, 201, "{body}");
                    let (status, _) =
                        call("POST", &format!("{url}/v1/runs/{id}/finish"), &token, None);
                    assert_eq!(status, 200);
                }
            })
        })
        .collect();
    for c in creators {
        c.join().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, body) = call(
            "GET",
            &format!("{}/v1/runs?state=succeeded&limit=1000", planes[0].url),
            &acme,
            None,
        );
        if body["runs"].as_array().map_or(0, Vec::len) == RUNS {
            break;
        }
        assert!(Instant::now() < deadline, "not all runs finished");
        std::thread::sleep(Duration::from_millis(200));
    }
    // From the ledger: every run claimed once and finished once.
    let store = moat_store::Store::open(&pg.url).unwrap();
    let events = store.all_events(0, 1_000_000).unwrap();
    let mut claims = std::collections::HashMap::<String, (usize, usize)>::new();
    for e in &events {
        let entry = claims.entry(e.event.run_id.clone()).or_default();
        match e.event.event_type {
            moat_core::EventType::RunClaimed => entry.0 += 1,
            moat_core::EventType::RunFinished => entry.1 += 1,
            _ => {}
        }
    }
    let runs: Vec<_> = claims
        .iter()
        .filter(|(id, _)| id.starts_with("run-"))
        .collect();
    assert_eq!(runs.len(), RUNS);
    assert!(
        runs.iter().all(|(_, counts)| **counts == (1, 1)),
        "a run claimed or finished twice"
    );
    assert!(store.verify_ledger().unwrap().is_ok());
}

#[test]
fn a_runner_refreshes_its_manifest_in_the_window_and_keeps_long_operations_leased() {
    let dir = tempfile::tempdir().unwrap();
    let now = std::time::SystemTime::now();
    let day = Duration::from_secs(86_400);
    // Ten days of life, nine gone: inside the refresh window from the start.
    let setup = setup_with(dir.path(), |m| {
        m["createdAt"] = json!(rfc3339(now - 9 * day));
        m["expiresAt"] = json!(rfc3339(now + day));
    });
    for (i, db) in databases(dir.path()).into_iter().enumerate() {
        let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let store = moat_store::Store::open(&db.url).unwrap();
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let _runner = Runner::start(&serve, &setup, &acme, &format!("refresher-{i}"));
        // Nothing newer is published yet: the attempt is reported as failed.
        let failed = wait_event(&store, moat_core::EventType::RunnerManifestRefreshFailed);
        assert_eq!(
            failed[0].event.data["reason"], "no newer manifest is published",
            "{:?}",
            failed[0]
        );

        let newer = resign(&setup, |m| {
            m["createdAt"] = json!(rfc3339(now));
            m["expiresAt"] = json!(rfc3339(now + 7 * day));
        });
        let (status, body) = call(
            "POST",
            &format!("{}/v1/manifests", serve.url),
            &acme,
            Some(newer.clone()),
        );
        assert_eq!(status, 201, "{body}");
        let refreshed = wait_event(&store, moat_core::EventType::RunnerManifestRefreshed);
        assert_eq!(
            refreshed[0].event.data["manifestHash"],
            newer["manifestHash"]
        );
        let (_, runners) = call("GET", &format!("{}/v1/runners", serve.url), &acme, None);
        assert_eq!(
            runners["runners"][0]["manifestHash"], newer["manifestHash"],
            "{runners}"
        );

        // Runs now go on under the new manifest; an op longer than the
        // lease (3 s) keeps its run through heartbeats.
        call(
            "POST",
            &format!("{}/v1/runs", serve.url),
            &acme,
            Some(json!({"id": "long", "maxAttempts": 1})),
        );
        let slow = envelope(
            "slow",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c", "import time; time.sleep(5); print('done')"]}),
        );
        let (status, op) = post_op(&serve, &acme, "long", slow);
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "{op}"
        );
        assert!(op["result"].to_string().contains("done"), "{op}");
        call(
            "POST",
            &format!("{}/v1/runs/long/finish", serve.url),
            &acme,
            None,
        );
        wait_state(&serve, &acme, "long", "succeeded");
        let events = run_events(&serve, &acme, "long");
        assert_eq!(count(&events, "run.lease_expired"), 0, "{events:#?}");
        let (_, run) = call("GET", &format!("{}/v1/runs/long", serve.url), &acme, None);
        assert_eq!(run["manifestHash"], newer["manifestHash"], "{run}");
        assert_ledger_intact(&serve);
    }
}

/// `psql -c SQL` as the test server's administrator.
fn psql(sql: &str) {
    let admin = std::env::var("MOAT_TEST_POSTGRES")
        .unwrap_or_else(|_| "host=/var/run/postgresql dbname=postgres".to_owned());
    let out = std::process::Command::new("psql")
        .args([admin.as_str(), "-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .expect("running psql");
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn readiness_follows_the_database_and_liveness_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let pg = TempPostgres::create()
        .expect("PostgreSQL is needed: bash tests/suite.sh starts a throwaway one");
    let serve = Serve::start(&setup, &pg.url, "127.0.0.1:0");
    let get = |path: &str| get_text(&format!("{}{path}", serve.url));
    assert_eq!(get("/readyz"), (200, "ready".to_owned()));

    // The database stops taking connections, and those open are ended.
    psql(&format!(
        "ALTER DATABASE {0} ALLOW_CONNECTIONS false; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{0}'",
        pg.name
    ));
    let (status, body) = get("/readyz");
    assert_eq!(status, 503, "{body}");
    let error: Value = serde_json::from_str(&body).expect("a JSON error body");
    assert!(error["error"]["reason"].is_string(), "{error}");
    assert_eq!(get("/healthz"), (200, "ok".to_owned()));

    // Back: ready again at once (the pool opens new connections).
    psql(&format!(
        "ALTER DATABASE {} ALLOW_CONNECTIONS true",
        pg.name
    ));
    assert_eq!(get("/readyz"), (200, "ready".to_owned()));
    drop(serve);
}

#[test]
fn the_database_password_comes_from_a_file_only_others_cannot_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let file = dir.path().join("db-password");
    std::fs::write(&file, "s3cret\n").unwrap();
    let refused = |db: &str, mode: u32| {
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = std::process::Command::new(common::MOAT)
            .args(["serve", "--db", db, "--listen", "127.0.0.1:0"])
            .args(["--key", common::path_str(&setup.key)])
            .args(["--policy", common::path_str(&setup.policy)])
            .args(["--admin-token-file", common::path_str(&setup.admin)])
            .args(["--db-password-file", common::path_str(&file)])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{db} {mode:o}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let sqlite = format!("sqlite:{}", dir.path().join("cp.db").display());
    let e = refused(&sqlite, 0o644);
    assert!(e.contains("every user may read it"), "{e}");
    let e = refused(&sqlite, 0o600);
    assert!(e.contains("a SQLite file takes none"), "{e}");
    std::fs::write(&file, "\n").unwrap();
    let e = refused(&sqlite, 0o600);
    assert!(e.contains("it is empty"), "{e}");
    assert!(
        !dir.path().join("cp.db").exists(),
        "a refused start wrote a database"
    );

    // On PostgreSQL the file's password is the one used (this server trusts
    // local connections, so any password opens; the TLS test of moat-store
    // checks a password login itself).
    std::fs::write(&file, "s3cret\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let pg = TempPostgres::create()
        .expect("PostgreSQL is needed: bash tests/suite.sh starts a throwaway one");
    let serve = Serve::start_with(
        &setup,
        &pg.url,
        "127.0.0.1:0",
        &["--db-password-file", common::path_str(&file)],
    );
    assert_eq!(
        get_text(&format!("{}/readyz", serve.url)),
        (200, "ready".to_owned())
    );
}

#[test]
fn an_enrolled_runner_restarted_twice_registers_each_time_with_no_new_token_and_serves_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let db = &databases(dir.path())[0];
    let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let key = ClusterKey::new();
    let (issuer, subject) = (
        "https://kubernetes.default.svc.cluster.local",
        "system:serviceaccount:moat-runner:moat-runner",
    );
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runner-enrolments", serve.url),
        &acme,
        Some(json!({"name": "cluster", "issuer": issuer, "subject": subject, "jwks": key.jwks()})),
    );
    // The audience the control plane made, which the DaemonSet's projected
    // token asks the kubelet for.
    let audience = body["audience"].as_str().unwrap_or_default().to_owned();
    assert_eq!(status, 201, "{body}");
    // The projected token, written once, as the kubelet would.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = key.token(&json!({
        "iss": issuer, "aud": [audience], "sub": subject,
        "iat": now, "nbf": now, "exp": now + 600,
        "kubernetes.io": {"namespace": "moat-runner", "node": {"name": "node-a", "uid": "n"},
                          "pod": {"name": "moat-runner-abcde", "uid": "p"}}
    }));
    let token_file = setup.dir.join("enrolment-token");
    std::fs::write(&token_file, &token).unwrap();
    let written = std::fs::metadata(&token_file).unwrap().modified().unwrap();

    for start in 0..3 {
        // The same state directory each time: a container restart.
        let mut runner = Runner::start_enrolled(&setup, &serve, &token_file, "enrolled");
        let run = format!("run-{start}");
        let (status, body) = call(
            "POST",
            &format!("{}/v1/runs", serve.url),
            &acme,
            Some(json!({"id": run})),
        );
        assert_eq!(status, 201, "{body}");
        let (status, op) = post_op(
            &serve,
            &acme,
            &run,
            envelope(
                "w",
                "artifact_write",
                json!({"path": "output/x", "content": "x", "maxBytes": 10}),
            ),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "start {start}: {op}"
        );
        call(
            "POST",
            &format!("{}/v1/runs/{run}/finish", serve.url),
            &acme,
            None,
        );
        wait_state(&serve, &acme, &run, "succeeded");
        runner.kill();
    }
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().modified().unwrap(),
        written,
        "nobody wrote a token between the starts"
    );
    let (_, runners) = call("GET", &format!("{}/v1/runners", serve.url), &acme, None);
    let runners = runners["runners"].as_array().unwrap();
    assert_eq!(runners.len(), 3, "one registration per start: {runners:?}");
    assert!(
        runners.iter().all(|r| r["enrolmentId"] == body["id"]),
        "each through the enrolment: {runners:?}"
    );
    assert_ledger_intact(&serve);
}

/// Waits until the org has `n` registered runners (a runner handles
/// SIGTERM from before it registers).
fn wait_registered(serve: &Serve, token: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while call("GET", &format!("{}/v1/runners", serve.url), token, None).1["runners"]
        .as_array()
        .map_or(0, Vec::len)
        < n
    {
        assert!(Instant::now() < deadline, "runner {n} never registered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sigterm(runner: &Runner) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &runner.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn sigterm_drains_a_runner_its_operation_finishes_and_its_run_is_queued_again_uncounted() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let db = &databases(dir.path())[0];
    let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);

    // Idle: it stops within a long poll, cleanly.
    let mut idle = Runner::start(&serve, &setup, &acme, "idle");
    wait_registered(&serve, &acme, 1);
    sigterm(&idle);
    assert_eq!(exit_of(&mut idle, Duration::from_secs(15)).code(), Some(0));

    // Busy: one attempt only, so a counted claim would end the run.
    let mut first = Runner::start(&serve, &setup, &acme, "draining");
    wait_registered(&serve, &acme, 2);
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "d", "maxAttempts": 1})),
    );
    assert_eq!(status, 201, "{body}");
    let slow = envelope(
        "slow",
        "exec_argv",
        json!({"argv": ["/usr/bin/python3", "-c", "import time; time.sleep(2); print('done')"]}),
    );
    let op = std::thread::scope(|scope| {
        let answer = scope.spawn(|| post_op(&serve, &acme, "d", slow));
        let deadline = Instant::now() + Duration::from_secs(30);
        while call(
            "GET",
            &format!("{}/v1/runs/d/ops/slow", serve.url),
            &acme,
            None,
        )
        .1["state"]
            != "dispatched"
        {
            assert!(
                Instant::now() < deadline,
                "the operation was never dispatched"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sigterm(&first);
        answer.join().unwrap()
    });
    // The operation in flight when SIGTERM came finished and was reported.
    assert_eq!(
        (op.0, op.1["state"].as_str()),
        (200, Some("succeeded")),
        "{}",
        op.1
    );
    assert_eq!(exit_of(&mut first, Duration::from_secs(30)).code(), Some(0));
    let (_, run) = call("GET", &format!("{}/v1/runs/d", serve.url), &acme, None);
    assert_eq!(
        (run["state"].as_str(), run["attempts"].as_i64()),
        (Some("queued"), Some(0)),
        "{run}"
    );
    assert!(
        !first.state.join("runs/d").exists(),
        "the released run's workspace is gone from the runner"
    );

    // Another runner takes it and the run completes.
    let _second = Runner::start(&serve, &setup, &acme, "second");
    let (status, op) = post_op(
        &serve,
        &acme,
        "d",
        envelope(
            "after",
            "artifact_write",
            json!({"path": "output/x", "content": "x", "maxBytes": 10}),
        ),
    );
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("succeeded")),
        "{op}"
    );
    call(
        "POST",
        &format!("{}/v1/runs/d/finish", serve.url),
        &acme,
        None,
    );
    wait_state(&serve, &acme, "d", "succeeded");
    let events = run_events(&serve, &acme, "d");
    for (kind, n) in [
        ("run.claimed", 2),
        ("run.released", 1),
        ("run.lease_expired", 0),
        ("op.finished", 2),
    ] {
        assert_eq!(count(&events, kind), n, "{kind} in {events:#?}");
    }
    assert_ledger_intact(&serve);
}

/// A run's last report asks for the slot's next run; SIGTERM comes while
/// that ask waits, and a run is queued then: whether the ask claims it or
/// not, it is not lost. Claimed, it is given back uncounted once no ask is
/// in flight; the runner stops cleanly.
#[test]
fn sigterm_while_a_reports_claim_waits_loses_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let db = &databases(dir.path())[0];
    let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let mut runner = Runner::start_with(&serve, &setup, &acme, "asking", &["--slots", "1"]);
    wait_registered(&serve, &acme, 1);
    create_run(&serve, &acme, "done");
    finish_run(&serve, &acme, "done");
    wait_state(&serve, &acme, "done", "succeeded");

    // Its finish's claim waits now (for up to 5 s).
    sigterm(&runner);
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "late", "maxAttempts": 1})),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        exit_of(&mut runner, Duration::from_secs(30)).code(),
        Some(0)
    );
    let (_, run) = call("GET", &format!("{}/v1/runs/late", serve.url), &acme, None);
    assert_eq!(
        (run["state"].as_str(), run["attempts"].as_i64()),
        (Some("queued"), Some(0)),
        "{run}"
    );
    let events = run_events(&serve, &acme, "late");
    assert_eq!(
        count(&events, "run.claimed"),
        count(&events, "run.released"),
        "{events:#?}"
    );
    assert_eq!(count(&events, "run.lease_expired"), 0, "{events:#?}");
    assert!(!runner.state.join("runs/late").exists());
    assert_ledger_intact(&serve);
}

/// `curl` against the TLS control plane: exit code, body.
fn curl(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl (installed by tests/suite.sh)");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn serve_speaks_tls_and_runners_and_operators_trust_a_private_ca_with_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let (ca, cert, key) = private_ca(dir.path());
    let db = &databases(dir.path())[0];
    let serve = Serve::start_with(
        &setup,
        &db.url,
        "127.0.0.1:0",
        &["--tls-cert", path_str(&cert), "--tls-key", path_str(&key)],
    );
    assert!(serve.url.starts_with("https://127.0.0.1:"), "{}", serve.url);
    let ca = path_str(&ca);
    // The private CA is trusted only where it is named.
    let (code, body) = curl(&["--cacert", ca, &format!("{}/healthz", serve.url)]);
    assert_eq!((code, body.trim()), (0, "ok"));
    let (code, body) = curl(&[&format!("{}/healthz", serve.url)]);
    assert_eq!(code, 60, "an unknown CA is refused by default: {body}");
    let plain = serve.url.replacen("https://", "http://", 1);
    let (code, body) = curl(&[&format!("{plain}/healthz")]);
    assert_ne!(code, 0, "plain HTTP gets nothing from a TLS port: {body}");

    // Set up an org over TLS (curl, trusting the CA).
    let admin = std::fs::read_to_string(&setup.admin).unwrap();
    let post = |path: &str, token: &str, body: &Value| {
        let (code, out) = curl(&[
            "--cacert",
            ca,
            "-X",
            "POST",
            "-H",
            &format!("Authorization: Bearer {}", token.trim()),
            "-H",
            "content-type: application/json",
            "-d",
            &body.to_string(),
            &format!("{}{path}", serve.url),
        ]);
        assert_eq!(code, 0, "{path}: {out}");
        serde_json::from_str::<Value>(&out).unwrap_or_else(|_| panic!("{path}: {out}"))
    };
    let acme = post("/v1/orgs", &admin, &json!({"name": "acme"}))["token"]
        .as_str()
        .unwrap()
        .to_owned();
    post("/v1/manifests", &acme, &setup.signed);
    post(
        "/v1/runner-builds",
        &acme,
        &json!({"sha256": setup.runner_hash, "label": "test"}),
    );

    // A runner without --ca-file cannot register (and says why); with it, it
    // serves a run.
    let token_file = setup.dir.join("tls-bootstrap");
    std::fs::write(
        &token_file,
        post("/v1/bootstrap-tokens", &acme, &json!({}))["token"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let refused = std::process::Command::new(&setup.runner)
        .args([
            "runner",
            "start",
            "--control-plane",
            &serve.url,
            "--bootstrap-token-file",
        ])
        .arg(&token_file)
        .arg("--state-dir")
        .arg(setup.dir.join("tls-refused"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert!(
        said.contains("certificate") || said.contains("issuer"),
        "{said}"
    );
    std::fs::write(
        &token_file,
        post("/v1/bootstrap-tokens", &acme, &json!({}))["token"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let state = setup.dir.join("tls-runner");
    let mut runner = std::process::Command::new(&setup.runner)
        .args([
            "runner",
            "start",
            "--control-plane",
            &serve.url,
            "--ca-file",
            ca,
            "--bootstrap-token-file",
        ])
        .arg(&token_file)
        .arg("--state-dir")
        .arg(&state)
        .spawn()
        .unwrap();
    post("/v1/runs", &acme, &json!({"id": "t"}));
    let mut op = post(
        "/v1/runs/t/ops?wait_ms=5000",
        &acme,
        &envelope(
            "w",
            "artifact_write",
            json!({"path": "output/x", "content": "x", "maxBytes": 10}),
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    while matches!(op["state"].as_str(), Some("queued" | "dispatched")) {
        assert!(
            Instant::now() < deadline,
            "the operation never finished: {op}"
        );
        let (code, out) = curl(&[
            "--cacert",
            ca,
            "-H",
            &format!("Authorization: Bearer {acme}"),
            &format!("{}/v1/runs/t/ops/w?wait_ms=5000", serve.url),
        ]);
        assert_eq!(code, 0, "{out}");
        op = serde_json::from_str(&out).unwrap();
    }
    assert_eq!(op["state"], "succeeded", "{op}");
    post("/v1/runs/t/finish", &acme, &json!({}));

    // An operator command trusts the CA with --ca-file, and not without.
    let token = setup.dir.join("acme-token");
    std::fs::write(&token, &acme).unwrap();
    let audit = |extra: &[&str]| {
        std::process::Command::new(MOAT)
            .args([
                "approvals",
                "--control-plane",
                &serve.url,
                "--token-file",
                path_str(&token),
            ])
            .args(extra)
            .arg("list")
            .output()
            .unwrap()
    };
    let trusted = audit(&["--ca-file", ca]);
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    let untrusted = audit(&[]);
    assert!(!untrusted.status.success());
    let said = String::from_utf8_lossy(&untrusted.stderr).to_lowercase();
    assert!(
        said.contains("certificate") || said.contains("issuer"),
        "{said}"
    );
    // A CA file that holds no certificate is refused plainly.
    let bad = setup.dir.join("not-a-ca.pem");
    std::fs::write(&bad, "not pem").unwrap();
    let refused = audit(&["--ca-file", path_str(&bad)]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("no PEM certificate"),
        "{said}"
    );
    // A CA for a plain-HTTP URL would protect nothing: refused, not ignored.
    let plain_http = std::process::Command::new(MOAT)
        .args([
            "approvals",
            "--control-plane",
            &plain,
            "--token-file",
            path_str(&token),
        ])
        .args(["--ca-file", ca, "list"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&plain_http.stderr);
    assert!(
        !plain_http.status.success() && said.contains("plain HTTP"),
        "{said}"
    );
    let _ = runner.kill();
    let _ = runner.wait();
}

#[test]
fn serve_keeps_promoted_files_where_outputs_says_and_refuses_a_store_it_cannot_use() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let db = format!("sqlite:{}", dir.path().join("cp.db").display());
    let serve = |extra: &[&str], env: &[(&str, &str)]| {
        std::process::Command::new(MOAT)
            .args(["serve", "--db", &db, "--listen", "127.0.0.1:0"])
            .args(["--key", path_str(&setup.key)])
            .args(["--policy", path_str(&setup.policy)])
            .args(["--admin-token-file", path_str(&setup.admin)])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };

    // Where promoted files go is checked before anything is opened.
    for spec in [
        "relative/dir",
        "gs://bucket",
        "s3://Not_A_Bucket",
        "file://x",
    ] {
        let out = serve(&["--outputs", spec], &[]).wait_with_output().unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{spec}: {e}");
        assert!(
            e.contains(&format!("--outputs {spec}")) && e.contains("expected `database`"),
            "{spec}: {e}"
        );
    }
    assert!(
        !dir.path().join("cp.db").exists(),
        "a refused start wrote a database"
    );

    // A bucket nobody answers for: refused at start-up, by the probe, on
    // the endpoint the environment names (loopback, nothing listening).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let aws = [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "moat-test"),
        ("AWS_SECRET_ACCESS_KEY", "moat-test"),
        ("AWS_REGION", "us-east-1"),
    ];
    let out = serve(&["--outputs", "s3://moat-outputs/acme"], &aws)
        .wait_with_output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains("--outputs s3://moat-outputs/acme") && e.contains(&endpoint),
        "{e}"
    );

    // By default, a directory of its own beside the SQLite file.
    let mut started = serve(&[], &[]);
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(started.stderr.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let _ = std::process::Command::new("kill")
        .arg(started.id().to_string())
        .status();
    let _ = started.wait();
    let outputs = dir.path().join("cp.db-outputs");
    assert!(
        first.contains(&format!("promoted files in file://{}", outputs.display())),
        "{first}"
    );
    let mode = std::fs::metadata(&outputs).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    assert!(outputs.join("moat/probe").is_file(), "the start-up probe");
}

/// The program of `a_file_that_kills_the_verifier_...`: two small CSVs and,
/// between them, one whose single field is 96 MB, written 1 MB at a time.
const CRAFTED: &str = r#"
with open("output/a.csv", "w") as f:
    f.write("id,amount\n1,2\n")
with open("output/b-crafted.csv", "w") as f:
    f.write('id,amount\n1,"')
    for _ in range(96):
        f.write("x" * (1 << 20))
    f.write('"\n')
with open("output/c.csv", "w") as f:
    f.write("id,amount\n3,4\n")
"#;

#[test]
fn a_file_that_kills_the_verifier_is_rejected_and_the_runner_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    // The verifier gets the operation's limits: 48 MiB cannot hold the
    // crafted file's one field.
    let setup = setup_with(dir.path(), |m| {
        m["limits"]["memoryBytes"] = json!(48u64 << 20);
        m["exports"] = json!({"rules": [
            {"path": "output/*.csv", "types": ["csv"], "maxBytes": 200u64 << 20}
        ]});
    });
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let runner = Runner::start(&serve, &setup, &acme, "crafted");
    let run =
        json!({"id": "crafted", "inputs": [{"path": "input/data.txt", "content": "hello moat\n"}]});
    let (status, body) = call("POST", &format!("{}/v1/runs", serve.url), &acme, Some(run));
    assert_eq!(status, 201, "{body}");

    let (status, op) = post_op(
        &serve,
        &acme,
        "crafted",
        envelope(
            "1",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c", CRAFTED]}),
        ),
    );
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("succeeded")),
        "{op}"
    );
    let exports = &op["result"]["result"]["exports"];
    let mut promoted: Vec<&str> = exports["promoted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    promoted.sort_unstable();
    assert_eq!(promoted, ["output/a.csv", "output/c.csv"], "{exports}");
    let rejected = exports["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 1, "{exports}");
    assert_eq!(rejected[0]["path"], "output/b-crafted.csv", "{exports}");
    assert_eq!(
        rejected[0]["reasons"][0]["rule"], "verifier_failed",
        "{exports}"
    );
    assert!(
        rejected[0]["reasons"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("out of its 48M of memory"),
        "{exports}"
    );
    // Recorded on the control plane, and never an artifact.
    let (_, events) = call(
        "GET",
        &format!("{}/v1/runs/crafted/events", serve.url),
        &acme,
        None,
    );
    assert!(
        events["events"].as_array().unwrap().iter().any(|e| {
            e["type"] == "artifact.rejected"
                && e["data"]["path"] == "output/b-crafted.csv"
                && e["data"]["reasons"][0]["rule"] == "verifier_failed"
        }),
        "{events}"
    );
    let (_, listed) = call(
        "GET",
        &format!("{}/v1/runs/crafted/artifacts", serve.url),
        &acme,
        None,
    );
    assert!(!listed.to_string().contains("b-crafted"), "{listed}");

    // The same runner takes the next operation.
    let (status, op) = post_op(
        &serve,
        &acme,
        "crafted",
        envelope(
            "2",
            "exec_argv",
            json!({"argv": ["/usr/bin/wc", "-c", "input/data.txt"]}),
        ),
    );
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("succeeded")),
        "{op}"
    );
    assert!(op["result"].to_string().contains("11"), "{op}");
    let mut runner = runner;
    assert!(
        runner.child.try_wait().unwrap().is_none(),
        "the runner process is still the one that started"
    );
}

/// A run the control plane claimed for a runner but could not hand over
/// (reading its inputs failed: here the database's table of stored bytes
/// is renamed away under it) is not held until its lease runs out (ten
/// minutes here): its claim lapses at once, as a lost lease does, so it is
/// queued again with the attempt counted, and after its last attempt it
/// is dead-lettered. The runner never heard of it: no workspace of it on
/// the runner's host.
#[test]
fn a_run_claimed_but_not_handed_over_is_given_back_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for (i, db) in databases(dir.path()).into_iter().enumerate() {
        let (serve, acme, store) = one_run_to_lapse(
            &setup,
            &db,
            json!({"id": "stuck", "maxAttempts": 2,
                   "inputs": [{"path": "input/a.txt", "content": "abc\n"}]}),
        );
        let rename = |from: &str, to: &str| {
            let sql = format!("ALTER TABLE {from} RENAME TO {to}");
            store.tx(|tx| tx.execute(&sql, &[])).unwrap();
        };
        rename("blobs", "blobs_away");
        let runner = Runner::start(&serve, &setup, &acme, &format!("w-{i}"));
        wait_state(&serve, &acme, "stuck", "dead_lettered");
        rename("blobs_away", "blobs");
        assert_lapsed_twice(&serve, &acme, &runner, "stuck");
    }
}

/// A claim the control plane fails to answer (500: here a run whose stored
/// inputs no longer read) does not stop the runner: it says so, waits a
/// little longer each time, and claims again, while the run it could not
/// be handed lapses each time and is dead-lettered after its last attempt;
/// the next run is claimed and served as usual. (A refusal, 4xx, still
/// stops it.)
#[test]
fn a_runner_claims_again_after_a_claim_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    for (i, db) in databases(dir.path()).into_iter().enumerate() {
        let (serve, acme, store) =
            one_run_to_lapse(&setup, &db, json!({"id": "unreadable", "maxAttempts": 2}));
        let corrupt = "UPDATE runs SET inputs = '[{\"path\": 5}]' WHERE id = 'unreadable'";
        store.tx(|tx| tx.execute(corrupt, &[])).unwrap();
        let log = dir.path().join(format!("runner-f-{i}.log"));
        let mut runner = Runner::start_logged(&serve, &setup, &acme, &format!("f-{i}"), &[], &log);
        // Its view no longer reads either: its state is read from the store.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let run = store.run_by_id("unreadable").unwrap().unwrap();
            if run.state == moat_store::RunState::DeadLettered {
                break;
            }
            assert!(Instant::now() < deadline, "stayed {}", run.state.as_str());
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            runner.child.try_wait().unwrap().is_none(),
            "the runner stopped on a failed claim"
        );
        create_run(&serve, &acme, "after");
        finish_run(&serve, &acme, "after");
        assert_lapsed_twice(&serve, &acme, &runner, "unreadable");
        // It said why it waited, and waited longer the second time.
        let said = std::fs::read_to_string(&log).unwrap();
        let first = said.find("500 internal: run unreadable: stored inputs");
        let paused = |pause: &str| said.find(&format!("; claiming again in {pause}\n"));
        assert!(
            first.is_some() && paused("1s") < paused("2s") && paused("1s").is_some(),
            "{said}"
        );
    }
}

/// A control plane on `db` whose leases last ten minutes (a run that
/// lapses within seconds did not lose a lease), org acme ready for runs,
/// the run `body` describes created there, and the store, opened beside it.
fn one_run_to_lapse(setup: &Setup, db: &Db, body: Value) -> (Serve, String, moat_store::Store) {
    let serve = Serve::start_with(setup, &db.url, "127.0.0.1:0", &["--lease", "600s"]);
    let acme = org(&serve, "acme");
    prepare_org(&serve, setup, &acme);
    let (status, answer) = call("POST", &format!("{}/v1/runs", serve.url), &acme, Some(body));
    assert_eq!(status, 201, "{answer}");
    let store = moat_store::Store::open(&db.url).unwrap();
    (serve, acme, store)
}

/// Run `run` (two attempts) was claimed twice, lapsed both times and was
/// dead-lettered after its second, and `runner` never had it (no
/// workspace of it on the runner's host).
fn assert_lapsed_twice(serve: &Serve, token: &str, runner: &Runner, run: &str) {
    let events = run_events(serve, token, run);
    let count = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(
        (
            count("run.claimed"),
            count("run.lease_expired"),
            count("run.retried"),
            count("run.dead_lettered")
        ),
        (2, 2, 1, 1),
        "{events:#?}"
    );
    assert!(
        !runner.state.join("runs").join(run).exists(),
        "the runner never had the run"
    );
}
