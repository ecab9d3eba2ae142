//! Cross-replica wake-ups over PostgreSQL `LISTEN`/`NOTIFY`: a replica
//! that changed a run (or anything else a waiting request may care about)
//! publishes it on the `moat_changes` channel; every other replica hears it
//! at once and wakes its waiting requests, instead of re-querying the
//! database on a timer. SQLite has no other replica to tell.
//!
//! Each feed keeps two connections of its own (one listens, one sends),
//! outside the pool. A listener that loses its connection reconnects with
//! backoff, and reports a change of everything once it is back (it may
//! have missed some); meanwhile [`ChangeFeed::listening`] is false, and
//! waiters fall back to polling.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator as _;

use crate::{Backend, Store, StoreError};

const CHANNEL: &str = "moat_changes";

/// Something that changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Anything: every waiter looks again.
    All,
    /// One run (an operation queued, dispatched or answered).
    Run(String),
}

impl Change {
    fn payload(&self, replica: &str) -> String {
        match self {
            Change::All => format!("{replica} *"),
            Change::Run(run) => format!("{replica} run {run}"),
        }
    }

    /// `None` for another replica's malformed payload, or for our own.
    fn parse(payload: &str, replica: &str) -> Option<Change> {
        let (from, rest) = payload.split_once(' ')?;
        if from == replica {
            return None;
        }
        match rest {
            "*" => Some(Change::All),
            _ => rest
                .strip_prefix("run ")
                .filter(|run| !run.is_empty())
                .map(|run| Change::Run(run.to_owned())),
        }
    }
}

/// A replica's end of the change channel.
pub struct ChangeFeed {
    replica: String,
    outbox: mpsc::Sender<Change>,
    listening: Arc<AtomicBool>,
    /// Set when the feed is dropped: the listener ends within a second
    /// (the sender ends when `outbox` goes).
    stop: Arc<AtomicBool>,
}

impl Drop for ChangeFeed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl ChangeFeed {
    /// Tells the other replicas (at once, in the background).
    pub fn publish(&self, change: Change) {
        let _ = self.outbox.send(change);
    }

    /// Whether other replicas' changes reach this one now.
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// This replica's name on the channel.
    pub fn replica(&self) -> &str {
        &self.replica
    }
}

impl Store {
    /// On PostgreSQL, a feed that calls `on_change` for every change
    /// another replica publishes; `None` on SQLite.
    pub fn change_feed(
        &self,
        on_change: impl Fn(Change) + Send + 'static,
    ) -> Result<Option<ChangeFeed>, StoreError> {
        let Backend::Postgres(pool) = &self.backend else {
            return Ok(None);
        };
        let replica = moat_core::random::hex(8);
        let listening = Arc::new(AtomicBool::new(false));
        let (outbox, inbox) = mpsc::channel::<Change>();

        let stop = Arc::new(AtomicBool::new(false));
        let config = pool.config.clone();
        let (me, flag, stopped) = (replica.clone(), Arc::clone(&listening), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("moat-listen".into())
            .spawn(move || listen(&config, &me, &flag, &stopped, &on_change))
            .map_err(|e| StoreError::Corrupt(format!("starting the change listener: {e}")))?;

        let config = pool.config.clone();
        let me = replica.clone();
        std::thread::Builder::new()
            .name("moat-notify".into())
            .spawn(move || send(&config, &me, &inbox))
            .map_err(|e| StoreError::Corrupt(format!("starting the change sender: {e}")))?;
        Ok(Some(ChangeFeed {
            replica,
            outbox,
            listening,
            stop,
        }))
    }
}

fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100u64 << failures.min(6))
}

/// How often a listener with nothing to hear checks whether to stop.
const STOP_CHECK: Duration = Duration::from_secs(1);

/// Listens until the feed is dropped, reconnecting when the connection drops.
fn listen(
    config: &postgres::Config,
    replica: &str,
    listening: &AtomicBool,
    stop: &AtomicBool,
    on_change: &dyn Fn(Change),
) {
    let mut failures = 0;
    // Whether changes may have gone unheard since the last connection.
    let mut missed = false;
    while !stop.load(Ordering::Acquire) {
        let connected = config.connect(postgres::NoTls).and_then(|mut client| {
            client.batch_execute(&format!("LISTEN {CHANNEL}"))?;
            Ok(client)
        });
        let mut client = match connected {
            Ok(client) => client,
            Err(e) => {
                if failures == 0 {
                    eprintln!("moat serve: change listener: {e}; polling until it is back");
                }
                std::thread::sleep(backoff(failures).min(STOP_CHECK));
                failures += 1;
                continue;
            }
        };
        failures = 0;
        listening.store(true, Ordering::Release);
        if missed {
            on_change(Change::All);
        }
        // Until the feed is dropped, or the connection ends or fails.
        while !stop.load(Ordering::Acquire) && !client.is_closed() {
            let mut notifications = client.notifications();
            let mut heard = notifications.timeout_iter(STOP_CHECK);
            // Quiet for a while (or closed: checked above), or failed.
            if drain(&mut heard, replica, stop, on_change).is_err() {
                break;
            }
        }
        listening.store(false, Ordering::Release);
        missed = true;
    }
}

/// Hands what `heard` brings to `on_change` until it is quiet, or fails;
/// nothing once the feed is dropped.
fn drain(
    heard: &mut postgres::notifications::TimeoutIter<'_>,
    replica: &str,
    stop: &AtomicBool,
    on_change: &dyn Fn(Change),
) -> Result<(), postgres::Error> {
    while let Some(n) = heard.next()? {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(change) = Change::parse(n.payload(), replica) {
            on_change(change);
        }
    }
    Ok(())
}

/// Sends what this replica publishes, batched: everything queued while the
/// previous batch went out goes in one round trip (one simple-query string
/// of `pg_notify` calls, which PostgreSQL runs as one transaction and
/// delivers at its commit), duplicates dropped.
fn send(config: &postgres::Config, replica: &str, inbox: &mpsc::Receiver<Change>) {
    let mut client: Option<postgres::Client> = None;
    let mut failures = 0;
    while let Ok(first) = inbox.recv() {
        let mut batch = vec![plain(first)];
        for change in inbox.try_iter().map(plain) {
            if !batch.contains(&change) {
                batch.push(change);
            }
        }
        if batch.contains(&Change::All) {
            batch = vec![Change::All];
        }
        let sql: String = batch
            .iter()
            .map(|change| {
                format!(
                    "SELECT pg_notify('{CHANNEL}', {});",
                    literal(&change.payload(replica))
                )
            })
            .collect();
        let sent = (|| -> Result<(), postgres::Error> {
            let c = match client.as_mut() {
                Some(c) if !c.is_closed() => c,
                _ => client.insert(config.connect(postgres::NoTls)?),
            };
            c.batch_execute(&sql)
        })();
        match sent {
            Ok(()) => failures = 0,
            Err(e) => {
                // Other replicas still poll while their listener is down;
                // a lost wake-up costs them latency, never correctness.
                if failures == 0 {
                    eprintln!("moat serve: change sender: {e}");
                }
                client = None;
                failures += 1;
                std::thread::sleep(backoff(failures));
            }
        }
    }
}

/// A run whose id is not plain (`[A-Za-z0-9._-]`) is announced as a change
/// of everything: payloads go into SQL text, and only plain ones do.
fn plain(change: Change) -> Change {
    match change {
        Change::Run(run)
            if !run.is_empty()
                && run
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) =>
        {
            Change::Run(run)
        }
        Change::Run(_) | Change::All => Change::All,
    }
}

/// `text` (a replica's hex name and a plain run id) as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::Change;

    #[test]
    fn only_plain_run_ids_reach_the_sql_text() {
        use super::{literal, plain};
        assert_eq!(literal("ab12 run r-1.x_y"), "'ab12 run r-1.x_y'");
        assert_eq!(plain(Change::Run("r-1".into())), Change::Run("r-1".into()));
        for odd in ["", "a'b", "a\\b", "a b", "a;b"] {
            assert_eq!(plain(Change::Run(odd.into())), Change::All, "{odd:?}");
        }
    }

    #[test]
    fn payloads_round_trip_and_our_own_are_ignored() {
        let run = Change::Run("run-1".into());
        assert_eq!(Change::parse(&run.payload("a"), "b"), Some(run.clone()));
        assert_eq!(
            Change::parse(&Change::All.payload("a"), "b"),
            Some(Change::All)
        );
        assert_eq!(Change::parse(&run.payload("a"), "a"), None);
        for bad in ["", "a", "a run ", "a walk x"] {
            assert_eq!(Change::parse(bad, "b"), None, "{bad:?}");
        }
    }
}
