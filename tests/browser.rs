#![allow(clippy::expect_used, clippy::unwrap_used)]
//! `browser_step` in a managed run, against a real control plane, a real
//! sealed runner and a real sandboxed Chromium: the policy lets looking
//! steps through and holds acting ones for a person; the session lives
//! across the run's operations; what the browser fetched is on the run's
//! record; nothing of it is left on the runner's host.

mod common;

use common::control::*;
use common::servers::Site;
use serde_json::{Value, json};

fn step(serve: &Serve, token: &str, id: &str, args: Value) -> Value {
    let (status, op) = post_op(serve, token, "web", envelope(id, "browser_step", args));
    assert!(status < 300, "{id}: {status} {op}");
    op
}

#[test]
fn a_managed_run_browses_the_allowed_site_and_a_person_approves_its_typing() {
    let site = Site::start();
    let port = site.port;
    let dir = tempfile::tempdir().unwrap();
    let setup = setup_with(dir.path(), |m| {
        m["allowedOps"]
            .as_array_mut()
            .unwrap()
            .push(json!("browser_step"));
        m["networkPolicy"] = json!({
            "mode": "allowlist",
            "allowDomains": [format!("app.test:{port}")],
            "allowAddresses": ["127.0.0.1"],
        });
    });
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let runner = Runner::start_with(
        &serve,
        &setup,
        &acme,
        "runner",
        &["--resolve", "app.test=127.0.0.1"],
    );
    create_run(&serve, &acme, "web");
    let url = |path: &str| format!("http://app.test:{port}{path}");

    let opened = step(
        &serve,
        &acme,
        "open",
        json!({"action": "open", "sessionId": "s"}),
    );
    assert_eq!(opened["state"], "succeeded", "{opened}");
    let sandbox = opened["result"]["result"]["sandboxRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    let page = step(
        &serve,
        &acme,
        "look",
        json!({"action": "navigate", "sessionId": "s", "url": url("/form")}),
    );
    assert_eq!(page["result"]["result"]["title"], "A form", "{page}");
    // Typing is acting: it waits for a person.
    submit_approved(
        &serve,
        &acme,
        "web",
        envelope(
            "type",
            "browser_step",
            json!({"action": "type", "sessionId": "s", "selector": "#q", "text": "managed"}),
        ),
    );
    let (_, typed) = call(
        "GET",
        &format!("{}/v1/runs/web/ops/type?wait_ms=20000", serve.url),
        &acme,
        None,
    );
    assert_eq!(typed["state"], "succeeded", "{typed}");
    let text = step(
        &serve,
        &acme,
        "read",
        json!({"action": "extract", "sessionId": "s", "selector": "form"}),
    );
    assert_eq!(text["state"], "succeeded", "{text}");
    let closed = step(
        &serve,
        &acme,
        "close",
        json!({"action": "close", "sessionId": "s"}),
    );
    assert_eq!(closed["result"]["result"]["closed"], true, "{closed}");
    finish_run(&serve, &acme, "web");
    wait_run_event(&serve, &acme, "web", "run.destroyed");

    // What the browser fetched is on the run's record, with the close.
    let events = run_events(&serve, &acme, "web");
    assert!(
        events.iter().any(|e| e["type"] == "network.request"
            && e["opId"] == "close"
            && e["data"]["host"] == "app.test"),
        "{events:#?}"
    );
    // The screenshot of the page is one of the run's artifacts.
    let (_, artifacts) = call(
        "GET",
        &format!("{}/v1/runs/web/artifacts", serve.url),
        &acme,
        None,
    );
    assert!(artifacts.to_string().contains("screenshot"), "{artifacts}");
    assert!(
        site.hosts()
            .iter()
            .all(|h| h == &format!("app.test:{port}"))
    );
    assert!(
        common::host_processes_with(&sandbox).is_empty(),
        "the browser outlived its run"
    );
    drop(runner);
    assert_ledger_intact(&serve);
}
