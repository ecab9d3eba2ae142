//! The proxy protocol on one accepted connection. The first request head is
//! read by hand: a `CONNECT` becomes a raw tunnel (TLS passes through, its
//! ClientHello's server name checked against the CONNECT target first); an
//! absolute `http://` request is handed to hyper for forwarding; anything
//! else is answered 400 and the connection closed.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use moat_core::DenialReason;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::gate::{Access, Refused, Run, Scope};
use crate::sni::{self, Hello};

const MAX_HEAD: usize = 16 << 10;
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `listener` until `closed` turns true, then cuts every connection
/// it accepted and returns once their events are recorded.
pub(crate) async fn serve(
    listener: TcpListener,
    scope: Arc<Scope>,
    mut closed: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    // Connections accepted at once, whatever they are doing: a program
    // cannot hold the proxy's descriptors with idle or half-sent requests.
    let cap = usize::try_from(scope.run.config.limits.max_connections)
        .unwrap_or(usize::MAX)
        .saturating_mul(2)
        .clamp(16, 4096);
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    loop {
        tokio::select! {
            accepted = accept(&listener, &slots) => match accepted {
                Some((stream, slot)) => {
                    let _ = stream.set_nodelay(true);
                    let scope = scope.clone();
                    let closed = closed.clone();
                    connections.spawn(async move {
                        connection(stream, scope, closed).await;
                        drop(slot);
                    });
                }
                // Out of descriptors or the like: wait rather than spin.
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            _ = closed.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

async fn accept(
    listener: &TcpListener,
    slots: &Arc<tokio::sync::Semaphore>,
) -> Option<(TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    let slot = slots.clone().acquire_owned().await.ok()?;
    let (stream, _) = listener.accept().await.ok()?;
    Some((stream, slot))
}

async fn connection(mut stream: TcpStream, scope: Arc<Scope>, mut closed: watch::Receiver<bool>) {
    tokio::select! {
        _ = handle(&mut stream, &scope) => {}
        _ = closed.wait_for(|c| *c) => {}
    }
}

async fn handle(stream: &mut TcpStream, scope: &Arc<Scope>) {
    let started = Instant::now();
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(stream)).await {
        Ok(Ok(Some(head))) => head,
        _ => return, // closed, timed out or unreadable: nothing was asked
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let parsed = request.parse(&head.bytes);
    let (method, target) = match (parsed, request.method, request.path) {
        (Ok(httparse::Status::Complete(_)), Some(m), Some(p)) => (m.to_owned(), p.to_owned()),
        _ => {
            let refused = not_a_proxy_request(scope, "?", "", started, "not an HTTP request");
            let _ = stream.write_all(&refusal_bytes(&refused)).await;
            return;
        }
    };
    if method == "CONNECT" {
        tunnel(stream, scope, &target, head.rest, started).await;
    } else if target.starts_with("http://") {
        // The head, and whatever came with it (the start of a body): all of
        // it is the request hyper reads.
        let mut prefix = head.bytes;
        prefix.extend_from_slice(&head.rest);
        let io = Rewind {
            prefix,
            offset: 0,
            inner: stream,
        };
        let scope = scope.clone();
        let service = hyper::service::service_fn(move |req| forward(req, scope.clone()));
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(MAX_HEAD * 4)
            .serve_connection(TokioIo::new(io), service)
            .await;
    } else {
        let host = target.split('/').nth(2).unwrap_or_default();
        let refused = not_a_proxy_request(
            scope,
            &method,
            host,
            started,
            "send CONNECT host:port or an absolute http:// URL",
        );
        let _ = stream.write_all(&refusal_bytes(&refused)).await;
    }
}

/// Records a request that is not one the proxy serves.
fn not_a_proxy_request(
    scope: &Scope,
    method: &str,
    host: &str,
    started: Instant,
    detail: &str,
) -> Refused {
    let access = Access {
        method,
        host,
        port: 0,
        started,
    };
    let refused = Refused::deny(DenialReason::NotAProxyRequest, detail);
    // Counted like any request, so that a loop of them meets the budget.
    scope.count_request();
    scope.refused(&access, &refused);
    refused
}

struct Head {
    /// The whole head, `\r\n\r\n` included.
    bytes: Vec<u8>,
    /// What the client sent after it (e.g. a pipelined TLS ClientHello).
    rest: Vec<u8>,
}

async fn read_head(stream: &mut TcpStream) -> io::Result<Option<Head>> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 2048];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok(Some(Head { bytes: buf, rest }));
        }
        if buf.len() > MAX_HEAD {
            return Ok(Some(Head {
                bytes: b"?".to_vec(),
                rest: Vec::new(),
            }));
        }
    }
}

fn refusal_bytes(refused: &Refused) -> Vec<u8> {
    let status = refused.status();
    let phrase = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Refused");
    let reason = refused.reason.as_str();
    let body = format!("moat egress: {}\n", refused.for_client());
    format!(
        "HTTP/1.1 {status} {phrase}\r\nX-Moat-Denied: {reason}\r\nContent-Type: text/plain\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `host:port` of a CONNECT target (the port is required).
fn split_authority(target: &str) -> Option<(String, u16)> {
    let (host, port) = target.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

async fn tunnel(
    stream: &mut TcpStream,
    scope: &Arc<Scope>,
    target: &str,
    mut hello: Vec<u8>,
    started: Instant,
) {
    let Some((raw_host, port)) = split_authority(target) else {
        let refused =
            not_a_proxy_request(scope, "CONNECT", target, started, "CONNECT needs host:port");
        let _ = stream.write_all(&refusal_bytes(&refused)).await;
        return;
    };
    let access = Access {
        method: "CONNECT",
        host: &raw_host,
        port,
        started,
    };
    let mut admitted = match scope.admit(&raw_host, port).await {
        Ok(a) => a,
        Err(refused) => {
            scope.refused(&access, &refused);
            let _ = stream.write_all(&refusal_bytes(&refused)).await;
            return;
        }
    };
    let access = Access {
        host: &admitted.host,
        ..access
    };
    if stream
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    // Hold the client's first bytes back until its ClientHello names the host.
    let checked = tokio::time::timeout(HELLO_TIMEOUT, async {
        loop {
            match sni::parse(&hello) {
                Hello::Incomplete if hello.len() <= sni::MAX_HELLO + 1024 => {
                    let mut chunk = [0u8; 4096];
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return Err(None),
                        Ok(n) => hello.extend_from_slice(&chunk[..n]),
                    }
                }
                Hello::ServerName(Some(name)) if name == admitted.host => return Ok(()),
                Hello::ServerName(Some(name)) => {
                    return Err(Some(format!(
                        "TLS server name {name} differs from the CONNECT host {}",
                        admitted.host
                    )));
                }
                Hello::ServerName(None) => {
                    return Err(Some("the TLS ClientHello names no server".to_owned()));
                }
                _ => {
                    return Err(Some(
                        "the tunnel does not start with a TLS ClientHello".to_owned(),
                    ));
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| Err(Some("no TLS ClientHello in time".to_owned())));
    match checked {
        Ok(()) => {}
        // The client gave up before sending anything: nothing was refused.
        Err(None) => {
            scope.completed(&access, admitted.address, Some(200), (0, 0), None);
            return;
        }
        Err(Some(detail)) => {
            let refused = Refused::deny(DenialReason::SniMismatch, detail);
            scope.completed(&access, admitted.address, Some(200), (0, 0), Some(&refused));
            return;
        }
    }
    let out = AtomicU64::new(0);
    let into = AtomicU64::new(0);
    let run = &scope.run;
    let mut cut = None;
    if !run.spend(hello.len()) {
        cut = Some(limit_refusal(run));
    } else if admitted.stream.write_all(&hello).await.is_ok() {
        out.fetch_add(hello.len() as u64, Ordering::Relaxed);
        let result = tokio::try_join!(
            relay(stream, &admitted.stream, run, &out),
            relay(&admitted.stream, stream, run, &into),
        );
        if let Err(Cut::Limit) = result {
            cut = Some(limit_refusal(run));
        }
    }
    let counts = (out.load(Ordering::Relaxed), into.load(Ordering::Relaxed));
    scope.completed(&access, admitted.address, Some(200), counts, cut.as_ref());
}

fn limit_refusal(run: &Run) -> Refused {
    Refused::deny(
        DenialReason::EgressLimit,
        format!(
            "the run's limit of {} bytes is spent",
            run.config.limits.max_bytes
        ),
    )
}

enum Cut {
    Io,
    Limit,
}

/// Bytes moved per read of a relay (allocated only while data flows).
const RELAY_BUFFER: usize = 256 << 10;

/// Copies one direction until end of stream (then half-closes the other side).
/// The buffer exists while data flows and is dropped once the source runs
/// dry, so an idle tunnel holds none.
async fn relay(
    from: &TcpStream,
    to: &TcpStream,
    run: &Run,
    counter: &AtomicU64,
) -> Result<(), Cut> {
    let mut buf: Option<Vec<u8>> = None;
    loop {
        from.readable().await.map_err(|_| Cut::Io)?;
        let b = buf.get_or_insert_with(|| Vec::with_capacity(RELAY_BUFFER));
        b.clear();
        match from.try_read_buf(b) {
            Ok(0) => {
                let _ = socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
                return Ok(());
            }
            Ok(n) => {
                if !run.spend(n) {
                    return Err(Cut::Limit);
                }
                let mut sent = 0;
                while sent < n {
                    to.writable().await.map_err(|_| Cut::Io)?;
                    match to.try_write(&b[sent..n]) {
                        Ok(k) => sent += k,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(_) => return Err(Cut::Io),
                    }
                }
                counter.fetch_add(n as u64, Ordering::Relaxed);
                if n < RELAY_BUFFER / 4 {
                    buf = None;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(Cut::Io),
        }
    }
}

pub(crate) type ProxyBody = BoxBody<Bytes, hyper::Error>;

fn full(text: String) -> ProxyBody {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

fn refusal_response(refused: &Refused) -> Response<ProxyBody> {
    let mut response = Response::new(full(format!("moat egress: {}\n", refused.for_client())));
    *response.status_mut() =
        StatusCode::from_u16(refused.status()).unwrap_or(StatusCode::FORBIDDEN);
    let reason = refused.reason.as_str();
    response
        .headers_mut()
        .insert("x-moat-denied", HeaderValue::from_static(reason));
    response
}

/// Headers that describe one hop, or carry the client's proxy credentials.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
}

/// Host and port of an absolute `http://` URL.
fn http_target(uri: &Uri) -> Option<(String, u16)> {
    if uri.scheme_str() != Some("http") {
        return None;
    }
    let authority = uri.authority()?;
    // No user info; a port, if any, that parses.
    if authority.as_str().contains('@')
        || (authority.port().is_some() && authority.port_u16().is_none())
    {
        return None;
    }
    Some((
        authority.host().to_owned(),
        authority.port_u16().unwrap_or(80),
    ))
}

async fn forward(
    mut req: Request<Incoming>,
    scope: Arc<Scope>,
) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
    let method = req.method().as_str().to_owned();
    let Some((raw_host, port)) = http_target(req.uri()) else {
        let refused = not_a_proxy_request(
            &scope,
            &method,
            req.uri().host().unwrap_or_default(),
            started,
            "only absolute http:// URLs are forwarded (use CONNECT for https)",
        );
        return Ok(refusal_response(&refused));
    };
    let access = Access {
        method: &method,
        host: &raw_host,
        port,
        started,
    };
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_ascii_lowercase())
        .unwrap_or_default();
    if let Some(host_header) = req.headers().get(header::HOST) {
        let given = host_header.to_str().unwrap_or("").to_ascii_lowercase();
        let same = given == authority
            || (port == 80
                && (given == raw_host.to_ascii_lowercase()
                    || given == format!("{}:80", raw_host.to_ascii_lowercase())));
        if !same {
            let refused = Refused::deny(
                DenialReason::HostMismatch,
                // The header's value is the program's: not quoted in the record.
                format!("the Host header differs from the URL's {authority:?}"),
            );
            scope.count_request();
            scope.refused(&access, &refused);
            return Ok(refusal_response(&refused));
        }
    }
    let admitted = match scope.admit(&raw_host, port).await {
        Ok(a) => a,
        Err(refused) => {
            scope.refused(&access, &refused);
            return Ok(refusal_response(&refused));
        }
    };
    let counts = Arc::new(Counts::default());
    let io = Metered {
        inner: admitted.stream,
        run: scope.run.clone(),
        counts: counts.clone(),
    };
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse::<Uri>()
        .unwrap_or_else(|_| Uri::from_static("/"));
    *req.uri_mut() = path;
    strip_hop_by_hop(req.headers_mut());
    if let Ok(value) = HeaderValue::from_str(&authority) {
        req.headers_mut().insert(header::HOST, value);
    }
    let host = admitted.host.clone();
    let address = admitted.address;
    let failed = |detail: String, counts: &Counts| {
        let access = Access {
            method: &method,
            host: &host,
            port,
            started,
        };
        if counts.limit_hit.load(Ordering::Relaxed) {
            // The request did go out: record what moved, and the cut.
            let refused = limit_refusal(&scope.run);
            let moved = (
                counts.out.load(Ordering::Relaxed),
                counts.into.load(Ordering::Relaxed),
            );
            scope.completed(&access, address, None, moved, Some(&refused));
            return Ok(refusal_response(&refused));
        }
        let refused = Refused::fail(detail);
        scope.refused(&access, &refused);
        Ok(refusal_response(&refused))
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(io)).await {
        Ok(pair) => pair,
        Err(e) => return failed(format!("{host}: {e}"), &counts),
    };
    tokio::spawn(conn);
    let mut response = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return failed(format!("{host}: {e}"), &counts),
    };
    strip_hop_by_hop(response.headers_mut());
    let status = response.status().as_u16();
    let slot = admitted._slot;
    let scope_done = scope.clone();
    let done = Box::new(move || {
        let _slot = slot;
        let access = Access {
            method: &method,
            host: &host,
            port,
            started,
        };
        let cut = counts
            .limit_hit
            .load(Ordering::Relaxed)
            .then(|| limit_refusal(&scope_done.run));
        scope_done.completed(
            &access,
            address,
            Some(status),
            (
                counts.out.load(Ordering::Relaxed),
                counts.into.load(Ordering::Relaxed),
            ),
            cut.as_ref(),
        );
    });
    Ok(response.map(|body| {
        Tracked {
            inner: body,
            done: Some(done),
        }
        .boxed()
    }))
}

#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) out: AtomicU64,
    pub(crate) into: AtomicU64,
    pub(crate) limit_hit: std::sync::atomic::AtomicBool,
}

/// An upstream connection that counts its bytes against the run's budget.
pub(crate) struct Metered<T> {
    pub(crate) inner: T,
    pub(crate) run: Arc<Run>,
    pub(crate) counts: Arc<Counts>,
}

impl<T> Metered<T> {
    fn spend(&self, n: usize) -> io::Result<()> {
        if self.run.spend(n) {
            Ok(())
        } else {
            self.counts.limit_hit.store(true, Ordering::Relaxed);
            Err(io::Error::other("the run's egress byte limit is spent"))
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if let Poll::Ready(Ok(())) = &result
            && n > 0
        {
            self.spend(n)?;
            self.counts.into.fetch_add(n as u64, Ordering::Relaxed);
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &result {
            let n = *n;
            self.spend(n)?;
            self.counts.out.fetch_add(n as u64, Ordering::Relaxed);
        }
        result
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body that reports when it is finished (or dropped).
struct Tracked {
    inner: Incoming,
    done: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = &polled
            && let Some(done) = self.done.take()
        {
            done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done();
        }
    }
}

/// The bytes already read (the request head), then the stream.
struct Rewind<'a> {
    prefix: Vec<u8>,
    offset: usize,
    inner: &'a mut TcpStream,
}

impl AsyncRead for Rewind<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.offset < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.offset);
            let start = self.offset;
            buf.put_slice(&self.prefix[start..start + n]);
            self.offset += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, data)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}
