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

/// An operator approves browser step approval `approval` of run `web` in
/// the Inspector, in a real browser (tests/inspector/browser-session.mjs),
/// having seen the session's page; the run's page shows session `s` with
/// `steps` (actions) first, and the navigation's screenshot.
fn inspector_approves(serve: &Serve, token: &str, approval: &str, steps: &str) {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let shots = here.join("target/inspector-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let walk = std::process::Command::new("node")
        .arg(here.join("tests/inspector/browser-session.mjs"))
        .env("MOAT_URL", &serve.url)
        .env("MOAT_TOKEN", token)
        .env("MOAT_RUN", "web")
        .env("MOAT_SESSION", "s")
        .env("MOAT_APPROVAL", approval)
        .env("MOAT_STEPS", steps)
        .env("MOAT_SHOTS", &shots)
        .output()
        .expect("node (the machine's Node.js)");
    assert!(
        walk.status.success(),
        "the Inspector walk failed:\n{}\n{}",
        String::from_utf8_lossy(&walk.stdout),
        String::from_utf8_lossy(&walk.stderr)
    );
}

/// The rig with `browser_step` allowed and the site `app.test:port` (on
/// loopback) the only one the browser may reach.
fn browsing(dir: &std::path::Path, port: u16) -> Setup {
    browsing_with(dir, port, |_| {})
}

/// [`browsing`], with the manifest edited further.
fn browsing_with(dir: &std::path::Path, port: u16, edit: impl FnOnce(&mut Value)) -> Setup {
    setup_with(dir, |m| {
        m["allowedOps"]
            .as_array_mut()
            .unwrap()
            .push(json!("browser_step"));
        m["networkPolicy"] = json!({
            "mode": "allowlist",
            "allowDomains": [format!("app.test:{port}")],
            "allowAddresses": ["127.0.0.1"],
        });
        edit(m);
    })
}

/// A control plane started with `flags` on a fresh database, org acme
/// ready to browse the site on `port` (see [`browsing`]), its runner
/// resolving `app.test` to loopback, and run `web` created.
fn browsing_run(dir: &std::path::Path, port: u16, flags: &[&str]) -> (Serve, String, Runner) {
    let setup = browsing(dir, port);
    browsing_run_of(&setup, dir, flags)
}

/// [`browsing_run`] with `setup`'s manifest.
fn browsing_run_of(
    setup: &Setup,
    dir: &std::path::Path,
    flags: &[&str],
) -> (Serve, String, Runner) {
    let db = format!("sqlite:{}", dir.join("control.db").display());
    let serve = Serve::start_with(setup, &db, "127.0.0.1:0", flags);
    let acme = org(&serve, "acme");
    prepare_org(&serve, setup, &acme);
    let runner = Runner::start_with(
        &serve,
        setup,
        &acme,
        "runner",
        &["--resolve", "app.test=127.0.0.1"],
    );
    create_run(&serve, &acme, "web");
    (serve, acme, runner)
}

/// Step `id` of run `web`, which waits for a person: approved, then its
/// operation once it has ended.
fn step_approved(serve: &Serve, token: &str, id: &str, args: Value) -> Value {
    let approval = step_held(serve, token, id, args);
    approve(serve, token, approval["id"].as_str().unwrap());
    let (_, op) = call(
        "GET",
        &format!("{}/v1/runs/web/ops/{id}?wait_ms=20000", serve.url),
        token,
        None,
    );
    op
}

/// Submits acting step `id` of run `web` and returns the approval it then
/// waits on: asked for once the runner's browser has found the element
/// (the submission itself only lets it through to be looked at).
fn step_held(serve: &Serve, token: &str, id: &str, args: Value) -> Value {
    let (status, op) = call(
        "POST",
        &format!("{}/v1/runs/web/ops", serve.url),
        token,
        Some(envelope(id, "browser_step", args)),
    );
    assert_eq!(status, 201, "{op}");
    assert_eq!(op["decision"]["elementCheck"], true, "{op}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, list) = call(
            "GET",
            &format!("{}/v1/approvals?state=pending", serve.url),
            token,
            None,
        );
        if let Some(found) = list["approvals"]
            .as_array()
            .and_then(|all| all.iter().find(|a| a["opId"] == id && a["runId"] == "web"))
        {
            return found.clone();
        }
        let (_, now) = call(
            "GET",
            &format!("{}/v1/runs/web/ops/{id}", serve.url),
            token,
            None,
        );
        assert!(
            matches!(
                now["state"].as_str(),
                Some("queued" | "dispatched" | "pending_approval")
            ),
            "step {id} did not wait for a person: {now}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no approval for {id}: {now}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Opens a browser session with step `id` of run `web` (`args`: the
/// `open`'s), checked to have succeeded; returns its sandbox's id.
fn opened(serve: &Serve, token: &str, id: &str, args: Value) -> String {
    let op = step(serve, token, id, args);
    assert_eq!(op["state"], "succeeded", "{op}");
    op["result"]["result"]["sandboxRunId"]
        .as_str()
        .unwrap_or_else(|| panic!("no sandbox: {op}"))
        .to_owned()
}

/// Whether the site got a form posted to `/submit` with `field` in it.
fn posted(site: &Site, field: &str) -> bool {
    site.seen
        .lock()
        .unwrap()
        .iter()
        .any(|r| r.line.starts_with("POST /submit") && r.body.contains(field))
}

/// The run's record holds the shell's refusal of step `id` for `reason`.
fn refusal_recorded(events: &[Value], id: &str, reason: &str) -> bool {
    events.iter().any(|e| {
        e["opId"] == id
            && e["type"].as_str().is_some_and(|t| t.ends_with("denied"))
            && e.to_string().contains(reason)
    })
}

#[test]
fn a_managed_run_browses_the_allowed_site_and_a_person_approves_its_typing() {
    let site = Site::start();
    let port = site.port;
    let dir = tempfile::tempdir().unwrap();
    let (serve, acme, runner) = browsing_run(dir.path(), port, &[]);
    let url = |path: &str| format!("http://app.test:{port}{path}");

    let sandbox = opened(
        &serve,
        &acme,
        "open",
        json!({"action": "open", "sessionId": "s"}),
    );
    let page = step(
        &serve,
        &acme,
        "look",
        json!({"action": "navigate", "sessionId": "s", "url": url("/page")}),
    );
    assert_eq!(
        page["result"]["result"]["title"], "Moat test page",
        "{page}"
    );
    // Following a link is decided on the link, and needs no person.
    let followed = step(
        &serve,
        &acme,
        "follow",
        json!({"action": "click", "sessionId": "s", "selector": "#to-form"}),
    );
    assert_eq!(followed["state"], "succeeded", "{followed}");
    assert_eq!(
        followed["result"]["result"]["title"], "A form",
        "{followed}"
    );
    assert_eq!(followed["decision"]["element"]["tag"], "a", "{followed}");
    // Typing into a form that posts is acting: it waits for a person.
    let typed = step_approved(
        &serve,
        &acme,
        "type",
        json!({"action": "type", "sessionId": "s", "selector": "#q", "text": "managed"}),
    );
    assert_eq!(typed["state"], "succeeded", "{typed}");
    let text = step(
        &serve,
        &acme,
        "read",
        json!({"action": "extract", "sessionId": "s", "selector": "form"}),
    );
    assert_eq!(text["state"], "succeeded", "{text}");
    // A rule on what an element says refuses the step once its element is
    // found: nothing clicked, the refusal on record with the element.
    let wipe = step(
        &serve,
        &acme,
        "wipe",
        json!({"action": "click", "sessionId": "s", "selector": "#wipe"}),
    );
    assert_eq!(wipe["state"], "denied", "{wipe}");
    assert_eq!(wipe["result"]["reason"], "policy_denied", "{wipe}");
    assert_eq!(
        wipe["decision"]["policies"],
        json!(["no-deleting"]),
        "{wipe}"
    );
    let refused = run_events(&serve, &acme, "web");
    assert!(
        refused.iter().any(|e| e["opId"] == "wipe"
            && e["type"] == "capability.denied"
            && e["data"]["element"]["text"] == "Delete everything"),
        "{refused:#?}"
    );
    // Sending the form waits for a person, who approves it in the
    // Inspector, seeing the page and the button it would act on.
    let held = step_held(
        &serve,
        &acme,
        "send",
        json!({"action": "click", "sessionId": "s", "selector": "#go"}),
    );
    assert_eq!(held["rule"], "browse-act", "{held}");
    let would = &held["summary"]["element"];
    assert_eq!(
        (
            &would["tag"],
            &would["text"],
            &would["submits"],
            &would["formMethod"]
        ),
        (
            &json!("button"),
            &json!("Send"),
            &json!(true),
            &json!("post")
        ),
        "{held}"
    );
    inspector_approves(
        &serve,
        &acme,
        held["id"].as_str().unwrap(),
        "open navigate click type extract click click",
    );
    let (_, sent) = call(
        "GET",
        &format!("{}/v1/runs/web/ops/send?wait_ms=20000", serve.url),
        &acme,
        None,
    );
    assert_eq!(sent["state"], "succeeded", "{sent}");
    assert_eq!(sent["result"]["result"]["title"], "Sent", "{sent}");
    // What was clicked, on the record: the form's submit button, posting.
    let element = &sent["result"]["result"]["element"];
    assert_eq!(
        (&element["tag"], &element["type"], &element["text"]),
        (&json!("button"), &json!("submit"), &json!("Send")),
        "{sent}"
    );
    assert_eq!(element["formMethod"], "post", "{sent}");
    assert!(
        element["formAction"]
            .as_str()
            .is_some_and(|a| a.ends_with("/submit")),
        "{sent}"
    );
    assert!(posted(&site, "q=managed"), "the site did not get the form");
    // A second session, never closed: the run's end closes it, and what it
    // fetched is on the record all the same, under the step that opened it.
    let left_sandbox = opened(
        &serve,
        &acme,
        "open-left",
        json!({"action": "open", "sessionId": "left"}),
    );
    step(
        &serve,
        &acme,
        "look-left",
        json!({"action": "navigate", "sessionId": "left", "url": url("/page")}),
    );
    let closed = step(
        &serve,
        &acme,
        "close",
        json!({"action": "close", "sessionId": "s"}),
    );
    assert_eq!(closed["result"]["result"]["closed"], true, "{closed}");
    finish_run(&serve, &acme, "web");
    wait_run_event(&serve, &acme, "web", "run.destroyed");
    let events = run_events(&serve, &acme, "web");
    assert!(
        events.iter().any(|e| e["type"] == "network.request"
            && e["opId"] == "open-left"
            && e["data"]["host"] == "app.test"),
        "the session left open lost its record: {events:#?}"
    );
    assert!(
        common::host_processes_with(&left_sandbox).is_empty(),
        "the browser left open outlived its run"
    );

    // What the browser fetched is on the run's record, with the close.
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

#[test]
fn fill_secret_puts_an_org_secret_in_the_page_and_nowhere_else() {
    let site = Site::start();
    let port = site.port;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("secrets.key");
    std::fs::write(&key_file, "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n").unwrap();
    let (serve, acme, runner) = browsing_run(
        dir.path(),
        port,
        &["--secrets-key", key_file.to_str().unwrap()],
    );
    // Random, with spaces: a form sends it as `open+...`, a URL as `%20`.
    let secret = format!("open sesame {}", moat_core::random::new_id(""));
    let forms = [
        secret.clone(),
        secret.replace(' ', "+"),
        secret.replace(' ', "%20"),
    ];
    let (s, b) = call(
        "PUT",
        &format!("{}/v1/secrets/site-password", serve.url),
        &acme,
        Some(json!({"value": secret})),
    );
    assert_eq!(s, 201, "{b}");
    let sandbox = opened(
        &serve,
        &acme,
        "open",
        json!({"action": "open", "sessionId": "s", "trace": true}),
    );
    step(
        &serve,
        &acme,
        "look",
        json!({"action": "navigate", "sessionId": "s",
               "url": format!("http://app.test:{port}/login")}),
    );
    let approved = |id: &str, args: Value| step_approved(&serve, &acme, id, args);
    // Filling a secret in is acting: a person approves it, seeing its name.
    let filled = approved(
        "fill",
        json!({"action": "fill_secret", "sessionId": "s", "selector": "#pw",
               "secret": "site-password"}),
    );
    assert_eq!(filled["state"], "succeeded", "{filled}");
    assert_eq!(filled["result"]["result"]["matched"], true, "{filled}");
    assert_eq!(
        filled["result"]["result"]["origin"],
        format!("http://app.test:{port}"),
        "{filled}"
    );
    // A secret the org does not have fills nothing, and says why.
    let missing = approved(
        "fill-missing",
        json!({"action": "fill_secret", "sessionId": "s", "selector": "#pw",
               "secret": "no-such-secret"}),
    );
    assert_eq!(missing["result"]["reason"], "not_found", "{missing}");
    let sent = approved(
        "sign-in",
        json!({"action": "click", "sessionId": "s", "selector": "#in"}),
    );
    assert_eq!(sent["state"], "succeeded", "{sent}");
    // The page got it (the site saw the form), and shows it back.
    assert!(
        site.seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.line.contains(&format!("pw={}", forms[1]))),
        "the field was not filled"
    );
    let url = sent["result"]["result"]["url"].as_str().unwrap_or_default();
    assert!(url.contains("[REDACTED:site-password]"), "{sent}");
    let text = step(
        &serve,
        &acme,
        "read",
        json!({"action": "extract", "sessionId": "s", "selector": "#echo"}),
    );
    assert!(
        text["result"]["result"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("[REDACTED:site-password]"),
        "{text}"
    );
    // Asking for part of it finds nothing; a selector on a value is refused.
    let probe = step(
        &serve,
        &acme,
        "probe",
        json!({"action": "wait_for", "sessionId": "s", "text": "sesame", "timeoutMs": 1000}),
    );
    assert_eq!(probe["result"]["result"]["matched"], false, "{probe}");
    let by_value = step(
        &serve,
        &acme,
        "probe-value",
        json!({"action": "extract", "sessionId": "s", "selector": "input[value^=\"open\"]"}),
    );
    assert_eq!(by_value["result"]["reason"], "invalid_args", "{by_value}");
    let escaped = step(
        &serve,
        &acme,
        "probe-escape",
        json!({"action": "wait_for", "sessionId": "s", "selector": "#echo\\20", "timeoutMs": 500}),
    );
    assert_eq!(escaped["result"]["reason"], "invalid_args", "{escaped}");
    // A page showing a secret this session never filled (the control plane
    // knows it, the shell does not): an acting step on it is refused, and
    // no approver is shown it. (An agent cannot make a page show one by
    // putting it in a URL: the control plane scrubs the envelope.)
    let other = "hello, browser".to_owned();
    let (s, b) = call(
        "PUT",
        &format!("{}/v1/secrets/other-secret", serve.url),
        &acme,
        Some(json!({"value": other})),
    );
    assert_eq!(s, 201, "{b}");
    step(
        &serve,
        &acme,
        "show",
        json!({"action": "navigate", "sessionId": "s",
               "url": format!("http://app.test:{port}/page")}),
    );
    let shown = step(
        &serve,
        &acme,
        "click-shown",
        json!({"action": "click", "sessionId": "s", "selector": "#greeting"}),
    );
    assert_eq!(shown["state"], "denied", "{shown}");
    assert_eq!(shown["result"]["reason"], "policy_denied", "{shown}");
    assert!(
        shown["result"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("shows one of the org's secrets")),
        "{shown}"
    );
    let (_, pending) = call("GET", &format!("{}/v1/approvals", serve.url), &acme, None);
    assert!(!pending.to_string().contains("click-shown"), "{pending}");
    let mut answers = Vec::new();
    let closed = step(
        &serve,
        &acme,
        "close",
        json!({"action": "close", "sessionId": "s"}),
    );
    // The session's trace: its pages, requests and console, scrubbed too.
    let trace_sha = closed["result"]["result"]["trace"]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("no trace: {closed}"))
        .to_owned();
    let (status, trace) = download(&format!("{}/v1/artifacts/{trace_sha}", serve.url), &acme);
    assert_eq!(status, 200);
    let trace: Value = serde_json::from_slice(&trace).unwrap();
    let entries = trace["entries"].as_array().unwrap();
    let has = |kind: &str, field: &str, part: &str| {
        entries.iter().any(|e| {
            e["kind"] == kind && e["event"][field].as_str().is_some_and(|v| v.contains(part))
        })
    };
    assert!(has("navigated", "url", "/login"), "{trace:#}");
    assert!(
        has("navigated", "url", "[REDACTED:site-password]"),
        "{trace:#}"
    );
    assert!(has("request", "url", "/welcome"), "{trace:#}");
    assert!(has("console", "text", "login page ready"), "{trace:#}");
    answers.push(trace);
    finish_run(&serve, &acme, "web");
    wait_run_event(&serve, &acme, "web", "run.destroyed");

    // In no form in any answer, event or file of the control plane or the
    // runner (the control plane keeps it sealed).
    let events = run_events(&serve, &acme, "web");
    answers.push(Value::Array(events.clone()));
    for id in ["fill", "fill-missing", "sign-in", "read", "probe", "close"] {
        answers.push(
            call(
                "GET",
                &format!("{}/v1/runs/web/ops/{id}", serve.url),
                &acme,
                None,
            )
            .1,
        );
    }
    answers.push(call("GET", &format!("{}/v1/runs/web", serve.url), &acme, None).1);
    let shown_in = events
        .iter()
        .find(|e| e["opId"] == "click-shown" && e["type"] == "capability.denied")
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert!(
        shown_in["data"]["element"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("[REDACTED:other-secret]")),
        "{shown_in}"
    );
    for answer in &answers {
        assert!(!answer.to_string().contains(other.as_str()), "{answer}");
    }
    for form in &forms {
        for answer in &answers {
            assert!(!answer.to_string().contains(form.as_str()), "{answer}");
        }
        for place in [dir.path(), runner.state.as_path()] {
            let hits = common::files_containing(place, form.as_bytes());
            assert!(hits.is_empty(), "{form:?} in {hits:?}");
        }
    }
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "network.request" && e["opId"] == "close"),
        "{events:#?}"
    );
    // Each refusal is on the run's record with its reason.
    for (id, reason) in [
        ("fill-missing", "not_found"),
        ("probe-value", "invalid_args"),
        ("probe-escape", "invalid_args"),
        ("click-shown", "policy_denied"),
    ] {
        assert!(refusal_recorded(&events, id, reason), "{id}: {events:#?}");
    }
    assert!(
        common::host_processes_with(&sandbox).is_empty(),
        "the browser outlived its run"
    );
    drop(runner);
    assert_ledger_intact(&serve);
}

#[test]
fn a_refreshed_manifest_ends_the_runs_browser_sessions_on_the_record() {
    let site = Site::start();
    let port = site.port;
    let dir = tempfile::tempdir().unwrap();
    let now = std::time::SystemTime::now();
    let day = std::time::Duration::from_secs(86_400);
    // Ten days of life, nine gone: the runner looks for a newer one.
    let setup = browsing_with(dir.path(), port, |m| {
        m["createdAt"] = json!(rfc3339(now - 9 * day));
        m["expiresAt"] = json!(rfc3339(now + day));
    });
    let (serve, acme, _runner) = browsing_run_of(&setup, dir.path(), &[]);
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let sandbox = opened(
        &serve,
        &acme,
        "open",
        json!({"action": "open", "sessionId": "s"}),
    );
    let page = step(
        &serve,
        &acme,
        "look",
        json!({"action": "navigate", "sessionId": "s", "url": format!("http://app.test:{port}/page")}),
    );
    assert_eq!(page["state"], "succeeded", "{page}");

    // A newer manifest takes over at the run's next operation, in a new
    // shell: the old one's session is closed, and what it fetched is on
    // the record under the step that opened it.
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
    let store = moat_store::Store::open(&db).unwrap();
    wait_event(&store, moat_core::EventType::RunnerManifestRefreshed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let events = run_events(&serve, &acme, "web");
        if events.iter().any(|e| {
            e["type"] == "network.request" && e["opId"] == "open" && e["data"]["host"] == "app.test"
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the session's record was lost with its shell: {events:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The next step runs in the new shell, where the session is no more.
    let after = step(
        &serve,
        &acme,
        "after",
        json!({"action": "extract", "sessionId": "s"}),
    );
    assert_eq!(after["result"]["reason"], "invalid_args", "{after}");
    assert!(
        common::host_processes_with(&sandbox).is_empty(),
        "the browser outlived its shell"
    );
    assert_ledger_intact(&serve);
}

/// `moat mcp` over stdio: JSON-RPC requests in, answers matched by id.
struct McpServer {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    next: u64,
}

impl McpServer {
    fn start(args: &[&str]) -> McpServer {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(common::MOAT)
            .arg("mcp")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut server = McpServer {
            child,
            stdin,
            lines,
            next: 1,
        };
        server.ask(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "moat-tests", "version": "0"}}),
        );
        server.write(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server
    }

    fn write(&mut self, message: &Value) {
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends a request and returns its id, without waiting.
    fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// The answer to request `id` (within 120 s).
    fn answer(&mut self, id: u64) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(std::time::Duration::from_secs(120))
                .unwrap_or_else(|e| panic!("no answer from moat mcp to request {id}: {e}"));
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                return message;
            }
        }
    }

    fn ask(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.answer(id)
    }

    /// A `browser_step` tool call: whether it is an error, and the result
    /// it carries.
    fn browse(&mut self, args: Value) -> (bool, Value) {
        let answer = self.ask(
            "tools/call",
            json!({"name": "browser_step", "arguments": args}),
        );
        tool_result(&answer)
    }

    /// Ends the session (stdin closed) and waits for the server's exit.
    fn end(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().unwrap()
    }
}

fn tool_result(answer: &Value) -> (bool, Value) {
    let result = &answer["result"];
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    (
        result["isError"] == true,
        serde_json::from_str(text).unwrap(),
    )
}

#[test]
fn an_mcp_client_browses_as_a_managed_run_and_a_person_approves_its_submit() {
    let site = Site::start();
    let port = site.port;
    let dir = tempfile::tempdir().unwrap();
    let (serve, acme, _runner) = browsing_run(dir.path(), port, &[]);
    let url = |path: &str| format!("http://app.test:{port}{path}");
    let (status, agent) = call(
        "POST",
        &format!("{}/v1/agent-tokens", serve.url),
        &acme,
        Some(json!({})),
    );
    assert_eq!(status, 201, "{agent}");
    let token_file = dir.path().join("agent-token");
    std::fs::write(&token_file, agent["token"].as_str().unwrap()).unwrap();
    let plane = [
        "--control-plane",
        serve.url.as_str(),
        "--token-file",
        common::path_str(&token_file),
    ];

    // Fronting a control plane, the browser's tool is offered (a local
    // `moat mcp` has no capability to give it, and does not: tests/mcp.rs).
    let mut mcp = McpServer::start(&[&plane[..], &["--run", "web"]].concat());
    let tools = mcp.ask("tools/list", json!({}));
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"browser_step"), "{names:?}");
    let schema = &tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "browser_step")
        .unwrap()["inputSchema"];
    assert_eq!(schema["type"], "object", "{schema}");

    let (failed, opened) = mcp.browse(json!({"sessionId": "m", "action": "open"}));
    assert!(!failed, "{opened}");
    let sandbox = opened["result"]["sandboxRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    // A site off the list is refused, visibly.
    let (failed, refused) = mcp.browse(
        json!({"sessionId": "m", "action": "navigate", "url": format!("http://other.test:{port}/page")}),
    );
    assert!(failed, "{refused}");
    assert_eq!(refused["reason"], "domain_not_allowed", "{refused}");
    let (failed, page) =
        mcp.browse(json!({"sessionId": "m", "action": "navigate", "url": url("/page")}));
    assert!(!failed, "{page}");
    assert_eq!(page["result"]["title"], "Moat test page", "{page}");
    assert!(page["result"]["screenshot"]["sha256"].is_string(), "{page}");
    // The page's screenshot comes as an image too, the PNG the step took.
    let shot = mcp.ask(
        "tools/call",
        json!({"name": "browser_step", "arguments": {"sessionId": "m", "action": "screenshot"}}),
    );
    let image = &shot["result"]["content"][1];
    assert_eq!(
        (&image["type"], &image["mimeType"]),
        (&json!("image"), &json!("image/png")),
        "{shot}"
    );
    let png = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(image["data"].as_str().unwrap())
            .unwrap()
    };
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(
        moat_core::hash::sha256_hex(&png),
        tool_result(&shot).1["result"]["screenshot"]["sha256"]
    );
    let (_, text) =
        mcp.browse(json!({"sessionId": "m", "action": "extract", "selector": "#greeting"}));
    assert_eq!(text["result"]["text"], "hello, browser", "{text}");
    // A link is followed without a person.
    let (failed, followed) =
        mcp.browse(json!({"sessionId": "m", "action": "click", "selector": "#to-form"}));
    assert!(!failed, "{followed}");
    assert_eq!(followed["result"]["title"], "A form", "{followed}");
    // The form's submit waits for a person; the call waits with it.
    let pending = mcp.send(
        "tools/call",
        json!({"name": "browser_step",
               "arguments": {"sessionId": "m", "action": "click", "selector": "#go"}}),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let approval = loop {
        let (_, list) = call(
            "GET",
            &format!("{}/v1/approvals?state=pending", serve.url),
            &acme,
            None,
        );
        if let Some(found) = list["approvals"].as_array().and_then(|all| {
            all.iter()
                .find(|a| a["runId"] == "web" && a["summary"]["element"]["text"] == "Send")
        }) {
            break found["id"].as_str().unwrap().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no approval: {list}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    approve(&serve, &acme, &approval);
    let (failed, sent) = tool_result(&mcp.answer(pending));
    assert!(!failed, "{sent}");
    assert_eq!(sent["result"]["title"], "Sent", "{sent}");
    let (failed, closed) = mcp.browse(json!({"sessionId": "m", "action": "close"}));
    assert!(!failed, "{closed}");
    assert!(mcp.end().success());

    // The site got the form; the steps are the run's, on its record.
    assert!(
        site.seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.line.starts_with("POST /submit")),
        "the site did not get the form"
    );
    let events = run_events(&serve, &acme, "web");
    assert!(
        events.iter().any(|e| e["type"] == "network.denied"
            && e["data"]["host"] == "other.test"
            && e["opId"].as_str().is_some_and(|id| id.starts_with("mcp-"))),
        "{events:#?}"
    );
    assert!(
        events.iter().any(|e| e["type"] == "approval.granted"),
        "{events:#?}"
    );
    assert!(
        common::host_processes_with(&sandbox).is_empty(),
        "the browser outlived its session"
    );

    // A token the control plane does not know is refused at start, before
    // any call; so is a run that has ended.
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "moat_at_not-a-token").unwrap();
    for args in [
        vec![
            "--control-plane",
            serve.url.as_str(),
            "--token-file",
            common::path_str(&wrong),
        ],
        vec![
            "--control-plane",
            serve.url.as_str(),
            "--token-file",
            common::path_str(&token_file),
            "--run",
            "no-such-run",
        ],
    ] {
        let refused = std::process::Command::new(common::MOAT)
            .arg("mcp")
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.starts_with("moat mcp: "), "{stderr}");
        assert!(!stderr.contains("moat_at_not-a-token"), "{stderr}");
    }

    // Without --run, the client's run is its own, finished when it goes.
    let mcp = McpServer::start(&plane);
    assert!(mcp.end().success());
    let (_, runs) = call("GET", &format!("{}/v1/runs", serve.url), &acme, None);
    let own: Vec<&Value> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["id"] != "web")
        .collect();
    assert_eq!(own.len(), 1, "{runs}");
    let own_id = own[0]["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, run) = call(
            "GET",
            &format!("{}/v1/runs/{own_id}", serve.url),
            &acme,
            None,
        );
        if run["state"] == "succeeded" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{run}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Operation `id` of run `web` once it has ended (a guest under software
/// emulation takes minutes where a namespace sandbox takes a second).
fn ended(serve: &Serve, token: &str, id: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        let (_, op) = call(
            "GET",
            &format!("{}/v1/runs/web/ops/{id}?wait_ms=20000", serve.url),
            token,
            None,
        );
        if !matches!(op["state"].as_str(), Some("queued" | "dispatched")) {
            return op;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "step {id} never ended: {op}"
        );
    }
}

/// Step `id` of run `web`, submitted and waited for to its end.
fn slow_step(serve: &Serve, token: &str, id: &str, args: Value) -> Value {
    let (status, op) = call(
        "POST",
        &format!("{}/v1/runs/web/ops", serve.url),
        token,
        Some(envelope(id, "browser_step", args)),
    );
    assert_eq!(status, 201, "{op}");
    ended(serve, token, id)
}

#[test]
fn a_policy_that_puts_browsing_in_a_vm_gets_the_session_a_guest_of_its_own() {
    let site = Site::start();
    let port = site.port;
    let dir = tempfile::tempdir().unwrap();
    let policy = format!(
        r#"{POLICY}
@id("browsers-in-a-vm") @workload_class("microvm")
permit(principal, action == Moat::Action::"browser_step", resource);
"#
    );
    let setup = browsing_with(dir.path(), port, |m| {
        m["policyHash"] = json!(sha256_hex(policy.as_bytes()));
        m["workloadClasses"] = json!(["namespace", "microvm"]);
        // This machine's KVM boots no stock kernel: software emulation.
        m["allowEmulation"] = json!(true);
        m["limits"]["memoryBytes"] = json!(2u64 << 30);
        m["limits"]["cpuMillis"] = json!(2000);
    });
    std::fs::write(&setup.policy, &policy).unwrap();
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let runner = Runner::start_with(
        &serve,
        &setup,
        &acme,
        "vm",
        &["--resolve", "app.test=127.0.0.1", "--class", "microvm"],
    );
    // The run needs the class its browser is put in.
    let (status, run) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "web"})),
    );
    assert_eq!(status, 201, "{run}");
    assert_eq!(
        run["workloadClasses"],
        json!(["namespace", "microvm"]),
        "{run}"
    );

    let opened = slow_step(
        &serve,
        &acme,
        "open",
        json!({"action": "open", "sessionId": "s"}),
    );
    assert_eq!(opened["state"], "succeeded", "{opened}");
    assert_eq!(opened["decision"]["class"], "microvm", "{opened}");
    assert_eq!(opened["result"]["result"]["class"], "microvm", "{opened}");
    let sandbox = opened["result"]["result"]["sandboxRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    let page = slow_step(
        &serve,
        &acme,
        "look",
        json!({"action": "navigate", "sessionId": "s", "url": format!("http://app.test:{port}/form")}),
    );
    assert_eq!(page["result"]["result"]["title"], "A form", "{page}");
    let shot = page["result"]["result"]["screenshot"]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("no screenshot: {page}"))
        .to_owned();
    // Acting steps are decided on their element, found in the guest's
    // browser, and wait for a person as on the host.
    let typed_on = step_held(
        &serve,
        &acme,
        "type",
        json!({"action": "type", "sessionId": "s", "selector": "#q", "text": "in a vm"}),
    );
    approve(&serve, &acme, typed_on["id"].as_str().unwrap());
    let typed = ended(&serve, &acme, "type");
    assert_eq!(typed["state"], "succeeded", "{typed}");
    let send_on = step_held(
        &serve,
        &acme,
        "send",
        json!({"action": "click", "sessionId": "s", "selector": "#go"}),
    );
    assert_eq!(send_on["summary"]["element"]["text"], "Send", "{send_on}");
    approve(&serve, &acme, send_on["id"].as_str().unwrap());
    let sent = ended(&serve, &acme, "send");
    assert_eq!(sent["state"], "succeeded", "{sent}");
    assert_eq!(sent["result"]["result"]["title"], "Sent", "{sent}");
    assert!(posted(&site, "q=in+a+vm"), "the site did not get the form");
    // A name outside the list is refused by the proxy the guest reaches.
    let away = slow_step(
        &serve,
        &acme,
        "away",
        json!({"action": "navigate", "sessionId": "s", "url": format!("http://other.test:{port}/page")}),
    );
    assert_eq!(away["result"]["status"], "denied", "{away}");
    assert_eq!(away["result"]["reason"], "domain_not_allowed", "{away}");

    let closed = slow_step(
        &serve,
        &acme,
        "close",
        json!({"action": "close", "sessionId": "s"}),
    );
    assert_eq!(closed["result"]["result"]["closed"], true, "{closed}");

    // The record says where the browser ran, and under which accelerator
    // (with the step that closed it).
    let events = run_events(&serve, &acme, "web");
    let finished = events
        .iter()
        .find(|e| e["type"] == "sandbox.exec.finished" && e["opId"] == "close")
        .unwrap_or_else(|| panic!("no end of the browser's guest: {events:#?}"));
    let report = &finished["data"];
    assert_eq!(report["class"], "microvm", "{finished}");
    let accelerator = report["vm"]["accelerator"].as_str().unwrap_or_default();
    assert!(matches!(accelerator, "kvm" | "tcg"), "{finished}");
    eprintln!("the browser's guest ran under {accelerator}");
    let granted = events
        .iter()
        .find(|e| e["type"] == "capability.granted" && e["opId"] == "open")
        .unwrap();
    assert_eq!(granted["data"]["class"], "microvm", "{granted}");
    assert!(
        events.iter().any(|e| e["type"] == "network.request"
            && e["opId"] == "close"
            && e["data"]["host"] == "app.test"),
        "{events:#?}"
    );
    assert!(
        refusal_recorded(&events, "away", "domain_not_allowed")
            || events
                .iter()
                .any(|e| e["type"] == "network.denied" && e["data"]["host"] == "other.test"),
        "{events:#?}"
    );
    let (_, artifacts) = call(
        "GET",
        &format!("{}/v1/runs/web/artifacts", serve.url),
        &acme,
        None,
    );
    assert!(artifacts.to_string().contains(&shot), "{artifacts}");
    // The site saw only the allowed name; nothing of the guest is left.
    assert!(
        site.hosts()
            .iter()
            .all(|h| h == &format!("app.test:{port}"))
    );
    assert!(
        common::host_processes_with(&sandbox).is_empty(),
        "the browser's guest outlived its session"
    );
    let left: Vec<String> = std::fs::read_dir("/var/cache/moat/microvm/runs")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|name| name.starts_with(&format!("{sandbox}.")))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "the guest's state is left: {left:?}");
    drop(runner);
    assert_ledger_intact(&serve);
}
