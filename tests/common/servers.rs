#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Host-side test servers: plain HTTP and HTTPS on 127.0.0.1, counting the
//! requests that reach them, and a test-made CA.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{make_world_accessible, path_str};

pub const HTTP_BODY: &str = "hello from host\n";
pub const TLS_BODY: &str = "hello over tls\n";
pub const BIG_LEN: usize = 100_000;

/// One request a server answered: its request line and Host header.
#[derive(Debug, Clone)]
pub struct Seen {
    pub line: String,
    pub host: String,
}

pub enum Kind {
    Http,
    Tls(Arc<rustls::ServerConfig>),
}

/// A server on the host's 127.0.0.1: counts the requests that reached it.
/// Stopped (and its threads joined) on drop.
pub struct Server {
    pub port: u16,
    requests: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    pub fn http() -> Self {
        Self::start(Kind::Http)
    }

    pub fn tls(config: Arc<rustls::ServerConfig>) -> Self {
        Self::start(Kind::Tls(config))
    }

    pub fn start(kind: Kind) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a test server");
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let kind = Arc::new(kind);
        let accept = {
            let (requests, seen, stop) = (requests.clone(), seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut workers: Vec<JoinHandle<()>> = Vec::new();
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (kind, requests, seen) = (kind.clone(), requests.clone(), seen.clone());
                    workers.push(std::thread::spawn(move || {
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                        let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
                        match &*kind {
                            Kind::Http => serve_http(stream, &requests, &seen),
                            Kind::Tls(config) => serve_tls(stream, config, &requests, &seen),
                        }
                    }));
                }
                for worker in workers {
                    let _ = worker.join();
                }
            })
        };
        Server {
            port,
            requests,
            seen,
            stop,
            accept: Some(accept),
        }
    }

    pub fn count(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Unblocks accept(); the loop sees the flag and ends.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Reads a request head (up to the blank line); `None` if the peer closed,
/// timed out or sent garbage first.
pub fn read_head(reader: &mut impl Read) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    loop {
        let n = reader.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(String::from_utf8_lossy(&buf[..end]).into_owned());
        }
        if buf.len() > 64 << 10 {
            return None;
        }
    }
}

/// Counts and remembers one request head.
pub fn record(head: &str, requests: &AtomicUsize, seen: &Mutex<Vec<Seen>>) -> String {
    let line = head.lines().next().unwrap_or_default().to_owned();
    let host = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("host"))
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default();
    requests.fetch_add(1, Ordering::SeqCst);
    seen.lock().unwrap().push(Seen {
        line: line.clone(),
        host,
    });
    line.split(' ').nth(1).unwrap_or("/").to_owned()
}

pub fn response(body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nSet-Cookie: secret=1\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

pub fn serve_http(mut stream: TcpStream, requests: &AtomicUsize, seen: &Mutex<Vec<Seen>>) {
    let Some(head) = read_head(&mut stream) else {
        return;
    };
    let path = record(&head, requests, seen);
    let body = if path == "/big" {
        vec![b'x'; BIG_LEN]
    } else {
        HTTP_BODY.as_bytes().to_vec()
    };
    let _ = stream.write_all(&response(&body));
    let _ = stream.flush();
    let _ = stream.shutdown(Shutdown::Write);
    // Let the peer read everything before the socket is closed.
    let mut rest = [0u8; 1024];
    while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
}

pub fn serve_tls(
    stream: TcpStream,
    config: &Arc<rustls::ServerConfig>,
    requests: &AtomicUsize,
    seen: &Mutex<Vec<Seen>>,
) {
    let Ok(connection) = rustls::ServerConnection::new(config.clone()) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(connection, stream);
    // The first read drives the handshake; a failed handshake is no request.
    let Some(head) = read_head(&mut tls) else {
        return;
    };
    record(&head, requests, seen);
    let _ = tls.write_all(&response(TLS_BODY.as_bytes()));
    tls.conn.send_close_notify();
    let _ = tls.flush();
    let _ = tls.sock.shutdown(Shutdown::Write);
    let mut rest = [0u8; 1024];
    while matches!(tls.sock.read(&mut rest), Ok(n) if n > 0) {}
}

/// A CA made for this test, a certificate for `app.test` signed by it, and
/// the CA's PEM in a world-readable directory to mount with `--input`.
pub struct Pki {
    pub config: Arc<rustls::ServerConfig>,
    input: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Moat network test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::CrlSign,
        ];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let mut leaf_params = CertificateParams::new(vec!["app.test".to_owned()]).unwrap();
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "app.test");
        leaf_params.use_authority_key_identifier_extension = true;
        leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
            )
            .unwrap();

        let input = tempfile::tempdir().unwrap();
        make_world_accessible(input.path());
        let ca_pem = input.path().join("ca.pem");
        std::fs::write(&ca_pem, ca_cert.pem()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ca_pem, std::fs::Permissions::from_mode(0o644)).unwrap();
        Pki {
            config: Arc::new(config),
            input,
        }
    }

    pub fn input(&self) -> &str {
        path_str(self.input.path())
    }
}

/// A site on loopback for the browser: `/page` is an HTML page, `/form`
/// a form that posts to `/submit`, `/login` a form that sends its fields
/// in the URL to `/welcome`, which shows them (as a careless site would),
/// `/cookie` sets a cookie, `/file` is a download; every request it got.
pub struct Site {
    pub port: u16,
    pub seen: std::sync::Arc<std::sync::Mutex<Vec<SiteRequest>>>,
}

/// A request the site got.
#[derive(Debug, Clone)]
pub struct SiteRequest {
    pub host: String,
    pub line: String,
    pub cookie: String,
    pub body: String,
}

const PAGE: &str = "<html><head><title>Moat test page</title></head>\
<body><h1>A page</h1><p id=\"greeting\">hello, browser</p>\
<p><a id=\"to-form\" href=\"/form\">the form</a></p>\
<div style=\"position: relative\"><button id=\"under\">Hidden</button>\
<div id=\"veil\" style=\"position: absolute; inset: 0\"></div></div>\
<div id=\"card\" style=\"width: 200px\"><button id=\"inner\" style=\"width: 100%\">Buy</button></div>\
</body></html>";

const FORM: &str = "<html><head><title>A form</title></head><body>\
<form method=\"post\" action=\"/submit\"><input id=\"q\" name=\"q\">\
<select id=\"size\" name=\"size\"><option value=\"s\">Small</option>\
<option value=\"l\">Large</option></select>\
<button id=\"go\" type=\"submit\">Send</button></form>\
<button id=\"wipe\" type=\"button\">Delete everything</button></body></html>";

const LOGIN: &str = "<html><head><title>Sign in</title>\
<script>console.log('login page ready')</script></head><body>\
<form method=\"get\" action=\"/welcome\"><input id=\"user\" name=\"user\">\
<input id=\"pw\" name=\"pw\" type=\"text\">\
<button id=\"in\" type=\"submit\">Sign in</button></form></body></html>";

/// A page whose script rewrites the DOM's prototypes so that its submit
/// button would describe itself as a harmless link, sit elsewhere, and
/// report nothing covering it.
const TRICKY: &str = "<html><head><title>Tricky</title><script>\
Object.defineProperty(Element.prototype, 'tagName', {get() { return 'A'; }});\
Element.prototype.getAttribute = function () { return null; };\
Object.defineProperty(HTMLButtonElement.prototype, 'form', {get() { return null; }});\
Element.prototype.closest = function () { return null; };\
Element.prototype.getBoundingClientRect = function () { return {left: 0, top: 0, width: 1, height: 1}; };\
</script></head><body><form method=\"post\" action=\"/submit\">\
<input name=\"q\" value=\"tricked\"><button id=\"sneaky\" type=\"submit\">Delete</button></form>\
</body></html>";

/// A form field as sent (`+` for a space, `%XX`), decoded.
fn form_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Site {
    pub fn start() -> Site {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            for mut stream in listener.incoming().map_while(Result::ok) {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let field = |name: &str| {
                    head.lines()
                        .find_map(|l| {
                            let (key, value) = l.split_once(':')?;
                            key.eq_ignore_ascii_case(name)
                                .then(|| value.trim().to_owned())
                        })
                        .unwrap_or_default()
                };
                let length: usize = field("content-length").parse().unwrap_or(0);
                let mut body = vec![0u8; length];
                let _ = stream.read_exact(&mut body);
                let line = head.lines().next().unwrap_or_default().to_owned();
                record.lock().unwrap().push(SiteRequest {
                    host: field("host"),
                    line: line.clone(),
                    cookie: field("cookie"),
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                let path = line.split(' ').nth(1).unwrap_or_default();
                let (extra, page) = match path {
                    "/page" => ("", PAGE.to_owned()),
                    "/form" => ("", FORM.to_owned()),
                    "/login" => ("", LOGIN.to_owned()),
                    "/tricky" => ("", TRICKY.to_owned()),
                    p if p.starts_with("/welcome?") => (
                        "",
                        format!(
                            "<html><head><title>Welcome</title></head><body>\
                             <p id=\"echo\">you sent {}</p></body></html>",
                            form_decoded(&p["/welcome?".len()..])
                        ),
                    ),
                    "/submit" => (
                        "",
                        "<html><head><title>Sent</title></head><body>thanks</body></html>"
                            .to_owned(),
                    ),
                    "/file" => (
                        "Content-Disposition: attachment; filename=\"report.txt\"\r\n",
                        "a file to download".to_owned(),
                    ),
                    "/cookie" => (
                        "Set-Cookie: seen=yes; Path=/\r\n",
                        "<p>cookie set</p>".to_owned(),
                    ),
                    _ => ("", "<p>other</p>".to_owned()),
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n{extra}\
                     Connection: close\r\n\r\n{page}",
                    page.len()
                );
            }
        });
        Site { port, seen }
    }

    pub fn hosts(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.host.clone())
            .collect()
    }
}
