#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The credential proxy end to end, on both storage backends: an org stores
//! a secret (sealed, write-only) and defines tools; an agent's
//! `http_request {profile: "control-plane-tool-proxy", tool, params}` is
//! decided by policy, handed to a real sealed runner, and made by the
//! control plane against a vendor server this test runs, which checks the
//! injected credential and echoes it back. Then the secret is searched for
//! everywhere: the database files, the runner's state directory and
//! environment, the control plane's log, every event and result. Zero hits.

mod common;
// A tool host answering differently on a second lookup.
#[path = "credentials/rebinding.rs"]
mod rebinding;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::control::*;
use common::servers::read_head;
use serde_json::{Value, json};

/// A vendor API on 127.0.0.1: answers 200 with the account (and, carelessly,
/// the credential it was sent) when the bearer token is right, 401 if not.
struct Vendor {
    port: u16,
    auth_seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Vendor {
    fn start(secret: &str) -> Vendor {
        Self::start_at(secret, "127.0.0.1:0")
    }

    /// A vendor listening at `address`.
    fn start_at(secret: &str, address: &str) -> Vendor {
        let listener = TcpListener::bind(address).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let auth_seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, stopping, want) = (auth_seen.clone(), stop.clone(), format!("Bearer {secret}"));
        std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                let Some(head) = read_head(&mut stream) else {
                    continue;
                };
                let auth = head
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
                    .map(|(_, v)| v.trim().to_owned())
                    .unwrap_or_default();
                seen.lock().unwrap().push(auth.clone());
                let (status, body) = if auth == want {
                    let line = head.lines().next().unwrap_or_default().to_owned();
                    (
                        "200 OK",
                        json!({
                            "request": line,
                            "account": {"id": "acct-7", "name": "Ada", "ssn": "123-45-6789"},
                            "internal": {"costCenter": "x-99"},
                            "debug": {"authorization": auth},
                        })
                        .to_string(),
                    )
                } else {
                    (
                        "401 Unauthorized",
                        json!({"error": "bad credential"}).to_string(),
                    )
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes());
                let _ = stream.shutdown(Shutdown::Write);
                let mut rest = [0u8; 512];
                while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
            }
        });
        Vendor {
            port,
            auth_seen,
            stop,
        }
    }
}

impl Drop for Vendor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The vendor's account lookup as a tool: the secret `crm_key` as a bearer
/// token, internal fields dropped, social security numbers masked.
fn crm_lookup(vendor: &Vendor) -> Value {
    json!({
        "name": "crm_lookup", "method": "GET",
        "url": format!("http://127.0.0.1:{}/accounts/{{id}}", vendor.port),
        "params": {"id": {"type": "string", "required": true}},
        "credential": {"secret": "crm_key", "in": "header", "name": "Authorization", "prefix": "Bearer "},
        "redact": {"drop": ["/internal"], "mask": ["\\d{3}-\\d{2}-\\d{4}"]},
    })
}

/// Stores `secret` as the org's `crm_key` and defines `tool`.
fn secret_and_tool(url: &str, token: &str, secret: &str, tool: Value) {
    let (s, b) = call(
        "PUT",
        &format!("{url}/v1/secrets/crm_key"),
        token,
        Some(json!({"value": secret})),
    );
    assert_eq!(s, 201, "{b}");
    let (s, b) = call("POST", &format!("{url}/v1/tools"), token, Some(tool));
    assert_eq!(s, 201, "{b}");
}

/// A fresh random secret (whatever contains it got it from us), the vendor
/// that expects it, and the control plane's key for sealing secrets.
fn secret_vendor_and_key(dir: &std::path::Path) -> (String, Vendor, std::path::PathBuf) {
    let secret = format!("sk-live-{}", moat_core::random::new_id(""));
    let vendor = Vendor::start(&secret);
    let key_file = dir.join("secrets.key");
    std::fs::write(&key_file, "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n").unwrap();
    (secret, vendor, key_file)
}

/// `moat serve` with secrets, whose tools may call the vendor on this
/// machine's loopback.
fn serve_with_tools(setup: &Setup, db: &str, listen: &str, key_file: &std::path::Path) -> Serve {
    Serve::start_with(
        setup,
        db,
        listen,
        &[
            "--secrets-key",
            key_file.to_str().unwrap(),
            "--tools-allow-private-addresses",
        ],
    )
}

#[test]
fn tool_calls_get_the_credential_at_the_control_plane_and_the_secret_leaks_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup_with(dir.path(), |m| {
        m["allowedOps"]
            .as_array_mut()
            .unwrap()
            .push(json!("http_request"));
        m["allowedTools"] = json!(["crm_lookup", "crm_update"]);
    });
    let (secret, vendor, key_file) = secret_vendor_and_key(dir.path());
    for db in databases(dir.path()) {
        let serve = serve_with_tools(&setup, &db.url, "127.0.0.1:0", &key_file);
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let calls_before = vendor.auth_seen.lock().unwrap().len();
        let runner = Runner::start(&serve, &setup, &acme, &format!("tools-{}", db.url.len()));

        // The secret goes in; it never comes out.
        let url = &serve.url;
        secret_and_tool(url, &acme, &secret, crm_lookup(&vendor));
        let (s, b) = call("GET", &format!("{url}/v1/secrets"), &acme, None);
        assert_eq!(
            (s, b["secrets"][0]["name"].as_str()),
            (200, Some("crm_key"))
        );
        assert!(!b.to_string().contains(&secret));
        let credential = json!({"secret": "crm_key", "in": "header", "name": "Authorization", "prefix": "Bearer "});
        let update = json!({
            "name": "crm_update", "method": "POST",
            "url": format!("http://127.0.0.1:{}/accounts/{{id}}", vendor.port),
            "params": {"id": {"type": "string", "required": true}, "name": {"type": "string"}},
            "credential": credential, "approval": true,
        });
        assert_eq!(
            call("POST", &format!("{url}/v1/tools"), &acme, Some(update)).0,
            201
        );
        let (s, _) = call(
            "POST",
            &format!("{url}/v1/tools"),
            &acme,
            Some(json!({"name": "evil", "method": "GET", "url": "http://{host}/x"})),
        );
        assert_eq!(s, 400, "a templated host is refused");

        let (s, b) = call(
            "POST",
            &format!("{url}/v1/runs"),
            &acme,
            Some(json!({"id": "run-t"})),
        );
        assert_eq!(s, 201, "{b}");
        let tool_op = |id: &str, tool: &str, params: Value| {
            envelope(
                id,
                "http_request",
                json!({"profile": "control-plane-tool-proxy", "tool": tool, "params": params}),
            )
        };
        let (status, op) = post_op(
            &serve,
            &acme,
            "run-t",
            tool_op("look", "crm_lookup", json!({"id": "acct-7"})),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "{op}"
        );
        let body = &op["result"]["result"]["body"];
        assert_eq!(op["result"]["result"]["status"], 200, "{op}");
        assert_eq!(body["account"]["name"], "Ada", "{op}");
        assert_eq!(body["account"]["ssn"], "[MASKED]", "{op}");
        assert!(body.get("internal").is_none(), "dropped field kept: {op}");
        assert_eq!(
            body["debug"]["authorization"], "Bearer [REDACTED:crm_key]",
            "{op}"
        );
        assert_eq!(
            vendor.auth_seen.lock().unwrap().last().map(String::as_str),
            Some(format!("Bearer {secret}").as_str()),
            "the vendor got the credential"
        );

        // A tool marked for approval waits; an unknown tool, or one outside
        // the manifest, is refused before anything is called.
        let (status, op) = call(
            "POST",
            &format!("{url}/v1/runs/run-t/ops"),
            &acme,
            Some(tool_op(
                "upd",
                "crm_update",
                json!({"id": "acct-7", "name": "Bob"}),
            )),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (202, Some("pending_approval")),
            "{op}"
        );
        let (status, op) = post_op(
            &serve,
            &acme,
            "run-t",
            tool_op("nope", "billing", json!({})),
        );
        assert_eq!(
            (status, op["error"]["reason"].as_str()),
            (403, Some("invalid_args")),
            "{op}"
        );
        let calls = vendor.auth_seen.lock().unwrap().len();
        assert_eq!(
            calls,
            calls_before + 1,
            "only the allowed call reached the vendor"
        );
        let refused = run_events(&serve, &acme, "run-t");
        assert!(
            refused.iter().any(|e| e["type"] == "capability.denied"
                && e["opId"] == "nope"
                && e["data"]["reason"] == "invalid_args"),
            "the refusal is not recorded: {refused:#?}"
        );

        // The runner never held it: not in its environment or its state.
        let env = std::fs::read(format!("/proc/{}/environ", runner.child.id())).unwrap();
        assert!(
            !env.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "runner environment"
        );
        let hits = common::files_containing(&runner.state, secret.as_bytes());
        assert!(hits.is_empty(), "runner state: {hits:?}");

        // An agent cannot pass the secret to a program (scrubbed from the
        // envelope), and a program that assembles and prints it has it
        // scrubbed from its result and events before they are kept.
        let (status, op) = post_op(
            &serve,
            &acme,
            "run-t",
            envelope(
                "pass",
                "exec_argv",
                json!({"argv": ["/usr/bin/python3", "-c", "import sys; print(sys.argv[1])", secret]}),
            ),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "{op}"
        );
        assert!(
            op["result"].to_string().contains("[REDACTED:crm_key]"),
            "{op}"
        );
        let (status, op) = post_op(
            &serve,
            &acme,
            "run-t",
            envelope(
                "echo",
                "exec_argv",
                json!({"argv": ["/usr/bin/python3", "-c", format!("print('{}' + '{}')", &secret[..10], &secret[10..])]}),
            ),
        );
        assert_eq!(
            (status, op["state"].as_str()),
            (200, Some("succeeded")),
            "{op}"
        );
        assert!(
            op["result"].to_string().contains("[REDACTED:crm_key]"),
            "{op}"
        );

        // Nowhere: not in any event, result, database file, runner state or environment.
        let events = run_events(&serve, &acme, "run-t");
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "network.request" && e["data"]["tool"] == "crm_lookup")
        );
        let (_, ops) = call("GET", &format!("{url}/v1/runs/run-t/ops"), &acme, None);
        for text in [serde_json::to_string(&events).unwrap(), ops.to_string()] {
            assert!(
                !text.contains(&secret),
                "the secret is in an event or result"
            );
        }
        if db.url.starts_with("sqlite:") {
            let db_dir = dir.path().join("control.db");
            let hits: Vec<String> = ["", "-wal", "-shm"]
                .iter()
                .flat_map(|ext| {
                    let path = std::path::PathBuf::from(format!("{}{ext}", db_dir.display()));
                    std::fs::read(&path)
                        .ok()
                        .filter(|b| b.windows(secret.len()).any(|w| w == secret.as_bytes()))
                        .map(|_| path.display().to_string())
                })
                .collect();
            assert!(hits.is_empty(), "the database files: {hits:?}");
        } else {
            let dump = std::process::Command::new("pg_dump")
                .arg(&db.url)
                .output()
                .expect("pg_dump (Debian's postgresql-client, installed with postgresql)");
            assert!(
                dump.status.success(),
                "{}",
                String::from_utf8_lossy(&dump.stderr)
            );
            assert!(dump.stdout.len() > 1000, "an empty dump proves nothing");
            assert!(
                !dump
                    .stdout
                    .windows(secret.len())
                    .any(|w| w == secret.as_bytes()),
                "the secret is in the PostgreSQL database"
            );
        }
        drop(runner);
        drop(serve);
    }

    // Without --tools-allow-private-addresses, a tool cannot reach this
    // machine's own network: the call is refused before it is sent.
    let serve = Serve::start_with(
        &setup,
        &format!("sqlite:{}", dir.path().join("closed.db").display()),
        "127.0.0.1:0",
        &["--secrets-key", key_file.to_str().unwrap()],
    );
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let runner = Runner::start(&serve, &setup, &acme, "tools-closed");
    let url = &serve.url;
    secret_and_tool(url, &acme, &secret, crm_lookup(&vendor));
    assert_eq!(
        call(
            "POST",
            &format!("{url}/v1/runs"),
            &acme,
            Some(json!({"id": "run-c"}))
        )
        .0,
        201
    );
    let before = vendor.auth_seen.lock().unwrap().len();
    let (status, op) = post_op(
        &serve,
        &acme,
        "run-c",
        envelope(
            "look",
            "http_request",
            json!({"profile": "control-plane-tool-proxy", "tool": "crm_lookup", "params": {"id": "a"}}),
        ),
    );
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("failed")),
        "{op}"
    );
    assert!(
        op["result"]["message"]
            .as_str()
            .unwrap()
            .contains("--tools-allow-private-addresses"),
        "{op}"
    );
    assert_eq!(
        vendor.auth_seen.lock().unwrap().len(),
        before,
        "the vendor was called"
    );
    let events = run_events(&serve, &acme, "run-c");
    assert!(
        events.iter().any(|e| e["type"] == "network.request"
            && e["opId"] == "look"
            && e["data"]["decision"] == "denied"
            && e["data"]["reason"] == "address_not_allowed"
            && e["data"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("non-public") || m.contains("refused"))),
        "the refusal is not recorded: {events:#?}"
    );
    drop(runner);
}

#[test]
fn a_program_calls_a_tool_itself_with_a_token_good_for_its_operation_only() {
    let dir = tempfile::tempdir().unwrap();
    // The control plane's address must be in the manifest sealed into the
    // runner: pick the port first.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let setup = setup_with(dir.path(), |m| {
        m["allowedOps"]
            .as_array_mut()
            .unwrap()
            .push(json!("http_request"));
        m["allowedTools"] = json!(["crm_lookup"]);
        m["networkPolicy"] = json!({
            "mode": "allowlist",
            "allowDomains": [format!("cp.test:{port}")],
            "allowAddresses": ["127.0.0.1/32"],
        });
    });
    let (secret, vendor, key_file) = secret_vendor_and_key(dir.path());
    for db in databases(dir.path()) {
        let serve = serve_with_tools(&setup, &db.url, &format!("127.0.0.1:{port}"), &key_file);
        let acme = org(&serve, "acme");
        prepare_org(&serve, &setup, &acme);
        let name = format!("token-{}", db.url.len());
        let runner = Runner::start_with(
            &serve,
            &setup,
            &acme,
            &name,
            &["--resolve", "cp.test=127.0.0.1"],
        );
        let url = &serve.url;
        secret_and_tool(url, &acme, &secret, crm_lookup(&vendor));
        assert_eq!(
            call(
                "POST",
                &format!("{url}/v1/runs"),
                &acme,
                Some(json!({"id": "run-p"}))
            )
            .0,
            201
        );

        // The program reads its token on stdin and calls the tool through
        // the egress proxy; it prints the answer, and the token, so that
        // the test can try it again afterwards.
        let script = format!(
            "import sys, json, urllib.request\n\
             token = sys.stdin.readline().strip()\n\
             req = urllib.request.Request('http://cp.test:{port}/v1/tool-tokens/call',\n\
                 data=json.dumps({{'tool': 'crm_lookup', 'params': {{'id': 'acct-7'}}}}).encode(),\n\
                 headers={{'Authorization': 'Bearer ' + token, 'content-type': 'application/json'}})\n\
             print(urllib.request.urlopen(req, timeout=15).read().decode())\n\
             print('TOKEN', token)\n"
        );
        let program = envelope(
            "prog",
            "exec_argv",
            json!({"argv": ["/usr/bin/python3", "-c", script], "network": "allowlist",
                   "toolToken": ["crm_lookup"], "timeoutMs": 20000}),
        );
        // A program with network waits for a person (the test policy).
        let (status, pending) = call(
            "POST",
            &format!("{url}/v1/runs/run-p/ops"),
            &acme,
            Some(program),
        );
        assert_eq!(status, 202, "{pending}");
        assert!(
            pending["decision"]["toolToken"]["crm_lookup"].is_string(),
            "{pending}"
        );
        let approval = pending["approval"]["id"].as_str().unwrap();
        let (s, b) = call(
            "POST",
            &format!("{url}/v1/approvals/{approval}/approve"),
            &acme,
            Some(json!({})),
        );
        assert_eq!(s, 200, "{b}");
        let (_, op) = call(
            "GET",
            &format!("{url}/v1/runs/run-p/ops/prog?wait_ms=30000"),
            &acme,
            None,
        );
        assert_eq!(op["state"], "succeeded", "{op}");
        let stdout = op["result"]["result"]["stdout"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(stdout.contains("\"name\":\"Ada\""), "{op}");
        assert!(stdout.contains("[MASKED]"), "{stdout}");
        assert!(stdout.contains("Bearer [REDACTED:crm_key]"), "{stdout}");
        assert!(!stdout.contains(&secret));
        assert_eq!(
            vendor.auth_seen.lock().unwrap().last().map(String::as_str),
            Some(format!("Bearer {secret}").as_str())
        );
        // The call is on the operation's record.
        let events = run_events(&serve, &acme, "run-p");
        assert!(
            events.iter().any(|e| e["type"] == "network.request"
                && e["opId"] == "prog"
                && e["data"]["via"] == "tool-token"),
            "{events:#?}"
        );
        // The operation is over: so is its token.
        let token = stdout
            .lines()
            .find_map(|l| l.strip_prefix("TOKEN "))
            .unwrap()
            .trim()
            .to_owned();
        let mut again = ureq::post(&format!("{url}/v1/tool-tokens/call"))
            .header("authorization", &format!("Bearer {token}"))
            .header("content-type", "application/json")
            .config()
            .http_status_as_error(false)
            .build()
            .send(
                json!({"tool": "crm_lookup", "params": {"id": "acct-7"}})
                    .to_string()
                    .as_bytes(),
            )
            .unwrap();
        assert_eq!(
            again.status().as_u16(),
            401,
            "{}",
            again.body_mut().read_to_string().unwrap()
        );
        // Not in any event or result, not in the runner's state or environment.
        let (_, ops) = call("GET", &format!("{url}/v1/runs/run-p/ops"), &acme, None);
        for text in [serde_json::to_string(&events).unwrap(), ops.to_string()] {
            assert!(!text.contains(&secret));
        }
        let hits = common::files_containing(&runner.state, secret.as_bytes());
        assert!(hits.is_empty(), "runner state: {hits:?}");
        drop(runner);
        drop(serve);
    }
}
