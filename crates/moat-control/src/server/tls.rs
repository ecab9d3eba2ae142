//! TLS in front of the API (`moat serve --tls-cert --tls-key`): rustls with
//! ring, as the store's link to PostgreSQL. Handshakes run on tasks of their
//! own, each with a deadline, at most so many at once and per address, and
//! only finished ones reach axum: a client that connects and says nothing
//! holds up no one else's connection. The certificate is read at start: a
//! renewed one is served after a restart.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A handshake not done by then is dropped.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// Handshakes in progress at once; a connection past it is closed at once
/// (accepting goes on: heartbeats must not queue behind a flood).
const HANDSHAKES: usize = 1024;

/// Handshakes in progress at once from one address.
const HANDSHAKES_PER_PEER: usize = 16;

/// Why the certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: no PEM certificate in it", .0.display())]
    NoCertificate(PathBuf),
    #[error("the certificate and key do not make a TLS server: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A server configuration from a PEM certificate chain (the server's
/// certificate first) and a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let read_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsSetupError::Read { path, source }
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(read_error(cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_error(cert))?;
    if chain.is_empty() {
        return Err(TlsSetupError::NoCertificate(cert.to_path_buf()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(read_error(key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    // HTTP/1.1 only: the server speaks no HTTP/2 (axum without its http2
    // feature), so offering h2 would break clients that take it.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener that hands axum finished TLS connections.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (done, ready) = mpsc::channel(HANDSHAKES);
        let acceptor = TlsAcceptor::from(config);
        let slots = Arc::new(Semaphore::new(HANDSHAKES));
        let per_peer = Arc::new(std::sync::Mutex::new(HashMap::<IpAddr, usize>::new()));
        let accepting = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(_) => {
                        // Out of descriptors and the like: breathe, go on.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                    continue; // dropped: closed at once
                };
                let Some(peer_slot) = PeerSlot::take(&per_peer, peer.ip()) else {
                    continue;
                };
                // Small answers go out at once (no Nagle wait for the peer's ACK).
                let _ = tcp.set_nodelay(true);
                let (acceptor, done) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    let (_slot, _peer_slot) = (slot, peer_slot);
                    if let Ok(Ok(tls)) =
                        tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await
                    {
                        let _ = done.send((tls, peer)).await;
                    }
                });
            }
        });
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

/// One handshake in progress from an address, counted while it lives.
struct PeerSlot {
    counts: Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PeerSlot {
    fn take(counts: &Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr) -> Option<Self> {
        let mut map = counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(ip).or_insert(0);
        if *n >= HANDSHAKES_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            counts: Arc::clone(counts),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accepting task ended (the runtime is going down).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
