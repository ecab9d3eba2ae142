//! DNS rebinding through the credential proxy: the tool's host is a name
//! whose first answer is a public address (the vendor) and every later one
//! is loopback (the control plane's own network, where a canary listens on
//! the same port). The control plane resolves once, checks, and dials the
//! address it checked: the vendor gets the call, the canary nothing.
//!
//! The test needs a resolver it controls and a public address that is
//! local: it runs itself again in a new network and mount namespace
//! (`unshare`), where `lo` also carries 44.0.0.1 and `/etc/resolv.conf` is a
//! bind mount naming the test's DNS server on 127.0.0.1:53. Nothing leaves
//! that namespace, and the host's files are untouched.

use std::net::{Ipv4Addr, UdpSocket};
use std::process::Command;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::*;

const INNER: &str = "MOAT_TEST_REBINDING_NAMESPACE";
const NAME: &str =
    "rebinding::a_tool_host_answering_differently_the_second_time_is_dialled_only_where_checked";
const VENDOR_ADDRESS: &str = "44.0.0.1";
const HOST: &str = "rebind.test";

/// A DNS server on 127.0.0.1:53 for one name: its A answers are `answers`
/// in turn (the last one repeated); AAAA has none; other names do not exist.
struct Dns {
    a_queries: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Dns {
    fn start(answers: Vec<Ipv4Addr>) -> Dns {
        let socket = UdpSocket::bind("127.0.0.1:53").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let a_queries = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, stopping) = (a_queries.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stopping.load(Ordering::SeqCst) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                if let Some(reply) = answer(&buf[..n], &answers, &count) {
                    let _ = socket.send_to(&reply, peer);
                }
            }
        });
        Dns { a_queries, stop }
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The reply to one query (RFC 1035 4.1), or `None` if it is not one.
fn answer(query: &[u8], answers: &[Ipv4Addr], a_queries: &AtomicUsize) -> Option<Vec<u8>> {
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question = query.get(12..at + 4)?;
    let ours = labels.join(".") == HOST;
    let address = (ours && qtype == 1).then(|| {
        let n = a_queries.fetch_add(1, Ordering::SeqCst);
        answers[n.min(answers.len() - 1)]
    });
    let mut reply = Vec::new();
    reply.extend_from_slice(&query[..2]);
    // A response, recursion desired and available; NXDOMAIN for other names.
    reply.extend_from_slice(&[0x81, if ours { 0x80 } else { 0x83 }]);
    reply.extend_from_slice(&[0, 1, 0, u8::from(address.is_some()), 0, 0, 0, 0]);
    reply.extend_from_slice(question);
    if let Some(ip) = address {
        // The question's name, type A, class IN, TTL 0, four bytes.
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        reply.extend_from_slice(&ip.octets());
    }
    Some(reply)
}

#[test]
fn a_tool_host_answering_differently_the_second_time_is_dialled_only_where_checked() {
    if std::env::var_os(INNER).is_none() {
        let dir = tempfile::tempdir().unwrap();
        let resolv = dir.path().join("resolv.conf");
        std::fs::write(
            &resolv,
            "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n",
        )
        .unwrap();
        let script = format!(
            "ip link set lo up && ip addr add {VENDOR_ADDRESS}/32 dev lo && \
             mount --bind \"$1\" /etc/resolv.conf && \
             exec \"$2\" --exact \"$3\" --nocapture --test-threads 1"
        );
        let out = Command::new("unshare")
            .args(["--net", "--mount", "--", "/bin/sh", "-c", &script, "sh"])
            .arg(&resolv)
            .arg(std::env::current_exe().unwrap())
            .arg(NAME)
            .env(INNER, "1")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "in the namespaces:\n{stdout}\n{stderr}"
        );
        return;
    }

    let dir = tempfile::tempdir().unwrap();
    let setup = setup_with(dir.path(), |m| {
        m["allowedOps"]
            .as_array_mut()
            .unwrap()
            .push(json!("http_request"));
        m["allowedTools"] = json!(["crm_lookup"]);
    });
    let secret = format!("sk-live-{}", moat_core::random::new_id(""));
    let key_file = dir.path().join("secrets.key");
    std::fs::write(&key_file, "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n").unwrap();
    let vendor = Vendor::start_at(&secret, &format!("{VENDOR_ADDRESS}:0"));
    // The control plane's own network: the same port, on loopback.
    let canary = Vendor::start_at(&secret, &format!("127.0.0.1:{}", vendor.port));
    let dns = Dns::start(vec![VENDOR_ADDRESS.parse().unwrap(), Ipv4Addr::LOCALHOST]);

    // Without --tools-allow-private-addresses: loopback is refused, and
    // only the public first answer passes the check.
    let serve = Serve::start_with(
        &setup,
        &format!("sqlite:{}", dir.path().join("rebind.db").display()),
        "127.0.0.1:0",
        &["--secrets-key", key_file.to_str().unwrap()],
    );
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    let runner = Runner::start(&serve, &setup, &acme, "tools-rebind");
    let url = &serve.url;
    let mut tool = crm_lookup(&vendor);
    tool["url"] = json!(format!("http://{HOST}:{}/accounts/{{id}}", vendor.port));
    secret_and_tool(url, &acme, &secret, tool);
    let (s, b) = call(
        "POST",
        &format!("{url}/v1/runs"),
        &acme,
        Some(json!({"id": "run-r"})),
    );
    assert_eq!(s, 201, "{b}");
    let (status, op) = post_op(
        &serve,
        &acme,
        "run-r",
        envelope(
            "look",
            "http_request",
            json!({"profile": "control-plane-tool-proxy", "tool": "crm_lookup", "params": {"id": "acct-7"}}),
        ),
    );

    assert!(
        canary.auth_seen.lock().unwrap().is_empty(),
        "the second answer was dialled: the canary got {:?}",
        canary.auth_seen.lock().unwrap()
    );
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("succeeded")),
        "{op}"
    );
    assert_eq!(
        op["result"]["result"]["body"]["account"]["name"], "Ada",
        "{op}"
    );
    assert_eq!(
        vendor.auth_seen.lock().unwrap().as_slice(),
        [format!("Bearer {secret}")],
        "the vendor got the one call"
    );
    assert_eq!(
        dns.a_queries.load(Ordering::SeqCst),
        1,
        "the name was looked up more than once"
    );
    let events = run_events(&serve, &acme, "run-r");
    assert!(
        events.iter().any(|e| e["type"] == "network.request"
            && e["opId"] == "look"
            && e["data"]["decision"] == "allowed"
            && e["data"]["address"] == VENDOR_ADDRESS
            && e["data"]["host"] == HOST
            && e["data"]["port"] == vendor.port),
        "{events:#?}"
    );
    drop(runner);
}
