//! `/metrics` over plain HTTP/1.1 for a process that has no HTTP server of
//! its own (the runner): a few short requests at a time, each bounded in
//! size and time, which is all a Prometheus scrape needs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::Metrics;

/// Why `/metrics` could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {0} for /metrics: {1}")]
    Listen(SocketAddr, std::io::Error),
}

/// A request must arrive whole in this time, and its head be this small.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_HEAD: usize = 8 << 10;

/// Listens on `address` and answers `GET /metrics` on a thread of its own,
/// for as long as the process lives. Returns the address bound (port 0
/// picks one).
pub fn serve(address: SocketAddr, metrics: Arc<Metrics>) -> Result<SocketAddr, ServeError> {
    let listener = TcpListener::bind(address).map_err(|e| ServeError::Listen(address, e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ServeError::Listen(address, e))?;
    let busy = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("moat-metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                // Each request on a thread of its own, a few at once: a slow
                // client holds one for REQUEST_TIMEOUT at most, and never
                // keeps a scrape waiting behind it.
                if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    busy.fetch_sub(1, Ordering::SeqCst);
                    continue; // dropped: the client sees the connection close
                }
                let (metrics, done) = (Arc::clone(&metrics), Arc::clone(&busy));
                let spawned = std::thread::Builder::new()
                    .name("moat-metrics-request".into())
                    .spawn(move || {
                        let _ = answer(stream, &metrics);
                        done.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    busy.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })
        .map_err(|e| ServeError::Listen(address, e))?;
    Ok(bound)
}

/// Requests answered at once; more connections are closed unanswered.
const MAX_CONNECTIONS: usize = 8;

fn answer(stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    // The whole head within MAX_HEAD bytes and REQUEST_TIMEOUT, however it
    // is dribbled: each read waits only for what is left of the time.
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_HEAD as u64));
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        stream.set_read_timeout(Some(left))?;
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        lines.push(line);
    }
    let request_line = lines.first().cloned().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.encode(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "only /metrics is served here\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "GET /metrics\n".to_owned(),
        ),
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Role;

    fn get(address: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn serves_metrics_and_nothing_else() {
        let metrics = Arc::new(Metrics::new(Role::Runner));
        metrics.run_active(2);
        let at = serve("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let ok = get(at, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("moat_runs_active 2"), "{ok}");
        let other = get(at, "GET /secrets HTTP/1.1\r\n\r\n");
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        let post = get(at, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        // A client that never finishes its head keeps nobody else waiting.
        let mut stalled = TcpStream::connect(at).unwrap();
        stalled.write_all(b"GET /metr").unwrap();
        let ok = get(at, "GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        // Nor does an endless line grow anything past the head's cap.
        let mut endless = TcpStream::connect(at).unwrap();
        let _ = endless.write_all(&vec![b'a'; 64 << 10]);
        drop(stalled);
    }
}
