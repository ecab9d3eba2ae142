//! Network confinement: in the allowlist mode the only way out of the sandbox
//! is Moat's egress proxy, which lets through allowed names only, refuses IP
//! literals, private addresses, mismatched TLS server names and anything that
//! is not the proxy protocol, enforces the run's egress budget, and records
//! every decision. Each test starts its own servers on the host's loopback
//! and checks, host side, that no request reached them when one was refused.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;
// Allowed servers out of reach: what the program and the record see.
#[path = "network/upstream.rs"]
mod upstream;
// The ingress-only mode: reached from the host, reaching nothing.
#[path = "network/ingress.rs"]
mod ingress;

use common::servers::*;
use common::*;
use serde_json::Value;

// ---------------------------------------------------------------------------
// Running and inspecting sandboxes
// ---------------------------------------------------------------------------

/// `--allow-domain ALLOW` with `app.test` resolving to the host's loopback,
/// which the proxy may dial; then `extra`.
fn app_args<'a>(allow: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--allow-domain",
        allow,
        "--allow-address",
        "127.0.0.1",
        "--resolve",
        "app.test=127.0.0.1",
    ];
    args.extend_from_slice(extra);
    args
}

/// `moat exec --network allowlist ARGS -- /bin/sh -c SCRIPT`.
fn proxied(args: &[&str], script: &str) -> Run {
    let mut all = vec!["--network", "allowlist"];
    all.extend_from_slice(args);
    exec(&all, &["/bin/sh", "-c", script])
}

/// `moat exec --network allowlist ARGS -- /usr/bin/python3 -c SCRIPT`.
fn proxied_python(args: &[&str], script: &str) -> Run {
    let mut all = vec!["--network", "allowlist"];
    all.extend_from_slice(args);
    exec(&all, &["/usr/bin/python3", "-c", script])
}

/// Everything about a run, for assertion messages.
fn dump(run: &Run) -> String {
    let events: Vec<String> = run.events.iter().map(Value::to_string).collect();
    format!(
        "\n--- exit code: {}\n--- stdout:\n{}\n--- stderr:\n{}\n--- events:\n{}\n",
        run.code,
        run.stdout,
        run.stderr,
        events.join("\n")
    )
}

/// The `network.denied` events of `reason`.
fn denials<'a>(run: &'a Run, reason: &str) -> Vec<&'a Value> {
    run.events_of("network.denied")
        .into_iter()
        .filter(|e| e["data"]["reason"] == reason)
        .collect()
}

/// Asserts a `network.denied` event of `reason` (for `host`, when given) and
/// the matching denied `network.request`; returns the denial.
fn assert_denied<'a>(run: &'a Run, reason: &str, host: Option<&str>) -> &'a Value {
    let found = denials(run, reason)
        .into_iter()
        .find(|e| host.is_none_or(|h| e["data"]["host"] == h));
    let Some(denial) = found else {
        panic!(
            "no network.denied event with reason {reason} (host {host:?}){}",
            dump(run)
        );
    };
    assert!(
        denial["data"]["detail"].is_string(),
        "the denial has no detail{}",
        dump(run)
    );
    denial
}

/// Asserts the program got `status` with `X-Moat-Denied: reason` (curl -i output).
fn assert_answered(run: &Run, status: &str, reason: &str) {
    let out = lower(&run.stdout);
    assert!(out.contains(status), "{}", dump(run));
    assert!(
        out.contains(&format!("x-moat-denied: {reason}")),
        "{}",
        dump(run)
    );
}

/// A refusal by the proxy: `network.denied` (returned) and a refused `network.request`.
fn assert_refused<'a>(run: &'a Run, reason: &str, host: Option<&str>) -> &'a Value {
    assert_request_denied(run, reason);
    assert_denied(run, reason, host)
}

/// Asserts the proxy recorded a refused `network.request` with `reason`.
fn assert_request_denied(run: &Run, reason: &str) {
    let found = run
        .events_of("network.request")
        .iter()
        .any(|e| e["data"]["decision"] == "denied" && e["data"]["reason"] == reason);
    assert!(
        found,
        "no denied network.request with reason {reason}{}",
        dump(run)
    );
}

/// The allowed `network.request` events for `host` with `method`.
fn allowed_requests<'a>(run: &'a Run, host: &str, method: &str) -> Vec<&'a Value> {
    run.events_of("network.request")
        .into_iter()
        .filter(|e| {
            e["data"]["decision"] == "allowed"
                && e["data"]["host"] == host
                && e["data"]["method"] == method
        })
        .collect()
}

fn lower(text: &str) -> String {
    text.to_ascii_lowercase()
}

fn assert_no_request(server: &Server, run: &Run) {
    assert_eq!(
        server.count(),
        0,
        "a refused request reached the host's server: {:?}{}",
        server.seen(),
        dump(run)
    );
}

// ---------------------------------------------------------------------------
// Allowed traffic
// ---------------------------------------------------------------------------

#[test]
fn an_allowed_domain_is_reached_over_http_through_the_proxy() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let run = proxied(
        &app_args(&allow, &[]),
        &format!("curl -sS -i http://app.test:{port}/"),
    );
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert!(run.stdout.contains(HTTP_BODY), "{}", dump(&run));
    assert!(run.stdout.starts_with("HTTP/1.1 200"), "{}", dump(&run));
    assert_eq!(server.count(), 1, "{}", dump(&run));
    let seen = server.seen();
    assert_eq!(seen[0].line, "GET / HTTP/1.1", "{seen:?}");
    assert_eq!(seen[0].host, format!("app.test:{port}"), "{seen:?}");

    let requests = allowed_requests(&run, "app.test", "GET");
    assert_eq!(requests.len(), 1, "{}", dump(&run));
    // The proxy's record comes before the run's end, in the run's own order.
    let position = |t: &str| run.events.iter().position(|e| e["type"] == t);
    assert!(
        position("network.request") < position("sandbox.exec.finished"),
        "{}",
        dump(&run)
    );
    let data = &requests[0]["data"];
    assert_eq!(data["port"], port, "{}", dump(&run));
    assert_eq!(data["status"], 200, "{}", dump(&run));
    assert_eq!(data["address"], "127.0.0.1", "{}", dump(&run));
    assert!(data["bytesIn"].as_u64().unwrap_or(0) > 0, "{}", dump(&run));
    assert!(data["bytesOut"].as_u64().unwrap_or(0) > 0, "{}", dump(&run));
    assert!(run.events_of("network.denied").is_empty(), "{}", dump(&run));
    // Events describe requests, never their headers or bodies.
    let events = serde_json::to_string(&run.events).unwrap();
    assert!(!events.contains("secret=1"), "{}", dump(&run));
    assert!(!events.contains("hello from host"), "{}", dump(&run));
}

/// A host server that answers each request with the body it was sent.
fn echo_server() -> (u16, std::thread::JoinHandle<Vec<u8>>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        // Head, then exactly Content-Length bytes of body.
        let (head_end, length) = loop {
            let n = stream.read(&mut chunk).unwrap_or(0);
            if n == 0 {
                return Vec::new();
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                break (end + 4, length);
            }
        };
        while buf.len() < head_end + length {
            let n = stream.read(&mut chunk).unwrap_or(0);
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let body = buf[head_end..].to_vec();
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes());
        let _ = stream.write_all(&body);
        body
    });
    (port, handle)
}

#[test]
fn a_request_body_goes_through_the_proxy_whole() {
    // The body arrives with the head in one segment: the proxy must pass
    // on what it read past the head, not just the head.
    let (port, server) = echo_server();
    let allow = format!("app.test:{port}");
    let run = proxied(
        &app_args(&allow, &[]),
        &format!("curl -sS -m 10 -d 'a body sent with its head' http://app.test:{port}/"),
    );
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert_eq!(run.stdout, "a body sent with its head", "{}", dump(&run));
    assert_eq!(server.join().unwrap(), b"a body sent with its head");
    assert_eq!(
        allowed_requests(&run, "app.test", "POST").len(),
        1,
        "{}",
        dump(&run)
    );
}

#[test]
fn an_allowed_domain_is_reached_over_https_through_a_connect_tunnel() {
    let pki = Pki::new();
    let server = Server::tls(pki.config.clone());
    let port = server.port;
    let allow = format!("app.test:{port}");
    let run = proxied(
        &[
            "--input",
            pki.input(),
            "--allow-domain",
            &allow,
            "--allow-address",
            "127.0.0.1",
            "--resolve",
            "app.test=127.0.0.1",
        ],
        &format!("curl -sS --cacert /workspace/input/ca.pem https://app.test:{port}/"),
    );
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert_eq!(run.stdout, TLS_BODY, "{}", dump(&run));
    assert_eq!(server.count(), 1, "{}", dump(&run));
    let seen = server.seen();
    assert_eq!(seen[0].line, "GET / HTTP/1.1", "{seen:?}");

    let requests = allowed_requests(&run, "app.test", "CONNECT");
    assert_eq!(requests.len(), 1, "{}", dump(&run));
    let data = &requests[0]["data"];
    assert_eq!(data["port"], port, "{}", dump(&run));
    assert_eq!(data["address"], "127.0.0.1", "{}", dump(&run));
    assert!(data["bytesIn"].as_u64().unwrap_or(0) > 0, "{}", dump(&run));
    assert!(data["bytesOut"].as_u64().unwrap_or(0) > 0, "{}", dump(&run));
    assert!(data["cut"].is_null(), "{}", dump(&run));
    assert!(run.events_of("network.denied").is_empty(), "{}", dump(&run));
}

// ---------------------------------------------------------------------------
// Refused names, addresses and protocols
// ---------------------------------------------------------------------------

#[test]
fn a_domain_outside_the_allowlist_is_refused_before_any_connection() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let run = proxied(
        &app_args(&allow, &["--resolve", "other.test=127.0.0.1"]),
        &format!("curl -sS -i http://other.test:{port}/"),
    );
    assert_answered(&run, "403", "domain_not_allowed");
    assert!(!run.stdout.contains(HTTP_BODY), "{}", dump(&run));
    let denial = assert_refused(&run, "domain_not_allowed", Some("other.test"));
    assert_eq!(denial["data"]["port"], port, "{}", dump(&run));
    assert_eq!(denial["data"]["method"], "GET", "{}", dump(&run));
    assert_no_request(&server, &run);
}

#[test]
fn a_deny_rule_wins_over_a_wildcard_allow_rule() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("*.app.test:{port}");
    let run = proxied(
        &[
            "--allow-domain",
            &allow,
            "--deny-domain",
            "bad.app.test",
            "--allow-address",
            "127.0.0.1",
            "--resolve",
            "good.app.test=127.0.0.1",
            "--resolve",
            "bad.app.test=127.0.0.1",
        ],
        &format!(
            "curl -sS http://good.app.test:{port}/; echo; curl -sS -i http://bad.app.test:{port}/"
        ),
    );
    // The wildcard lets the sibling through: the refusal is the deny rule's.
    assert!(run.stdout.contains(HTTP_BODY), "{}", dump(&run));
    assert_eq!(server.count(), 1, "{}", dump(&run));
    assert_eq!(
        server.seen()[0].host,
        format!("good.app.test:{port}"),
        "{}",
        dump(&run)
    );
    assert_answered(&run, "403", "domain_not_allowed");
    assert_refused(&run, "domain_not_allowed", Some("bad.app.test"));
    assert_eq!(
        allowed_requests(&run, "good.app.test", "GET").len(),
        1,
        "{}",
        dump(&run)
    );
}

#[test]
fn an_allowed_name_on_another_port_or_with_a_forged_host_is_refused() {
    let server = Server::http();
    let other = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let run = proxied(
        &app_args(&allow, &[]),
        &format!(
            "curl -sS -i http://app.test:{}/; echo; \
             curl -sS -i -H 'Host: other.test:{port}' http://app.test:{port}/",
            other.port
        ),
    );
    assert_answered(&run, "403", "port_not_allowed");
    assert_answered(&run, "403", "host_mismatch");
    assert_refused(&run, "port_not_allowed", Some("app.test"));
    assert_refused(&run, "host_mismatch", None);
    assert_no_request(&server, &run);
    assert_no_request(&other, &run);
}

#[test]
fn an_ip_literal_is_refused_by_the_proxy() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let run = proxied(
        &["--allow-domain", &allow, "--allow-address", "127.0.0.1"],
        &format!("curl -sS -i --proxy http://127.0.0.1:3128 --noproxy '' http://127.0.0.1:{port}/"),
    );
    assert_answered(&run, "403", "ip_literal_not_allowed");
    let denial = assert_refused(&run, "ip_literal_not_allowed", Some("127.0.0.1"));
    assert_eq!(denial["data"]["port"], port, "{}", dump(&run));
    assert_no_request(&server, &run);
}

#[test]
fn an_allowed_name_resolving_to_a_private_address_is_never_dialled() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let url = format!("http://app.test:{port}/");
    for (resolve, extra) in [
        // Loopback without --allow-address.
        ("app.test=127.0.0.1", None),
        // A private address, whatever else is allowed.
        ("app.test=10.0.0.1", Some("127.0.0.1")),
        // One answer allowed, another not: the name is refused as a whole.
        ("app.test=127.0.0.1,10.0.0.1", Some("127.0.0.1")),
    ] {
        let mut args = vec!["--allow-domain", &allow, "--resolve", resolve];
        if let Some(cidr) = extra {
            args.extend(["--allow-address", cidr]);
        }
        let run = proxied(&args, &format!("curl -sS -i {url}"));
        assert_answered(&run, "403", "address_not_allowed");
        assert_refused(&run, "address_not_allowed", Some("app.test"));
        assert!(
            allowed_requests(&run, "app.test", "GET").is_empty(),
            "{resolve}: {}",
            dump(&run)
        );
        assert_no_request(&server, &run);
    }
}

#[test]
fn a_tls_server_name_differing_from_the_connect_host_cuts_the_tunnel() {
    let pki = Pki::new();
    let server = Server::tls(pki.config.clone());
    let port = server.port;
    let allow = format!("app.test:{port}");
    let script = format!(
        r#"
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT app.test:{port} HTTP/1.1\r\nHost: app.test:{port}\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(1)
    if not chunk:
        break
    head += chunk
print("PROXY", head.split(b"\r\n")[0].decode())
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:
    t = ctx.wrap_socket(s, server_hostname="evil.test")
    t.sendall(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
    print("RECEIVED", t.recv(4096))
except (ssl.SSLError, OSError) as e:
    print("HANDSHAKE-FAILED", type(e).__name__)
"#
    );
    let run = proxied_python(&app_args(&allow, &[]), &script);
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert!(run.stdout.contains("PROXY HTTP/1.1 200"), "{}", dump(&run));
    assert!(run.stdout.contains("HANDSHAKE-FAILED"), "{}", dump(&run));
    assert!(!run.stdout.contains("RECEIVED"), "{}", dump(&run));
    assert!(!run.stdout.contains("hello over tls"), "{}", dump(&run));
    let denial = assert_denied(&run, "sni_mismatch", Some("app.test"));
    assert_eq!(denial["data"]["method"], "CONNECT", "{}", dump(&run));
    let cut = run
        .events_of("network.request")
        .iter()
        .any(|e| e["data"]["method"] == "CONNECT" && e["data"]["cut"] == "sni_mismatch");
    assert!(cut, "no network.request cut for sni_mismatch{}", dump(&run));
    assert_no_request(&server, &run);
}

#[test]
fn a_program_ignoring_the_proxy_cannot_connect_directly() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let args = [
        "--allow-domain",
        &allow,
        "--allow-address",
        "127.0.0.1",
        "--resolve",
        "app.test=127.0.0.1",
    ];
    let address = format!("127.0.0.1:{port}");

    let run = proxied(
        &args,
        &format!("curl -sS --noproxy '*' http://127.0.0.1:{port}/"),
    );
    assert_ne!(run.code, 0, "{}", dump(&run));
    assert!(!run.stdout.contains(HTTP_BODY), "{}", dump(&run));
    let found = denials(&run, "direct_connection")
        .iter()
        .any(|e| e["data"]["address"] == address.as_str());
    assert!(
        found,
        "no direct_connection denial for {address}{}",
        dump(&run)
    );
    assert_no_request(&server, &run);

    let script = format!(
        r#"
import errno, socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.connect(("127.0.0.1", {port}))
    print("CONNECTED")
except OSError as e:
    print("CONNECT-FAILED", errno.errorcode.get(e.errno, e.errno))
"#
    );
    let run = proxied_python(&args, &script);
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert!(
        run.stdout.contains("CONNECT-FAILED EACCES"),
        "{}",
        dump(&run)
    );
    let found = denials(&run, "direct_connection")
        .iter()
        .any(|e| e["data"]["address"] == address.as_str());
    assert!(
        found,
        "no direct_connection denial for {address}{}",
        dump(&run)
    );
    assert_no_request(&server, &run);
}

#[test]
fn udp_sockets_and_dns_to_the_outside_are_refused() {
    let script = r#"
import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    print("UDP-OPEN")
except PermissionError as e:
    print("UDP-REFUSED", e.errno)
try:
    print("DNS-RESOLVED", socket.getaddrinfo("example.com", 80))
except OSError as e:
    print("DNS-FAILED", e)
"#;
    let run = proxied_python(&["--allow-domain", "example.com"], script);
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert!(run.stdout.contains("UDP-REFUSED 1"), "{}", dump(&run));
    assert!(!run.stdout.contains("UDP-OPEN"), "{}", dump(&run));
    assert!(run.stdout.contains("DNS-FAILED"), "{}", dump(&run));
    assert!(!run.stdout.contains("DNS-RESOLVED"), "{}", dump(&run));
    run.assert_syscall_denied_event("socket");
    // Nothing went through the proxy either.
    assert!(
        run.events_of("network.request").is_empty(),
        "{}",
        dump(&run)
    );
}

#[test]
fn the_proxy_port_speaks_only_the_proxy_protocol() {
    let run = proxied(
        &["--allow-domain", "example.com"],
        "curl -sS -i --noproxy '*' http://127.0.0.1:3128/",
    );
    let out = lower(&run.stdout);
    assert!(out.starts_with("http/1.1 400"), "{}", dump(&run));
    assert!(
        out.contains("x-moat-denied: not_a_proxy_request"),
        "{}",
        dump(&run)
    );
    assert_refused(&run, "not_a_proxy_request", None);

    let script = r#"
import socket
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
answer = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    answer += chunk
print("ANSWER", answer.split(b"\r\n")[0].decode() if answer else "CLOSED")
"#;
    let run = proxied_python(&["--allow-domain", "example.com"], script);
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert!(
        run.stdout.contains("ANSWER HTTP/1.1 400") || run.stdout.contains("ANSWER CLOSED"),
        "{}",
        dump(&run)
    );
    assert_denied(&run, "not_a_proxy_request", None);
}

// ---------------------------------------------------------------------------
// Egress budget
// ---------------------------------------------------------------------------

#[test]
fn the_request_limit_refuses_the_request_past_it() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let url = format!("http://app.test:{port}/");
    let run = proxied(
        &app_args(&allow, &["--egress-max-requests", "2"]),
        &format!(
            "curl -s -o /dev/null -o /dev/null -o /dev/null -w '%{{http_code}}\\n' {url} {url} {url}"
        ),
    );
    assert_eq!(run.stdout, "200\n200\n403\n", "{}", dump(&run));
    assert_refused(&run, "egress_limit", Some("app.test"));
    assert_eq!(
        allowed_requests(&run, "app.test", "GET").len(),
        2,
        "{}",
        dump(&run)
    );
    assert_eq!(server.count(), 2, "{:?}{}", server.seen(), dump(&run));
}

#[test]
fn the_byte_limit_cuts_a_large_response() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let run = proxied(
        &app_args(&allow, &["--egress-max-bytes", "2K"]),
        &format!(
            "curl -sS -o /tmp/big http://app.test:{port}/big; echo \"exit=$?\"; \
             echo \"size=$(wc -c < /tmp/big)\""
        ),
    );
    let exit = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("exit="))
        .and_then(|v| v.trim().parse::<i32>().ok());
    let size = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("size="))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    assert!(exit.is_some(), "{}", dump(&run));
    assert!(
        exit != Some(0) || size < BIG_LEN,
        "the whole body came through: {}",
        dump(&run)
    );
    assert!(size < BIG_LEN, "{}", dump(&run));
    assert!(server.count() <= 1, "{:?}{}", server.seen(), dump(&run));
    assert_denied(&run, "egress_limit", Some("app.test"));
    // The request did go out: it is recorded as allowed, with what moved and the cut.
    let cut = run
        .events_of("network.request")
        .into_iter()
        .find(|e| e["data"]["cut"] == "egress_limit")
        .cloned();
    let cut = cut.unwrap_or_else(|| panic!("no cut request recorded: {}", dump(&run)));
    assert_eq!(cut["data"]["decision"], "allowed", "{cut}");
    assert!(cut["data"]["bytesOut"].as_u64().unwrap_or(0) > 0, "{cut}");
    // What the proxy let through stays within the budget.
    for request in run.events_of("network.request") {
        let data = &request["data"];
        let total = data["bytesIn"].as_u64().unwrap_or(0) + data["bytesOut"].as_u64().unwrap_or(0);
        assert!(total <= 2048, "{request}{}", dump(&run));
    }
}

#[test]
fn the_connection_limit_refuses_a_second_open_tunnel() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let script = format!(
        r#"
import socket, time
def tunnel():
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"CONNECT app.test:{port} HTTP/1.1\r\nHost: app.test:{port}\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    return s, head.decode(errors="replace")
first, a = tunnel()
print("FIRST", a.split("\r\n")[0])
second, b = tunnel()
print("SECOND", b.split("\r\n")[0])
for line in b.split("\r\n"):
    print("HEADER", line.lower())
second.close()
first.close()
# Closing the first tunnel frees its slot (the proxy notices asynchronously).
for _ in range(100):
    third, c = tunnel()
    third.close()
    if " 200 " in c.split("\r\n")[0]:
        break
    time.sleep(0.02)
print("THIRD", c.split("\r\n")[0])
"#
    );
    let run = proxied_python(
        &app_args(&allow, &["--egress-max-connections", "1"]),
        &script,
    );
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert!(run.stdout.contains("FIRST HTTP/1.1 200"), "{}", dump(&run));
    assert!(run.stdout.contains("SECOND HTTP/1.1 403"), "{}", dump(&run));
    assert!(
        run.stdout.contains("HEADER x-moat-denied: egress_limit"),
        "{}",
        dump(&run)
    );
    assert!(run.stdout.contains("THIRD HTTP/1.1 200"), "{}", dump(&run));
    assert_refused(&run, "egress_limit", Some("app.test"));
    // The tunnels carried no request.
    assert_no_request(&server, &run);
}

// ---------------------------------------------------------------------------
// Other modes and rules refused at load
// ---------------------------------------------------------------------------

#[test]
fn network_full_warns_and_emits_its_event() {
    let run = exec(&["--network", "full"], &["/bin/true"]);
    assert_eq!(run.code, 0, "{}", dump(&run));
    let warning = run
        .stderr
        .lines()
        .any(|l| l.contains("WARNING") && l.contains("--network full"));
    assert!(warning, "{}", dump(&run));
    let found = run
        .events_of("sandbox.danger_full_access")
        .iter()
        .any(|e| e["data"]["network"] == "full");
    assert!(found, "{}", dump(&run));
}

#[test]
fn match_all_and_public_suffix_rules_are_rejected_at_load() {
    for rule in ["*", "*.com"] {
        let run = exec(
            &["--network", "allowlist", "--allow-domain", rule],
            &["/bin/echo", "moat-should-not-run"],
        );
        assert_eq!(run.code, 2, "{rule}: {}", dump(&run));
        assert!(
            run.stderr.contains(&format!("\"{rule}\"")),
            "the message does not name {rule}: {}",
            dump(&run)
        );
        assert!(!run.stderr.contains("panicked"), "{}", dump(&run));
        assert!(
            !run.stdout.contains("moat-should-not-run"),
            "{}",
            dump(&run)
        );
        assert!(
            run.events_of("sandbox.exec.started").is_empty(),
            "{rule}: {}",
            dump(&run)
        );
    }
}

#[test]
fn an_unprivileged_user_gets_the_same_boundary() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let args = [
        "--allow-degraded",
        "--network",
        "allowlist",
        "--allow-domain",
        &allow,
        "--allow-address",
        "127.0.0.1",
        "--resolve",
        "app.test=127.0.0.1",
    ];
    let script = format!(
        "curl -sS http://app.test:{port}/; curl -sS --noproxy '*' http://127.0.0.1:{port}/ \
         || echo direct-refused"
    );
    let run = exec_as(MOAT, &args, &["/bin/sh", "-c", &script], Some(65534));
    assert!(run.stdout.contains(HTTP_BODY), "{}", dump(&run));
    assert!(run.stdout.contains("direct-refused"), "{}", dump(&run));
    assert_eq!(
        run.report["enforcement"]["hostUid"],
        65534,
        "{}",
        dump(&run)
    );
    assert_eq!(run.layer("landlock"), "enforced", "{}", dump(&run));
    assert_eq!(
        allowed_requests(&run, "app.test", "GET").len(),
        1,
        "{}",
        dump(&run)
    );
    let direct = denials(&run, "direct_connection");
    assert_eq!(direct.len(), 1, "{}", dump(&run));
    assert_eq!(direct[0]["data"]["address"], format!("127.0.0.1:{port}"));
    assert_eq!(server.count(), 1, "{}", dump(&run));
}

#[test]
fn refused_requests_count_against_the_request_budget() {
    let server = Server::http();
    let port = server.port;
    let allow = format!("app.test:{port}");
    let run = proxied(
        &app_args(&allow, &["--egress-max-requests", "2"]),
        &format!(
            "for i in 1 2; do curl -s -o /dev/null --noproxy '*' http://127.0.0.1:3128/; done; \
             curl -s -i http://app.test:{port}/"
        ),
    );
    assert_answered(&run, "403", "egress_limit");
    assert_eq!(
        denials(&run, "not_a_proxy_request").len(),
        2,
        "{}",
        dump(&run)
    );
    assert_denied(&run, "egress_limit", Some("app.test"));
    assert_no_request(&server, &run);
}
