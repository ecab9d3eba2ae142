#![allow(clippy::expect_used, clippy::unwrap_used)]
//! A runner says which host it runs on (`/etc/machine-id`, or the id the
//! operator gives) and carries the operator's labels, and the control plane
//! shows both; a control plane that requires a minimum kernel or Landlock
//! ABI turns away a runner below it, recording why. Real `moat serve` and
//! sealed runner processes.

mod common;

use std::time::{Duration, Instant};

use common::control::*;
use moat_core::EventType;
use serde_json::{Value, json};

fn runners(serve: &Serve, token: &str) -> Vec<Value> {
    let (status, body) = call("GET", &format!("{}/v1/runners", serve.url), token, None);
    assert_eq!(status, 200, "{body}");
    body["runners"].as_array().cloned().unwrap_or_default()
}

/// Waits for `runner` to exit; its exit code.
fn exit_code(runner: &mut Runner) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = runner.child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "the runner did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_host_below_the_required_minimum_is_turned_away_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start_with(&setup, &db, "127.0.0.1:0", &["--min-landlock-abi", "99"]);
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let mut low = Runner::start(&serve, &setup, &acme, "low");
    assert_eq!(exit_code(&mut low), Some(2), "a refused runner fails");
    let store = moat_store::Store::open(&db).unwrap();
    let rejected = wait_event(&store, EventType::RunnerRejected);
    let data = &rejected[0].event.data;
    assert_eq!(data["reason"], "host_below_minimum", "{data}");
    assert!(
        data["message"]
            .as_str()
            .is_some_and(|m| m.contains("Landlock ABI") && m.contains("99")),
        "{data}"
    );
    assert!(runners(&serve, &acme).is_empty());

    // A minimum the host meets lets it in.
    drop(serve);
    let serve = Serve::start_with(
        &setup,
        &db,
        "127.0.0.1:0",
        &["--min-landlock-abi", "1", "--min-kernel", "4.19"],
    );
    let _ok = Runner::start(&serve, &setup, &acme, "ok");
    let deadline = Instant::now() + Duration::from_secs(60);
    while runners(&serve, &acme).is_empty() {
        assert!(Instant::now() < deadline, "the runner never registered");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_runner_names_its_host_and_labels_and_bad_ones_are_refused_before_registering() {
    let dir = tempfile::tempdir().unwrap();
    let (setup, _db, serve, acme) = sqlite_plane(dir.path());
    let _labelled = Runner::start_with(
        &serve,
        &setup,
        &acme,
        "labelled",
        &[
            "--host-id",
            "rack-7.host-a",
            "--label",
            "zone=a",
            "--label",
            "dedicated=acme",
        ],
    );
    let _plain = Runner::start(&serve, &setup, &acme, "plain");
    let deadline = Instant::now() + Duration::from_secs(60);
    while runners(&serve, &acme).len() < 2 {
        assert!(Instant::now() < deadline, "the runners never registered");
        std::thread::sleep(Duration::from_millis(200));
    }
    let all = runners(&serve, &acme);
    let labelled = all.iter().find(|r| r["hostId"] == "rack-7.host-a").unwrap();
    assert_eq!(
        labelled["labels"],
        json!({"dedicated": "acme", "zone": "a"})
    );
    let machine = std::fs::read_to_string("/etc/machine-id").unwrap();
    let plain = all.iter().find(|r| r["id"] != labelled["id"]).unwrap();
    assert_eq!(plain["hostId"], machine.trim(), "{plain}");
    assert!(plain.get("labels").is_none(), "{plain}");
    // The Inspector's runners page shows them.
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "20", "-H"])
        .arg(format!("cookie: moat_inspector={acme}"))
        .arg(format!("{}/ui/runners", serve.url))
        .output()
        .unwrap();
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains("rack-7.host-"), "{page}");
    assert!(
        page.contains("zone=a") && page.contains("dedicated=acme"),
        "{page}"
    );

    // A malformed label or host id stops the runner before it registers:
    // its bootstrap token is not spent.
    for (name, flags) in [
        ("bad-label", ["--label", "Zone=a"]),
        ("bad-host", ["--host-id", "a host"]),
    ] {
        let mut bad = Runner::start_with(&serve, &setup, &acme, name, &flags);
        assert_eq!(exit_code(&mut bad), Some(2), "{name}");
    }
    assert_eq!(runners(&serve, &acme).len(), 2);
}
