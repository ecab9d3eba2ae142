//! The runner's half of a managed run's ports (`ingress-only`): while an
//! operation that exposes ports runs, the runner asks the control plane for
//! requests waiting on them and, for each, opens a tunnel back to the
//! control plane (signed, upgraded to `moat-ingress`) and joins it to the
//! port's socket, which the sandbox's forwarder serves. The runner listens
//! on nothing: every connection is one it makes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use moat_client::{RunnerClient, Tunnel};
use moat_core::op::ExecArgvArgs;
use moat_core::{Envelope, NetworkMode};
use moat_egress::idle::copy_until_idle;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixStream};

/// How long one ask for waiting requests lasts: also how long an
/// operation's end may wait for the relay to notice it.
const ASK_WAIT: Duration = Duration::from_secs(1);

/// A tunnel with nothing moving either way for this long is closed.
const IDLE: Duration = Duration::from_secs(300);

/// How long a tunnel waits for its port's socket to appear.
const SOCKET_WAIT: Duration = Duration::from_secs(5);

/// The longest response head the control plane sends a tunnel.
const MAX_HEAD: usize = 8 << 10;

/// Tunnels being carried at once for one operation; a request past it
/// waits for the next ask.
const MAX_TUNNELS: usize = 128;

/// The ports `envelope` exposes (an `exec_argv` in `ingress-only`).
pub fn exposed_ports(envelope: &Envelope) -> Vec<u16> {
    if envelope.op != "exec_argv" {
        return Vec::new();
    }
    match serde_json::from_value::<ExecArgvArgs>(envelope.args.clone()) {
        Ok(args) if args.network.or(envelope.network) == Some(NetworkMode::IngressOnly) => {
            args.expose
        }
        _ => Vec::new(),
    }
}

/// Does `work` (the operation) while carrying the requests to `ports` of
/// run `run` to their sockets in `dir` (`DIR/PORT.sock`). Tunnels still
/// open when the work ends are cut: the program is gone.
pub fn relaying<T>(
    client: &RunnerClient,
    run: &str,
    dir: &Path,
    ports: &[u16],
    work: impl FnOnce() -> T,
) -> T {
    if ports.is_empty() {
        return work();
    }
    /// Stops the relay when the work ends, however it ends (a panic too:
    /// the scope waits for the relay).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            if let Err(e) = relay(client, run, dir, ports, &stop) {
                eprintln!("moat runner: run {run}: the ports' relay stopped: {e}");
            }
        });
        let _stop = Stop(&stop);
        work()
    })
}

fn relay(
    client: &RunnerClient,
    run: &str,
    dir: &Path,
    ports: &[u16],
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("moat-ingress")
        .enable_all()
        .build()?;
    // The runner's requests may go through a proxy its environment names;
    // its tunnels do not (an upgraded connection through a proxy would need
    // CONNECT): say so where a failed tunnel will be looked for.
    if let Some(var) = [
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ]
    .into_iter()
    .find(|var| std::env::var_os(var).is_some())
    {
        eprintln!(
            "moat runner: run {run}: {var} is set, but tunnels for the run's ports connect to \
             the control plane directly"
        );
    }
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_TUNNELS));
    let mut tls: Option<Arc<rustls::ClientConfig>> = None;
    while !stop.load(Ordering::Relaxed) {
        let dials = match client.ingress_dials(run, ASK_WAIT) {
            Ok(dials) => dials,
            Err(e) => {
                eprintln!("moat runner: run {run}: ingress: {e}");
                std::thread::sleep(ASK_WAIT);
                continue;
            }
        };
        for dial in dials {
            if !ports.contains(&dial.port) {
                eprintln!(
                    "moat runner: run {run}: a request to port {}, which this operation does \
                     not expose: dropped",
                    dial.port
                );
                continue;
            }
            // A request past the tunnels open at once is left to time out:
            // its tunnel would be signed now and opened too late.
            let Ok(slot) = Arc::clone(&open).try_acquire_owned() else {
                eprintln!(
                    "moat runner: run {run}: {MAX_TUNNELS} tunnels are open: a request to \
                     port {} dropped",
                    dial.port
                );
                continue;
            };
            let tunnel = match client.tunnel(run, &dial.conn, dial.via.as_deref()) {
                Ok(tunnel) => tunnel,
                Err(e) => {
                    eprintln!("moat runner: run {run}: tunnel: {e}");
                    continue;
                }
            };
            let config = match (&tls, tunnel.tls) {
                (_, false) => None,
                (Some(config), true) => Some(Arc::clone(config)),
                (None, true) => match tls_config(tunnel.roots.as_deref()) {
                    Ok(config) => Some(Arc::clone(tls.insert(config))),
                    Err(e) => {
                        eprintln!("moat runner: run {run}: tunnel TLS: {e}");
                        continue;
                    }
                },
            };
            let socket = dir.join(format!("{}.sock", dial.port));
            let run = run.to_owned();
            runtime.spawn(async move {
                let _slot = slot;
                if let Err(e) = carry(tunnel, config, socket).await {
                    eprintln!("moat runner: run {run}: port {}: {e}", dial.port);
                }
            });
        }
    }
    runtime.shutdown_background();
    Ok(())
}

/// TLS to the control plane: its CAs, or Mozilla's.
fn tls_config(roots: Option<&[Vec<u8>]>) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        Some(ders) => {
            for der in ders {
                store.add(rustls::pki_types::CertificateDer::from(der.clone()))?;
            }
        }
        None => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Opens `tunnel` and joins it to the port's `socket` until either closes.
async fn carry(
    tunnel: Tunnel,
    tls: Option<Arc<rustls::ClientConfig>>,
    socket: PathBuf,
) -> std::io::Result<()> {
    let tcp = TcpStream::connect((tunnel.host.as_str(), tunnel.port)).await?;
    tcp.set_nodelay(true)?;
    match tls {
        None => join(tcp, &tunnel.head, &socket).await,
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from(tunnel.host.clone())
                .map_err(std::io::Error::other)?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            join(stream, &tunnel.head, &socket).await
        }
    }
}

async fn join<S: AsyncRead + AsyncWrite + Unpin>(
    mut control: S,
    head: &[u8],
    socket: &Path,
) -> std::io::Result<()> {
    control.write_all(head).await?;
    control.flush().await?;
    let answer = read_head(&mut control).await?;
    let status = answer.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 101") {
        return Err(std::io::Error::other(format!(
            "the control plane answered the tunnel with {status:?}"
        )));
    }
    let program = connect(socket).await?;
    copy_until_idle(control, program, IDLE).await
}

/// The port's socket. A request that came as the operation began may be
/// here before the launcher made it: it gets a few seconds.
async fn connect(socket: &Path) -> std::io::Result<UnixStream> {
    let deadline = tokio::time::Instant::now() + SOCKET_WAIT;
    loop {
        match UnixStream::connect(socket).await {
            Ok(stream) => return Ok(stream),
            // Not made yet, or a stale one the launcher is about to replace.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", socket.display()),
                ));
            }
        }
    }
}

/// The answer's head, byte by byte: what follows it is the request the
/// tunnel carries, the program's to read.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<String> {
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err(std::io::Error::other(
                "the tunnel's answer head is too long",
            ));
        }
        head.push(stream.read_u8().await?);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}
