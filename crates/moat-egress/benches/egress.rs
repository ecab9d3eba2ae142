#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The egress proxy against a direct loopback connection, same run, same
//! machine: tunnel throughput, added latency per forwarded HTTP request, and
//! the proxy's memory with 1,000 idle tunnels (printed, from /proc).
//!
//!   cargo bench -p moat-egress --bench egress

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::thread;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use moat_egress::{Egress, EgressConfig, EgressLimits, EgressPolicy};

const PAYLOAD: usize = 32 << 20;

/// Reads each connection to its end, then closes it.
fn sink() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            thread::spawn(move || {
                let mut stream = stream;
                let mut buf = vec![0u8; 256 << 10];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

/// Answers every request on a connection with a small 200, until it closes.
fn http_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let mut stream = stream;
                let mut buf = vec![0u8; 8192];
                let mut head = Vec::new();
                loop {
                    let n = match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    head.extend_from_slice(&buf[..n]);
                    while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        head.drain(..end + 4);
                        let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if stream.write_all(reply).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// A TLS ClientHello naming `host`, as the proxy expects before it opens a tunnel.
fn client_hello(host: &str) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend([7u8; 32]);
    body.push(0);
    body.extend([0, 2, 0x13, 0x01, 1, 0]);
    let mut entry = vec![0u8];
    entry.extend((host.len() as u16).to_be_bytes());
    entry.extend(host.as_bytes());
    let mut list = (entry.len() as u16).to_be_bytes().to_vec();
    list.extend(entry);
    let mut ext = vec![0u8, 0];
    ext.extend((list.len() as u16).to_be_bytes());
    ext.extend(list);
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut message = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
    message.extend(body);
    let mut out = vec![0x16, 3, 1];
    out.extend((message.len() as u16).to_be_bytes());
    out.extend(message);
    out
}

/// Opens a CONNECT tunnel through the proxy at `proxy` to `host:port`.
fn tunnel(proxy: SocketAddr, host: &str, port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).unwrap();
    write!(
        stream,
        "CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
    )
    .unwrap();
    let mut answer = [0u8; 39];
    stream.read_exact(&mut answer).unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    stream.write_all(&client_hello(host)).unwrap();
    stream
}

fn send_all(mut stream: TcpStream, chunk: &[u8]) {
    let mut sent = 0;
    while sent < PAYLOAD {
        stream.write_all(chunk).unwrap();
        sent += chunk.len();
    }
    stream.shutdown(Shutdown::Write).unwrap();
    let mut rest = [0u8; 64];
    while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
}

fn get(stream: &mut TcpStream, request: &[u8]) {
    stream.write_all(request).unwrap();
    let mut buf = [0u8; 256];
    let mut got = Vec::new();
    while !got.ends_with(b"ok") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
}

fn proxy_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn bench(c: &mut Criterion) {
    // 1,000 tunnels are 4,000 sockets between us and the proxy.
    let (_, hard) = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .map_or((0, 65536), |m| (0, m));
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(hard.min(65536)),
            maximum: Some(hard),
        },
    );
    // The proxy is forked before any thread exists, as it must be.
    let mut egress = start(EgressConfig {
        run_id: "bench".into(),
        limits: EgressLimits {
            max_requests: u64::MAX,
            max_bytes: u64::MAX,
            max_connections: 10_000,
        },
        hosts: [("sink.test".to_owned(), vec!["127.0.0.1".parse().unwrap()])].into(),
        extra_roots_pem: None,
        allow_degraded: false,
    })
    .unwrap();
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = front.local_addr().unwrap();
    let sink = sink();
    let http = http_server();
    let policy = EgressPolicy {
        allow: vec![
            format!("sink.test:{}", sink.port()),
            format!("sink.test:{}", http.port()),
        ],
        deny: vec![],
        allow_addresses: vec!["127.0.0.1".into()],
    };
    egress.serve(OwnedFd::from(front), &policy, None).unwrap();
    let chunk = vec![0x5au8; 256 << 10];

    // First, on a fresh proxy: what 1,000 idle tunnels (handshake done) cost.
    let before = proxy_rss_kib(egress.pid());
    let idle: Vec<TcpStream> = (0..1000)
        .map(|_| tunnel(proxy, "sink.test", sink.port()))
        .collect();
    thread::sleep(Duration::from_millis(500));
    let with_idle = proxy_rss_kib(egress.pid());
    println!(
        "egress proxy RSS: {before} KiB before, {with_idle} KiB with {} idle tunnels open",
        idle.len()
    );
    drop(idle);

    let mut group = c.benchmark_group("tunnel");
    group.throughput(Throughput::Bytes(PAYLOAD as u64));
    group.sample_size(10);
    group.bench_function("direct loopback copy", |b| {
        b.iter(|| send_all(TcpStream::connect(sink).unwrap(), &chunk))
    });
    group.bench_function("through CONNECT tunnel", |b| {
        b.iter(|| send_all(tunnel(proxy, "sink.test", sink.port()), &chunk))
    });
    group.finish();

    let mut group = c.benchmark_group("http request");
    let direct_req = format!("GET /x HTTP/1.1\r\nHost: sink.test:{}\r\n\r\n", http.port());
    let proxied_req = format!(
        "GET http://sink.test:{0}/x HTTP/1.1\r\nHost: sink.test:{0}\r\n\r\n",
        http.port()
    );
    group.bench_function("direct (new connection)", |b| {
        b.iter(|| {
            let mut s = TcpStream::connect(http).unwrap();
            s.set_nodelay(true).unwrap();
            get(&mut s, direct_req.as_bytes());
        })
    });
    group.bench_function("through the proxy (new connection)", |b| {
        b.iter(|| {
            let mut s = TcpStream::connect(proxy).unwrap();
            s.set_nodelay(true).unwrap();
            get(&mut s, proxied_req.as_bytes());
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

struct Forked(moat_sandbox::helper::Helper);

impl moat_egress::ProxyProcess for Forked {
    fn pid(&self) -> u32 {
        self.0.pid()
    }
}

/// The proxy in a helper process, confined, as `moat_shell::egress::start`
/// runs it (a benchmark cannot depend on moat-shell, which depends on this).
fn start(config: EgressConfig) -> Result<Egress, moat_egress::EgressError> {
    use std::os::fd::AsRawFd as _;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let fd = theirs.as_raw_fd();
    let helper = moat_sandbox::helper::spawn_helper(&[fd], move || {
        let readable: Vec<&std::path::Path> = moat_egress::PROXY_READABLE
            .iter()
            .map(std::path::Path::new)
            .collect();
        if moat_sandbox::helper::confine_read_only(&readable, false).is_err() {
            return 1;
        }
        moat_egress::serve_proxy(theirs, config)
    })
    .map_err(|e| moat_egress::EgressError::Start(e.to_string()))?;
    Egress::over(ours, Box::new(Forked(helper)))
}
