//! An allowed name that does not resolve, or whose server refuses the
//! connection: the program gets `502` with `X-Moat-Denied:
//! upstream_unreachable` and a body naming the cause, for a CONNECT tunnel
//! as for plain HTTP; the record carries the same reason. Nothing leaves
//! loopback: `.invalid` names are answered by the proxy itself, and the
//! refused connection is to a closed port on 127.0.0.1.

use super::*;

/// Opens a CONNECT tunnel to `target` by hand and prints the proxy's whole
/// answer (curl shows a failed CONNECT's headers, never its body).
fn raw_connect(target: &str) -> String {
    format!(
        "python3 -c 'import socket\n\
         s = socket.create_connection((\"127.0.0.1\", 3128))\n\
         s.sendall(b\"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n\")\n\
         out = b\"\"\n\
         while True:\n\
         \x20   b = s.recv(4096)\n\
         \x20   if not b: break\n\
         \x20   out += b\n\
         print(out.decode())'"
    )
}

/// Asserts a failed `network.request` for `method` with reason
/// `upstream_unreachable` whose detail contains `cause`, and that no
/// failure was recorded as a denial.
fn assert_unreachable(run: &Run, method: &str, cause: &str) {
    let found = run.events_of("network.request").into_iter().any(|e| {
        let d = &e["data"];
        d["method"] == method
            && d["decision"] == "failed"
            && d["reason"] == "upstream_unreachable"
            && d["detail"].as_str().is_some_and(|t| t.contains(cause))
    });
    assert!(
        found,
        "no failed {method} network.request with reason upstream_unreachable and {cause:?}{}",
        dump(run)
    );
    assert!(
        run.events_of("network.denied").is_empty(),
        "a server out of reach is not a denial{}",
        dump(run)
    );
}

/// Asserts `count` answers `502` with the header and a body naming `cause`.
fn assert_answered_502(run: &Run, count: usize, cause: &str) {
    let out = lower(&run.stdout);
    assert_eq!(
        out.matches("x-moat-denied: upstream_unreachable").count(),
        count,
        "{}",
        dump(run)
    );
    assert_eq!(
        out.matches(" 502 bad gateway").count(),
        count,
        "{}",
        dump(run)
    );
    assert!(
        run.stdout.contains(&format!("moat egress: {cause}")),
        "the body does not name the cause{}",
        dump(run)
    );
}

#[test]
fn an_allowed_name_that_does_not_resolve_gets_502_with_the_reason() {
    let run = proxied(
        &["--allow-domain", "nx.invalid"],
        &format!(
            "curl -sS -i https://nx.invalid/; curl -sS -i http://nx.invalid/; {}",
            raw_connect("nx.invalid:443")
        ),
    );
    let cause = "resolving nx.invalid: names under .invalid never resolve";
    // curl's CONNECT, its plain GET, and the CONNECT by hand.
    assert_answered_502(&run, 3, cause);
    assert!(
        run.stderr.contains("CONNECT tunnel failed, response 502"),
        "{}",
        dump(&run)
    );
    assert_unreachable(&run, "CONNECT", cause);
    assert_unreachable(&run, "GET", cause);
}

#[test]
fn an_allowed_name_whose_server_refuses_the_connection_gets_502_with_the_reason() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let allow = format!("app.test:{port}");
    let target = format!("app.test:{port}");
    let run = proxied(
        &[
            "--allow-domain",
            &allow,
            "--allow-address",
            "127.0.0.1/32",
            "--resolve",
            "app.test=127.0.0.1",
        ],
        &format!(
            "curl -sS -i https://{target}/; curl -sS -i http://{target}/; {}",
            raw_connect(&target)
        ),
    );
    let cause = format!("app.test: connecting to 127.0.0.1:{port}: Connection refused");
    assert_answered_502(&run, 3, &cause);
    assert_unreachable(&run, "CONNECT", &cause);
    assert_unreachable(&run, "GET", &cause);
}
