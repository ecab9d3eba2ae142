#![allow(clippy::expect_used, clippy::unwrap_used)]
//! A managed run's ports (`ingress-only`), against a real control plane, a
//! real sealed runner and a real sandbox: a program an operation starts
//! serves HTTP and a WebSocket through `/v1/runs/{run}/ports/{port}/...`
//! with the org's token, and nothing without it; from inside it reaches
//! nothing and binds only its port; every connection is recorded as
//! `network.ingress`; and nothing is left on the runner's host.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::control::*;
use common::{free_port, path_str};
use serde_json::{Value, json};

/// The program: files of the workspace (`http.server`'s), `/checks` (what
/// it tried from inside), `/headers` (what reached it), `POST /sum` (a
/// body's SHA-256), a WebSocket echo at `/echo`, and `/quit`.
const SERVER: &str = r#"
import base64, hashlib, http.server, json, socket, threading
def attempt(f):
    try:
        f()
        return "ok"
    except Exception as e:
        return type(e).__name__
checks = {
    "outside": attempt(lambda: socket.create_connection(("192.0.2.1", 80), 3)),
    "dns": attempt(lambda: socket.getaddrinfo("example.com", 80)),
    "bind-other": attempt(lambda: socket.socket().bind(("127.0.0.1", 9000))),
}
class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, body, status=200):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "moat_inspector=forged; Path=/ui")
        self.send_header("Strict-Transport-Security", "max-age=31536000")
        self.send_header("Cache-Control", "public, max-age=86400")
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/checks":
            self.answer(json.dumps(checks).encode())
        elif self.path.startswith("/headers"):
            self.answer(json.dumps({"path": self.path, "headers": dict(self.headers)}).encode())
        elif self.path == "/quit":
            self.answer(b"bye")
            threading.Thread(target=server.shutdown).start()
        elif self.path == "/echo":
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1(
                (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            self.wfile.flush()
            head = self.rfile.read(2)
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(head[1] & 127)))
            self.wfile.write(bytes([0x81, len(data)]) + data[::-1])
            self.wfile.flush()
            self.close_connection = True
        else:
            super().do_GET()
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.answer(hashlib.sha256(body).hexdigest().encode())
server = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Handler)
server.serve_forever()
print(json.dumps(checks))
"#;

/// `method url` with `token` (none: no `Authorization`), and the answer's
/// status and body as text.
fn request(method: &str, url: &str, token: Option<&str>, body: Option<&[u8]>) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let answer = match (method, body) {
        ("GET", _) => {
            let mut r = agent.get(url);
            if let Some(token) = token {
                r = r.header("authorization", &format!("Bearer {token}"));
            }
            r.call()
        }
        (_, body) => {
            let mut r = agent.post(url);
            if let Some(token) = token {
                r = r.header("authorization", &format!("Bearer {token}"));
            }
            r.send(body.unwrap_or_default())
        }
    };
    let mut answer = answer.expect("an answer");
    let status = answer.status().as_u16();
    let text = answer.body_mut().read_to_string().unwrap_or_default();
    (status, text)
}

/// A WebSocket to `path` of the run's port 8000 through the control plane:
/// sends `message` in one masked frame and returns the one frame's text
/// that comes back, with the handshake's status line.
fn websocket(serve: &Serve, token: &str, run: &str, message: &str) -> (String, String) {
    let mut tcp = TcpStream::connect(format!("127.0.0.1:{}", serve.port())).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        tcp,
        "GET /v1/runs/{run}/ports/8000/echo HTTP/1.1\r\nHost: localhost\r\n\
         Authorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.lines().next().unwrap_or_default().to_owned();
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    let mask = [7u8, 1, 2, 3];
    let mut frame = vec![0x81, 0x80 | u8::try_from(message.len()).unwrap()];
    frame.extend_from_slice(&mask);
    frame.extend(message.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    tcp.write_all(&frame).unwrap();
    let mut header = [0u8; 2];
    tcp.read_exact(&mut header).unwrap();
    let mut payload = vec![0u8; usize::from(header[1] & 127)];
    tcp.read_exact(&mut payload).unwrap();
    (status, String::from_utf8(payload).unwrap())
}

/// The operation that runs [`SERVER`] on port 8000 (up to 2 minutes).
fn serving_op() -> Value {
    envelope(
        "serve",
        "exec_argv",
        json!({"argv": ["/usr/bin/python3", "-c", SERVER], "network": "ingress-only",
               "expose": [8000], "timeoutMs": 120000}),
    )
}

#[test]
fn a_managed_runs_port_is_served_through_the_authenticated_route_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup_with(dir.path(), |m| {
        m["networkPolicy"]["expose"] = json!([8000]);
        // A program that serves lives as long as its operation may.
        m["limits"]["timeoutMs"] = json!(120_000);
    });
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let globex = org(&serve, "globex");
    let runner = Runner::start(&serve, &setup, &acme, "runner");
    create_run(&serve, &acme, "web");
    let port = |path: &str| format!("{}/v1/runs/web/ports/{path}", serve.url);

    // Nothing is exposed before the operation runs.
    let (status, body) = request("GET", &port("8000/input/a.txt"), Some(&acme), None);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("port_not_exposed"), "{body}");

    // The operation: the program serves port 8000 until /quit. Python
    // with any network asks for an approval under the test policy.
    submit_approved(&serve, &acme, "web", serving_op());

    // The page, once the program listens.
    let deadline = Instant::now() + Duration::from_secs(120);
    let page = loop {
        let (status, body) = request("GET", &port("8000/input/a.txt"), Some(&acme), None);
        if status == 200 {
            break body;
        }
        let (_, op) = call(
            "GET",
            &format!("{}/v1/runs/web/ops/serve", serve.url),
            &acme,
            None,
        );
        assert!(
            Instant::now() < deadline
                && matches!(
                    op["state"].as_str(),
                    Some("queued" | "dispatched" | "pending_approval")
                ),
            "the page never came: {status} {body}; {op}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(page, "abc\n");
    // In a browser, the program's pages cannot script the control plane;
    // the program cannot set cookies, transport or caching rules on it.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let answer = agent
        .get(&port("8000/input/a.txt"))
        .header("authorization", &format!("Bearer {acme}"))
        .call()
        .unwrap();
    let header = |name: &str| {
        answer
            .headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let policy = header("content-security-policy");
    assert!(policy.starts_with("sandbox "), "{policy:?}");
    assert!(!policy.contains("allow-same-origin"), "{policy:?}");
    assert_eq!(header("set-cookie"), "");
    assert_eq!(header("strict-transport-security"), "");
    assert_eq!(header("cache-control"), "private, no-store");
    // The port without a slash is the program's `/`, where a browser-like
    // caller is sent (so that relative links resolve).
    let answer = agent
        .get(&port("8000?a=b"))
        .header("authorization", &format!("Bearer {acme}"))
        .call()
        .unwrap();
    assert_eq!(answer.status(), 308);
    assert_eq!(
        answer
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some("/v1/runs/web/ports/8000/?a=b")
    );

    // The Inspector shows the operation's network and where its port is.
    let page = inspector_page(&serve, &acme, "/ui/runs/web");
    assert!(page.contains(r#"data-network="ingress-only""#), "{page}");
    assert!(page.contains("/v1/runs/web/ports/8000/"), "{page}");

    // Refused without the org's token, to another org, and on a port the
    // operation does not expose.
    let (status, body) = request("GET", &port("8000/input/a.txt"), None, None);
    assert_eq!(status, 401, "{body}");
    let (status, body) = request("GET", &port("8000/input/a.txt"), Some("not-a-token"), None);
    assert_eq!(status, 401, "{body}");
    let (status, body) = request("GET", &port("8000/input/a.txt"), Some(&globex), None);
    assert_eq!(status, 404, "{body}");
    let (status, body) = request("GET", &port("9000/"), Some(&acme), None);
    assert_eq!(status, 409, "{body}");
    let (status, body) = request("GET", &port("http/"), Some(&acme), None);
    assert_eq!(status, 400, "{body}");

    // The caller's credentials never reach the program, nor what a proxy
    // said about the caller; its path (as sent, any bytes escaped) and its
    // query do.
    let mut answer = agent
        .get(&port("8000/headers%FF?x=1"))
        .header("authorization", &format!("Bearer {acme}"))
        .header("x-forwarded-for", "203.0.113.9")
        .header("forwarded", "for=203.0.113.9")
        .call()
        .unwrap();
    assert_eq!(answer.status(), 200);
    let body = answer.body_mut().read_to_string().unwrap();
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["path"], "/headers%FF?x=1", "{seen}");
    let headers = seen["headers"].as_object().unwrap();
    for withheld in ["authorization", "x-forwarded-for", "forwarded"] {
        assert!(
            headers.keys().all(|k| !k.eq_ignore_ascii_case(withheld)),
            "{withheld}: {seen}"
        );
    }
    assert!(
        !body.contains(&acme),
        "the token reached the program: {body}"
    );
    assert_eq!(seen["headers"]["host"], "localhost:8000", "{seen}");

    // A request body travels; a WebSocket too.
    let payload = vec![b'z'; 300_000];
    let (status, sum) = request("POST", &port("8000/sum"), Some(&acme), Some(&payload));
    assert_eq!((status, sum.as_str()), (200, sha256_hex(&payload).as_str()));
    let (status, echoed) = websocket(&serve, &acme, "web", "hello over moat");
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    assert_eq!(echoed, "taom revo olleh");

    // From inside: no way out, no name lookup, no other port.
    let (status, body) = request("GET", &port("8000/checks"), Some(&acme), None);
    assert_eq!(status, 200, "{body}");
    let checks: Value = serde_json::from_str(&body).unwrap();
    for check in ["outside", "dns", "bind-other"] {
        assert_ne!(checks[check], "ok", "{check}: {checks}");
    }

    // The program ends; its port is not served any more.
    let (status, body) = request("GET", &port("8000/quit"), Some(&acme), None);
    assert_eq!((status, body.as_str()), (200, "bye"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let op = loop {
        let (_, op) = call(
            "GET",
            &format!("{}/v1/runs/web/ops/serve?wait_ms=5000", serve.url),
            &acme,
            None,
        );
        if !matches!(op["state"].as_str(), Some("queued" | "dispatched")) {
            break op;
        }
        assert!(Instant::now() < deadline, "the operation never ended: {op}");
    };
    assert_eq!(op["state"], "succeeded", "{op}");
    let (status, body) = request("GET", &port("8000/input/a.txt"), Some(&acme), None);
    assert_eq!(status, 409, "{body}");

    // Every connection is on record (method, path, status; never the
    // query), and so is every way out the program tried.
    let events = run_events(&serve, &acme, "web");
    let ingress: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "network.ingress")
        .collect();
    let seen_request = |method: &str, path: &str, status: u64| {
        ingress.iter().any(|e| {
            e["data"]["port"] == 8000
                && e["data"]["method"] == method
                && e["data"]["path"] == path
                && e["data"]["status"] == status
        })
    };
    for (method, path, status) in [
        ("GET", "/input/a.txt", 200),
        ("GET", "/headers%FF", 200),
        ("POST", "/sum", 200),
        ("GET", "/echo", 101),
        ("GET", "/checks", 200),
        ("GET", "/quit", 200),
    ] {
        assert!(
            seen_request(method, path, status),
            "{method} {path} {status} is not on record: {ingress:#?}"
        );
    }
    assert!(
        !serde_json::to_string(&ingress).unwrap().contains("x=1"),
        "a query was recorded: {ingress:#?}"
    );
    let denied: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "network.denied")
        .collect();
    for address in ["192.0.2.1:80", "127.0.0.1:9000"] {
        assert!(
            denied.iter().any(|e| e["data"]["address"] == address),
            "{address} is not on record as denied: {denied:#?}"
        );
    }

    // A port the manifest does not list is refused by the runner's shell,
    // and the refusal recorded.
    let other = envelope(
        "other",
        "exec_argv",
        json!({"argv": ["/usr/bin/python3", "-c", SERVER], "network": "ingress-only",
               "expose": [8001]}),
    );
    submit_approved(&serve, &acme, "web", other);
    let (_, op) = call(
        "GET",
        &format!("{}/v1/runs/web/ops/other?wait_ms=20000", serve.url),
        &acme,
        None,
    );
    assert_eq!(op["result"]["reason"], "network_not_allowed", "{op}");
    assert!(
        op["result"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("networkPolicy.expose")),
        "{op}"
    );
    let events = run_events(&serve, &acme, "web");
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "network.denied" && e["opId"] == "other"),
        "{events:#?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "sandbox.exec.started" && e["opId"] == "other"),
        "{events:#?}"
    );

    // Once the run ends, nothing of its ports is left on the runner's host.
    finish_run(&serve, &acme, "web");
    wait_run_event(&serve, &acme, "web", "run.destroyed");
    let sockets = runner.state.join("ingress").join("web");
    assert!(!sockets.exists(), "{} is left", sockets.display());
    // The audit says the mode and counts the connections in.
    let out = std::process::Command::new(common::MOAT)
        .args(["audit", "web", "--db", &db])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let connections = format!("{} connections in)", ingress.len());
    assert!(
        said.contains("Network: ingress-only") && said.contains(&connections),
        "{said}"
    );
    assert_ledger_intact(&serve);
}

/// Waits until `url` answers 200 with the org's token, and returns the body.
fn until_served(url: &str, token: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, body) = request("GET", url, Some(token), None);
        if status == 200 {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never answered: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_port_is_reached_through_any_replica_whichever_one_its_runner_asks() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup_with(dir.path(), |m| {
        m["networkPolicy"]["expose"] = json!([8000]);
        m["limits"]["timeoutMs"] = json!(120_000);
    });
    let dbs = databases(dir.path());
    let pg = dbs.iter().find(|d| !d.url.starts_with("sqlite:")).unwrap();
    let replica = |port: u16| {
        let url = format!("http://127.0.0.1:{port}");
        Serve::start_with(
            &setup,
            &pg.url,
            &format!("127.0.0.1:{port}"),
            &["--advertise-url", &url],
        )
    };
    let a = replica(free_port());
    let b = replica(free_port());
    let acme = org(&a, "acme");
    prepare_org(&a, &setup, &acme);
    // The runner asks replica B only; the agent calls replica A.
    let _runner = Runner::start(&b, &setup, &acme, "runner");
    create_run(&a, &acme, "web");
    submit_approved(&a, &acme, "web", serving_op());
    for replica in [&a, &b, &a] {
        let page = until_served(
            &format!("{}/v1/runs/web/ports/8000/input/a.txt", replica.url),
            &acme,
        );
        assert_eq!(page, "abc\n");
    }
    let (status, echoed) = websocket(&a, &acme, "web", "both ways");
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    assert_eq!(echoed, "syaw htob");
    let (status, body) = request(
        "GET",
        &format!("{}/v1/runs/web/ports/8000/quit", a.url),
        Some(&acme),
        None,
    );
    assert_eq!((status, body.as_str()), (200, "bye"));
    finish_run(&a, &acme, "web");
    let events = run_events(&a, &acme, "web");
    let served = events
        .iter()
        .filter(|e| e["type"] == "network.ingress" && e["data"]["path"] == "/input/a.txt")
        .count();
    assert_eq!(served, 3, "{events:#?}");
}

#[test]
fn an_unprivileged_runner_restores_a_volume_and_serves_its_ports() {
    let dir = tempfile::tempdir().unwrap();
    common::make_world_accessible(dir.path());
    let setup = setup_with(dir.path(), |m| {
        m["networkPolicy"]["expose"] = json!([8000]);
        m["limits"]["timeoutMs"] = json!(120_000);
        m["filesystem"]["writeRoots"]
            .as_array_mut()
            .unwrap()
            .push(json!("state"));
        m["filesystem"]["persistentRoots"] = json!(["state"]);
        // An unprivileged runner here has no cgroup of its own to give.
        m["cgroupLimits"] = json!("deployment");
    });
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let (status, body) = call(
        "POST",
        &format!("{}/v1/volumes", serve.url),
        &acme,
        Some(json!({"name": "site"})),
    );
    assert_eq!(status, 201, "{body}");
    let runner = Runner::start_as(&serve, &setup, &acme, "nobody-runner", 65534);

    // One run writes the site into the volume...
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "build", "volumes": [{"volume": "site", "path": "state"}]})),
    );
    assert_eq!(status, 201, "{body}");
    python_op(
        &serve,
        &acme,
        "build",
        "write",
        "import os\nos.makedirs('state', exist_ok=True)\nopen('state/index.html', 'w').write('built by run 1\\n')",
    );
    finish_run(&serve, &acme, "build");

    // ...a later one, on the same unprivileged runner, starts from it and
    // serves it.
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "site", "resumeFrom": "build"})),
    );
    assert_eq!(status, 201, "{body}");
    submit_approved(&serve, &acme, "site", serving_op());
    let page = until_served(
        &format!("{}/v1/runs/site/ports/8000/state/index.html", serve.url),
        &acme,
    );
    assert_eq!(page, "built by run 1\n");
    let (status, _) = request(
        "GET",
        &format!("{}/v1/runs/site/ports/8000/quit", serve.url),
        Some(&acme),
        None,
    );
    assert_eq!(status, 200);
    finish_run(&serve, &acme, "site");
    wait_run_event(&serve, &acme, "site", "run.destroyed");
    // The runner ran as that user, and left nothing of the run behind.
    let owner = {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(runner.state.join("ingress"))
            .unwrap()
            .uid()
    };
    assert_eq!(owner, 65534);
    assert!(!runner.state.join("ingress/site").exists());
    assert!(!runner.state.join("runs/site").exists());
}

#[test]
fn over_tls_a_runner_tunnels_to_the_control_plane_it_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup_with(dir.path(), |m| {
        m["networkPolicy"]["expose"] = json!([8000]);
        m["limits"]["timeoutMs"] = json!(120_000);
    });
    let (ca, cert, key) = private_ca(dir.path());
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start_with(
        &setup,
        &db,
        "127.0.0.1:0",
        &["--tls-cert", path_str(&cert), "--tls-key", path_str(&key)],
    );
    assert!(serve.url.starts_with("https://"), "{}", serve.url);
    trust_ca(&serve.url, &ca);
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let _runner = Runner::start_with(
        &serve,
        &setup,
        &acme,
        "tls-runner",
        &["--ca-file", path_str(&ca)],
    );
    create_run(&serve, &acme, "web");
    submit_approved(&serve, &acme, "web", serving_op());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(
                    ureq::tls::parse_pem(&std::fs::read(&ca).unwrap())
                        .filter_map(|item| match item {
                            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                            _ => None,
                        })
                        .collect(),
                )))
                .build(),
        )
        .build()
        .into();
    let url = format!("{}/v1/runs/web/ports/8000/input/a.txt", serve.url);
    let deadline = Instant::now() + Duration::from_secs(120);
    let page = loop {
        let mut answer = agent
            .get(&url)
            .header("authorization", &format!("Bearer {acme}"))
            .call()
            .unwrap();
        if answer.status() == 200 {
            break answer.body_mut().read_to_string().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "never served: {}",
            answer.status()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(page, "abc\n");
    let answer = agent
        .get(&format!("{}/v1/runs/web/ports/8000/quit", serve.url))
        .header("authorization", &format!("Bearer {acme}"))
        .call()
        .unwrap();
    assert_eq!(answer.status(), 200);
    finish_run(&serve, &acme, "web");
}
