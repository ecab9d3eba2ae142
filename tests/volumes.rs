#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Persistent volumes against real control planes (SQLite and PostgreSQL),
//! real sealed runners and real sandboxes: a run whose runner is killed
//! resumes on another runner from its volume's last snapshot, and another
//! org can neither see, attach, resume from nor read a volume, through the
//! API or as a runner.

mod common;

use std::time::{Duration, Instant};

use common::control::*;
use moat_api::runner::{ChunkName, ChunkNames, Registration};
use moat_client::{RunnerClient, VolumeSpace};
use serde_json::{Value, json};

/// A setup whose manifest has a persistent root `state`.
fn volume_setup(dir: &std::path::Path) -> Setup {
    setup_with(dir, |m| {
        m["filesystem"]["writeRoots"]
            .as_array_mut()
            .unwrap()
            .push(json!("state"));
        m["filesystem"]["persistentRoots"] = json!(["state"]);
    })
}

fn stdout(op: &Value) -> String {
    op["result"]["result"]["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn volume(serve: &Serve, token: &str, name: &str) -> (u16, Value) {
    call(
        "GET",
        &format!("{}/v1/volumes/{name}", serve.url),
        token,
        None,
    )
}

fn create_volume(serve: &Serve, token: &str, name: &str) -> Value {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/volumes", serve.url),
        token,
        Some(json!({ "name": name })),
    );
    assert_eq!(status, 201, "{body}");
    body
}

fn wait_op_state(serve: &Serve, token: &str, run: &str, op: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = call(
            "GET",
            &format!("{}/v1/runs/{run}/ops/{op}", serve.url),
            token,
            None,
        );
        if body["state"] == want {
            return body;
        }
        assert!(Instant::now() < deadline, "operation {op} stayed {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const WRITE_MODEL: &str = "import hashlib, os\n\
os.makedirs('state', exist_ok=True)\n\
b = os.urandom(3 << 20)\n\
open('state/model.bin', 'wb').write(b)\n\
print(hashlib.sha256(b).hexdigest())";

const READ_MODEL: &str = "import hashlib, os\n\
print(hashlib.sha256(open('state/model.bin', 'rb').read()).hexdigest())\n\
print(os.path.exists('state/partial'))";

#[test]
fn a_run_whose_runner_is_killed_resumes_from_its_volumes_last_snapshot_on_another_runner() {
    let dir = tempfile::tempdir().unwrap();
    let setup = volume_setup(dir.path());
    for (i, db) in databases(dir.path()).into_iter().enumerate() {
        let serve = Serve::start(&setup, &db.url, "127.0.0.1:0");
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let created = create_volume(&serve, &acme, "model");
        assert_eq!(created["head"], Value::Null, "{created}");
        let (status, run) = call(
            "POST",
            &format!("{}/v1/runs", serve.url),
            &acme,
            Some(json!({"id": "r", "maxAttempts": 2,
                "volumes": [{"volume": "model", "path": "state"}]})),
        );
        assert_eq!(status, 201, "{run}");
        assert_eq!(run["volumes"][0]["volume"], "model", "{run}");
        let mut first = Runner::start(&serve, &setup, &acme, &format!("first-{i}"));

        // Op 1 writes the model; its snapshot is the volume's head once
        // the result is acknowledged.
        let op1 = python_op(&serve, &acme, "r", "write", WRITE_MODEL);
        let written = stdout(&op1);
        assert_eq!(written.len(), 64, "{op1}");
        let (_, v) = volume(&serve, &acme, "model");
        let head = v["head"].as_str().expect("a head after op 1").to_owned();
        assert_eq!(
            (v["files"].as_u64(), v["bytes"].as_u64()),
            (Some(1), Some(3 << 20)),
            "{v}"
        );
        assert_eq!(v["writer"], "r", "{v}");

        // Op 2 is in flight when the runner is killed.
        let slow = envelope(
            "slow",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c",
                "import time; open('state/partial', 'w').write('x'); time.sleep(60)"]}),
        );
        let (status, op) = call(
            "POST",
            &format!("{}/v1/runs/r/ops", serve.url),
            &acme,
            Some(slow),
        );
        assert_eq!(status, 201, "{op}");
        wait_op_state(&serve, &acme, "r", "slow", "dispatched");
        std::thread::sleep(Duration::from_millis(500));
        first.kill();
        let op2 = wait_op_state(&serve, &acme, "r", "slow", "failed");
        assert_eq!(op2["result"]["error"]["reason"], "interrupted", "{op2}");
        wait_state(&serve, &acme, "r", "queued");

        // Another runner takes the run over, restores the snapshot, and
        // op 3 reads what op 1 wrote (and nothing op 2 began).
        let _second = Runner::start(&serve, &setup, &acme, &format!("second-{i}"));
        let op3 = python_op(&serve, &acme, "r", "read", READ_MODEL);
        assert_eq!(stdout(&op3), format!("{written}\nFalse"), "{op3}");
        finish_run(&serve, &acme, "r");

        let events = run_events(&serve, &acme, "r");
        let resumed: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "run.resumed")
            .collect();
        assert_eq!(resumed.len(), 1, "{events:#?}");
        let restored = &resumed[0]["data"]["volumes"][0];
        assert_eq!(restored["snapshot"], head.as_str(), "{restored}");
        assert_eq!(
            (restored["files"].as_u64(), restored["bytes"].as_u64()),
            (Some(1), Some(3 << 20)),
            "{restored}"
        );
        assert_eq!(resumed[0]["data"]["attempt"], 2, "{resumed:?}");
        // Nothing ran twice: one program start for each acknowledged
        // operation (the interrupted one's record died with its runner,
        // and it was not run again: op 3 found nothing of it).
        for (op, n) in [("write", 1), ("slow", 0), ("read", 1)] {
            let started = events
                .iter()
                .filter(|e| e["type"] == "sandbox.exec.started" && e["opId"] == op)
                .count();
            assert_eq!(started, n, "{op} started {started} times: {events:#?}");
        }
        assert_eq!(count(&events, "op.finished"), 2, "{events:#?}");
        assert_eq!(count(&events, "volume.snapshotted"), 1, "{events:#?}");
        // The ended run no longer holds the volume.
        let (_, v) = volume(&serve, &acme, "model");
        assert_eq!(
            (v["head"].as_str(), &v["writer"]),
            (Some(head.as_str()), &Value::Null),
            "{v}"
        );
        // The audit answers what persisted, and that the run was resumed.
        let out = std::process::Command::new(common::MOAT)
            .args(["audit", "r", "--db", &db.url])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        let persisted = format!(
            "model at state (rw): empty -> {} (1 snapshots; 1 files, {} bytes)",
            &head[..16],
            3 << 20
        );
        assert!(said.contains(&persisted), "{said}");
        assert!(said.contains("resumed: attempt 2 on runner"), "{said}");
        // So does the Inspector's run page.
        let page = inspector_page(&serve, &acme, "/ui/runs/r");
        let shown = format!("from empty · now {}", &head[..12]);
        assert!(
            page.contains(r#"data-volume="model""#) && page.contains(&shown),
            "{page}"
        );

        // A session: a later run continues from r's volume, and its replay
        // starts from the snapshot it started from.
        let (status, next) = call(
            "POST",
            &format!("{}/v1/runs", serve.url),
            &acme,
            Some(json!({"id": "r2", "resumeFrom": "r"})),
        );
        assert_eq!(status, 201, "{next}");
        assert_eq!(next["volumes"][0]["startSnapshot"], head.as_str(), "{next}");
        let op = python_op(&serve, &acme, "r2", "read-again", READ_MODEL);
        assert_eq!(stdout(&op), format!("{written}\nFalse"), "{op}");
        finish_run(&serve, &acme, "r2");
        let replayed = std::process::Command::new(common::MOAT)
            .args(["replay", "r2", "--json", "--db", &db.url])
            .arg("--policy")
            .arg(&setup.policy)
            .arg("--trusted-key")
            .arg(setup.dir.join("keys/moat.pub"))
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&replayed.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&replayed.stderr)));
        assert_eq!(replayed.status.code(), Some(0), "{report:#}");
        assert_eq!(
            report["volumes"][0]["snapshot"],
            head.as_str(),
            "{report:#}"
        );
        assert_eq!(report["ops"][0]["same"], true, "{report:#}");
        assert_ledger_intact(&serve);
    }
}

/// A runner of `token`'s org, registered from the test with a fresh key.
fn test_runner(serve: &Serve, setup: &Setup, token: &str) -> RunnerClient {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/bootstrap-tokens", serve.url),
        token,
        Some(json!({})),
    );
    assert_eq!(status, 201, "{body}");
    let key = moat_core::sign::PrivateKey::from_seed(moat_core::random::bytes::<32>());
    let mut client = RunnerClient::new(&serve.url, key, Box::new(|_, _| {}));
    let signed: moat_core::SignedManifest = serde_json::from_value(setup.signed.clone()).unwrap();
    let registration = Registration {
        runner_hash: setup.runner_hash.clone(),
        version: signed.manifest.runner_version.clone(),
        environment: signed.manifest.environment.clone(),
        ops: signed.manifest.allowed_ops.clone(),
        sandbox_mode: "workspace-write".into(),
        boot_time: moat_core::time::now_stamp(),
        public_key: client.public_key().to_base64(),
        slots: 1,
        workload_classes: Vec::new(),
        host: None,
        host_id: None,
        labels: Default::default(),
        cpu_millis: None,
        memory_bytes: None,
        signed_manifest: signed,
    };
    client
        .register(body["token"].as_str().unwrap(), &registration)
        .unwrap();
    client
}

#[test]
fn another_org_cannot_see_attach_resume_from_or_read_a_volume() {
    let dir = tempfile::tempdir().unwrap();
    let setup = volume_setup(dir.path());
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    // `moat volumes`, as docs/volumes.md shows it.
    let volumes = |args: &[&str]| {
        let out = std::process::Command::new(common::MOAT)
            .arg("volumes")
            .args(args)
            .env("MOAT_CONTROL_PLANE", &serve.url)
            .env("MOAT_TOKEN", &acme)
            .env_remove("MOAT_TOKEN_FILE")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, said) = volumes(&["create", "model"]);
    assert!(ok && said.starts_with("model: empty, 0 files"), "{said}");
    let (ok, said) = volumes(&["create", "model"]);
    assert!(!ok && said.contains("already exists"), "{said}");
    let (ok, said) = volumes(&["create", "Model"]);
    assert!(!ok && said.contains("[a-z0-9._-]"), "{said}");
    let (ok, said) = volumes(&["show", "nope"]);
    assert!(!ok && said.contains("no volume \"nope\""), "{said}");
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "a1", "volumes": [{"volume": "model", "path": "state"}]})),
    );
    assert_eq!(status, 201, "{body}");
    // One writer at a time; readers any number; only at persistent roots.
    let runs = format!("{}/v1/runs", serve.url);
    let attach = |id: &str, extra: Value| {
        let mut body = json!({"id": id, "volumes": [{"volume": "model", "path": "state"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        call("POST", &runs, &acme, Some(body))
    };
    let (status, body) = attach("a2", json!({}));
    assert_eq!(
        (status, &body["error"]["reason"]),
        (409, &json!("in_use")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("run a1"),
        "{body}"
    );
    let (status, body) = attach(
        "a3",
        json!({"volumes": [{"volume": "model", "path": "state", "readOnly": true}]}),
    );
    assert_eq!(status, 201, "{body}");
    let (status, _) = call("POST", &format!("{runs}/a3/cancel"), &acme, None);
    assert!(status < 300);
    let (status, body) = attach(
        "a4",
        json!({"volumes": [{"volume": "model", "path": "output", "readOnly": true}]}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("persistent root"),
        "{body}"
    );
    let (status, body) = attach(
        "a5",
        json!({"volumes": [{"volume": "model", "path": "state", "readOnly": true}],
            "inputs": [{"path": "state/x", "content": "x"}]}),
    );
    assert_eq!(status, 400, "{body}");
    // A canary under a random name: one chunk (smaller than the least
    // chunk), so its name is the file's SHA-256.
    let canary = format!("canary-{}", moat_core::random::hex(16));
    let runner = Runner::start(&serve, &setup, &acme, "acme-runner");
    python_op(
        &serve,
        &acme,
        "a1",
        "w",
        &format!("open('state/secret.txt', 'w').write('{canary}')"),
    );
    let chunk = sha256_hex(canary.as_bytes());
    let (_, v) = volume(&serve, &acme, "model");
    let head = v["head"].as_str().unwrap().to_owned();
    let (ok, said) = volumes(&["list"]);
    let shown = format!(
        "model: snapshot {}, 1 files, {} bytes",
        &head[..12],
        canary.len()
    );
    assert!(ok && said.contains(&shown), "{said}");
    finish_run(&serve, &acme, "a1");
    drop(runner);

    let globex = org(&serve, "globex");
    prepare_org(&serve, &setup, &globex);
    // The API: nothing of acme's volume is seen, attached or resumed.
    let (status, body) = volume(&serve, &globex, "model");
    assert_eq!(status, 404, "{body}");
    let (status, body) = call("GET", &format!("{}/v1/volumes", serve.url), &globex, None);
    assert_eq!((status, &body["volumes"]), (200, &json!([])), "{body}");
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &globex,
        Some(json!({"id": "g0", "volumes": [{"volume": "model", "path": "state"}]})),
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &globex,
        Some(json!({"id": "g0", "resumeFrom": "a1"})),
    );
    assert_eq!(status, 404, "{body}");
    let (status, _) = call("GET", &format!("{}/v1/runs/g0", serve.url), &globex, None);
    assert_eq!(status, 404, "run g0 was not made");

    // As a runner: globex's own volume of the same name is another one,
    // and a runner holding globex's run gets nothing of acme's.
    let own = create_volume(&serve, &globex, "model");
    assert_eq!(own["head"], Value::Null, "{own}");
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &globex,
        Some(json!({"id": "g1", "volumes": [{"volume": "model", "path": "state"}]})),
    );
    assert_eq!(status, 201, "{body}");
    let client = test_runner(&serve, &setup, &globex);
    let claim = client
        .claim(Duration::from_secs(5))
        .unwrap()
        .expect("globex's run is claimed");
    assert_eq!(claim.run.id, "g1");
    assert_eq!(claim.run.volumes[0].snapshot, None, "{:?}", claim.run);

    let refusals = |e: moat_client::ClientError| e.status();
    let got = client.get_volume_bytes("g1", "model", VolumeSpace::Snapshots, &head);
    assert_eq!(got.map_err(refusals).err(), Some(Some(404)));
    let got = client.get_volume_bytes("g1", "model", VolumeSpace::Chunks, &chunk);
    assert_eq!(got.map_err(refusals).err(), Some(Some(404)));
    // Whether the chunk exists anywhere is not told: it is missing for globex.
    let asked = ChunkNames {
        chunks: vec![ChunkName {
            sha256: chunk.parse().unwrap(),
            len: u32::try_from(canary.len()).unwrap(),
        }],
    };
    let missing = client.volume_missing("g1", "model", &asked).unwrap();
    assert_eq!(missing, asked);
    // A snapshot naming acme's chunk, without storing it, is refused.
    let snapshot = json!({"format": 1, "entries": [{"path": "secret.txt", "kind": "file",
        "size": canary.len(), "mode": 420, "chunks": [{"sha256": chunk, "len": canary.len()}]}]});
    let document = moat_core::hash::canonical_json(&snapshot).unwrap();
    let id = sha256_hex(&document);
    let put = client.put_volume_bytes("g1", "model", VolumeSpace::Snapshots, &id, &document);
    assert_eq!(put.map_err(refusals).err(), Some(Some(409)));
    // acme's run and acme's volume name through acme's run: not this runner's.
    let got = client.get_volume_bytes("a1", "model", VolumeSpace::Chunks, &chunk);
    assert_eq!(got.map_err(refusals).err(), Some(Some(409)));
    let got = client.get_volume_bytes("g1", "other", VolumeSpace::Chunks, &chunk);
    assert_eq!(got.map_err(refusals).err(), Some(Some(404)));

    // Each refusal is on record, in globex's ledger, by its runner.
    let store = moat_store::Store::open(&db).unwrap();
    let refused = wait_event(&store, moat_core::EventType::RequestRefused);
    let by_runner = refused
        .iter()
        .filter(|e| {
            e.event.data["reason"] == "volume_not_held" && e.event.data["by"] == client.runner_id()
        })
        .count();
    assert_eq!(by_runner, 5, "{refused:#?}");
    // Nothing of acme's leaked: no globex row names the canary's chunk,
    // and acme's volume is as acme left it.
    assert_eq!(
        store
            .missing_chunks(&globex_id(&store), std::slice::from_ref(&chunk))
            .unwrap(),
        vec![chunk.clone()]
    );
    let (_, v) = volume(&serve, &acme, "model");
    assert_eq!(v["head"], head.as_str(), "{v}");

    // A runner of acme's cannot make a snapshot of one volume the head of
    // another: a result naming it is refused, and kept on record.
    create_volume(&serve, &acme, "other");
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "a7", "volumes": [{"volume": "other", "path": "state"}]})),
    );
    assert_eq!(status, 201, "{body}");
    let forger = test_runner(&serve, &setup, &acme);
    let claim = forger.claim(Duration::from_secs(5)).unwrap().expect("a7");
    assert_eq!(claim.run.id, "a7");
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs/a7/ops", serve.url),
        &acme,
        Some(envelope(
            "f-op",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c", "print(1)"]}),
        )),
    );
    assert!(status < 300, "{body}");
    let next = forger.next("a7", Duration::from_secs(10)).unwrap();
    assert!(
        matches!(next, Some(moat_api::runner::Next::Op { .. })),
        "{next:?}"
    );
    let forged = moat_api::runner::ResultBody {
        result: moat_core::OpResult {
            id: "f-op".into(),
            status: moat_core::OpStatus::Ok,
            result: None,
            reason: None,
            message: None,
            event_type: None,
            artifacts: Vec::new(),
        },
        events: Vec::new(),
        artifacts: Vec::new(),
        volumes: vec![moat_api::runner::VolumeHead {
            volume: "other".parse().unwrap(),
            snapshot: head.parse().unwrap(),
            files: 1,
            bytes: 1,
        }],
    };
    let moved = forger.report_result("a7", "f-op", &forged);
    assert_eq!(moved.map_err(|e| e.status()).err(), Some(Some(404)));
    let (_, other) = volume(&serve, &acme, "other");
    assert_eq!(other["head"], Value::Null, "{other}");
    let refused = wait_event(&store, moat_core::EventType::RequestRefused);
    assert!(
        refused
            .iter()
            .any(|e| e.event.data["by"] == forger.runner_id()
                && e.event.data["path"] == "/v1/runner/runs/a7/ops/f-op/result"),
        "{refused:#?}"
    );
    let (status, _) = call(
        "POST",
        &format!("{}/v1/runs/a7/cancel", serve.url),
        &acme,
        None,
    );
    assert!(status < 300);

    // A chunk altered in the store is never restored: the run fails at its
    // first operation, before any program runs, and says why.
    let stored = dir
        .path()
        .join("control.db-outputs/volumes")
        .join(&chunk[..2])
        .join(&chunk);
    std::fs::write(&stored, b"tampered").unwrap();
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "a6", "resumeFrom": "a1"})),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["volumes"][0]["startSnapshot"], head.as_str(), "{body}");
    let _runner = Runner::start(&serve, &setup, &acme, "acme-runner-2");
    let (_, op) = post_op(
        &serve,
        &acme,
        "a6",
        envelope(
            "r",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c", "print(open('state/secret.txt').read())"]}),
        ),
    );
    assert_eq!(
        op["op"]["state"].as_str().or(op["state"].as_str()),
        Some("failed"),
        "{op}"
    );
    wait_state(&serve, &acme, "a6", "failed");
    let (_, run) = call("GET", &format!("{}/v1/runs/a6", serve.url), &acme, None);
    assert!(
        run["error"]
            .as_str()
            .unwrap_or_default()
            .contains("volume model"),
        "{run}"
    );
    let events = run_events(&serve, &acme, "a6");
    assert_eq!(count(&events, "sandbox.exec.started"), 0, "{events:#?}");
    assert_ledger_intact(&serve);
}

fn globex_id(store: &moat_store::Store) -> String {
    store.org_id("globex").unwrap().unwrap()
}
