//! Connections that end when nothing moves: a relay of bytes between two
//! streams (a run's port, a tunnel) is cut once neither side has sent
//! anything for a while, so a peer that vanished without closing holds no
//! task or socket for ever.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// When bytes last moved through the streams that share it.
#[derive(Clone)]
pub struct Activity {
    since: Instant,
    /// Milliseconds after `since` of the last bytes moved.
    last_ms: Arc<AtomicU64>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

impl Activity {
    pub fn new() -> Activity {
        Activity {
            since: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.since + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Returns once nothing has moved for `idle`.
    pub async fn idle(&self, idle: Duration) {
        loop {
            let due = self.last() + idle;
            if Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// A stream whose reads and writes count as activity.
pub struct Watched<S> {
    inner: S,
    activity: Activity,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Activity) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Copies both ways between `a` and `b` until both sides have closed, or
/// nothing moved either way for `idle` (then `TimedOut`). A side that
/// ends a connection abruptly (reset, broken pipe) ends it quietly.
pub async fn copy_until_idle<A, B>(a: A, mut b: B, idle: Duration) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity::new();
    let mut a = Watched::new(a, activity.clone());
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut a, &mut b) => match copied {
            Err(e) if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof
            ) => Ok(()),
            other => other.map(|_| ()),
        },
        () = activity.idle(idle) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("nothing moved for {} s", idle.as_secs()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test(start_paused = true)]
    async fn a_relay_lives_while_bytes_move_and_ends_once_they_stop() {
        let (mut left, a) = tokio::io::duplex(64);
        let (b, mut right) = tokio::io::duplex(64);
        let relay = tokio::spawn(copy_until_idle(a, b, Duration::from_secs(10)));
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            left.write_all(b"x").await.unwrap();
            let mut byte = [0u8; 1];
            right.read_exact(&mut byte).await.unwrap();
        }
        assert!(!relay.is_finished(), "cut while bytes still moved");
        tokio::time::sleep(Duration::from_secs(11)).await;
        let ended = relay.await.unwrap();
        assert_eq!(
            ended.map_err(|e| e.kind()),
            Err(io::ErrorKind::TimedOut),
            "an idle relay must end"
        );
    }
}
