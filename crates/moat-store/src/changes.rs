//! Cross-replica wake-ups over PostgreSQL `LISTEN`/`NOTIFY`: a replica
//! that changed a run (or anything else a waiting request may care about)
//! announces it on the `moat_changes` channel; every other replica hears it
//! at once and wakes its waiting requests, instead of re-querying the
//! database on a timer. SQLite has no other replica to tell.
//!
//! Replicas say `hello` on the channel when they start and every
//! [`HELLO_EVERY`], and answer a hello from a replica they had not heard
//! from; a replica announces changes only while another one has been
//! heard within [`PRESENCE`], so a lone control plane sends nothing.
//!
//! Each feed keeps two connections of its own (one listens, one sends),
//! outside the pool. A listener that loses its connection reconnects with
//! backoff, and reports a change of everything once it is back (it may
//! have missed some); meanwhile [`ChangeFeed::listening`] is false, and
//! waiters fall back to polling.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use postgres::fallible_iterator::FallibleIterator as _;

use crate::{Backend, Store, StoreError};

const CHANNEL: &str = "moat_changes";

/// How often a replica says it is there.
pub const HELLO_EVERY: Duration = Duration::from_secs(10);

/// How long another replica counts as there after it was last heard.
pub const PRESENCE: Duration = Duration::from_secs(30);

/// Something that changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Anything: every waiter looks again.
    All,
    /// One run (an operation queued, dispatched or answered).
    Run(String),
    /// An org has a run to claim in an environment (created, or queued
    /// again): one of its runners' claims there looks again.
    Queue { org: String, environment: String },
    /// A request to a run's port waits on the replica at `via` (its
    /// advertised URL) for a tunnel from the run's runner, whichever
    /// replica that runner asks.
    Dial {
        run: String,
        conn: String,
        port: u16,
        via: String,
    },
}

/// What goes out on the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outgoing {
    Change(Change),
    Hello,
}

/// What came in from another replica.
#[derive(Debug, PartialEq, Eq)]
enum Heard {
    Change(Change),
    Hello,
}

impl Outgoing {
    fn payload(&self, replica: &str) -> String {
        match self {
            Outgoing::Change(Change::All) => format!("{replica} *"),
            Outgoing::Change(Change::Run(run)) => format!("{replica} run {run}"),
            Outgoing::Change(Change::Queue { org, environment }) => {
                format!("{replica} queue {org} {environment}")
            }
            Outgoing::Change(Change::Dial {
                run,
                conn,
                port,
                via,
            }) => format!("{replica} dial {run} {conn} {port} {}", hex(via)),
            Outgoing::Hello => format!("{replica} hello"),
        }
    }
}

/// The sender and what it said; `None` for a malformed payload or our own.
fn parse<'a>(payload: &'a str, replica: &str) -> Option<(&'a str, Heard)> {
    let (from, rest) = payload.split_once(' ')?;
    if from == replica || from.is_empty() {
        return None;
    }
    let heard = match rest {
        "*" => Heard::Change(Change::All),
        "hello" => Heard::Hello,
        _ => {
            let (kind, id) = rest.split_once(' ').filter(|(_, id)| !id.is_empty())?;
            match kind {
                "run" => Heard::Change(Change::Run(id.to_owned())),
                "dial" => {
                    let mut parts = id.split(' ');
                    let (Some(run), Some(conn), Some(port), Some(via), None) = (
                        parts.next(),
                        parts.next(),
                        parts.next(),
                        parts.next(),
                        parts.next(),
                    ) else {
                        return None;
                    };
                    if run.is_empty() || conn.is_empty() {
                        return None;
                    }
                    Heard::Change(Change::Dial {
                        run: run.to_owned(),
                        conn: conn.to_owned(),
                        port: port.parse().ok()?,
                        via: unhex(via)?,
                    })
                }
                "queue" => {
                    let (org, environment) = id
                        .split_once(' ')
                        .filter(|(o, e)| !o.is_empty() && !e.is_empty())?;
                    Heard::Change(Change::Queue {
                        org: org.to_owned(),
                        environment: environment.to_owned(),
                    })
                }
                _ => return None,
            }
        }
    };
    Some((from, heard))
}

fn now_ms() -> i64 {
    moat_core::time::ms(SystemTime::now())
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// What the feed's threads share.
struct Shared {
    listening: AtomicBool,
    /// Set when the feed is dropped: the listener ends within a second
    /// (the sender ends when the outbox goes).
    stop: AtomicBool,
    /// When another replica was last heard (ms since the epoch; 0: never).
    others_heard: AtomicI64,
}

impl Shared {
    fn others_present(&self) -> bool {
        let heard = self.others_heard.load(Ordering::Acquire);
        heard > 0 && now_ms().saturating_sub(heard) < ms(PRESENCE)
    }
}

/// A replica's end of the change channel.
pub struct ChangeFeed {
    replica: String,
    outbox: mpsc::Sender<Outgoing>,
    shared: Arc<Shared>,
}

impl Drop for ChangeFeed {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
    }
}

impl ChangeFeed {
    /// Tells the other replicas (at once, in the background); nothing is
    /// sent while no other replica is there.
    pub fn publish(&self, change: Change) {
        if self.shared.others_present() {
            let _ = self.outbox.send(Outgoing::Change(change));
        }
    }

    /// Whether other replicas' changes reach this one now.
    pub fn listening(&self) -> bool {
        self.shared.listening.load(Ordering::Acquire)
    }

    /// Whether another replica has been heard within [`PRESENCE`].
    pub fn others_present(&self) -> bool {
        self.shared.others_present()
    }

    /// This replica's name on the channel.
    pub fn replica(&self) -> &str {
        &self.replica
    }
}

impl Store {
    /// On PostgreSQL, a feed that calls `on_change` for every change
    /// another replica announces; `None` on SQLite.
    pub fn change_feed(
        &self,
        on_change: impl Fn(Change) + Send + 'static,
    ) -> Result<Option<ChangeFeed>, StoreError> {
        let Backend::Postgres(pool) = &self.backend else {
            return Ok(None);
        };
        let replica = moat_core::random::hex(8);
        let shared = Arc::new(Shared {
            listening: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            others_heard: AtomicI64::new(0),
        });
        let (outbox, inbox) = mpsc::channel::<Outgoing>();

        let mut connect = pool.connect.clone();
        // A half-open connection must not pass for a listening one.
        connect
            .config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(15));
        let (me, state, replies) = (replica.clone(), Arc::clone(&shared), outbox.clone());
        std::thread::Builder::new()
            .name("moat-listen".into())
            .spawn(move || listen(&connect, &me, &state, &replies, &on_change))
            .map_err(|e| StoreError::Corrupt(format!("starting the change listener: {e}")))?;

        let connect = pool.connect.clone();
        let me = replica.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("moat-notify".into())
            .spawn(move || send(&connect, &me, &inbox))
        {
            shared.stop.store(true, Ordering::Release);
            return Err(StoreError::Corrupt(format!(
                "starting the change sender: {e}"
            )));
        }
        Ok(Some(ChangeFeed {
            replica,
            outbox,
            shared,
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
    connect: &crate::tls::PgConnect,
    replica: &str,
    shared: &Shared,
    replies: &mpsc::Sender<Outgoing>,
    on_change: &dyn Fn(Change),
) {
    let mut failures = 0;
    // Whether changes may have gone unheard since the last connection.
    let mut missed = false;
    // When each other replica was last heard.
    let mut replicas: HashMap<String, i64> = HashMap::new();
    while !shared.stop.load(Ordering::Acquire) {
        let connected = connect.connect().and_then(|mut client| {
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
        shared.listening.store(true, Ordering::Release);
        if missed {
            on_change(Change::All);
        }
        while !shared.stop.load(Ordering::Acquire) && !client.is_closed() {
            let mut notifications = client.notifications();
            let mut heard = notifications.timeout_iter(STOP_CHECK);
            // Quiet for a while (or closed: checked above), or failed.
            let drained = drain(
                &mut heard,
                |payload| {
                    let Some((from, heard)) = parse(payload, replica) else {
                        return;
                    };
                    let now = now_ms();
                    shared.others_heard.store(now, Ordering::Release);
                    // Replicas not heard for a while are forgotten (each
                    // restart is a new name).
                    replicas.retain(|_, t| now - *t < ms(PRESENCE));
                    let last = replicas.insert(from.to_owned(), now);
                    match heard {
                        Heard::Change(change) => on_change(change),
                        // A replica we had not heard from: tell it we are here,
                        // so it announces its changes to us from now on.
                        Heard::Hello if last.is_none_or(|t| now - t >= ms(PRESENCE)) => {
                            let _ = replies.send(Outgoing::Hello);
                        }
                        Heard::Hello => {}
                    }
                },
                &shared.stop,
            );
            if drained.is_err() {
                break;
            }
        }
        shared.listening.store(false, Ordering::Release);
        missed = true;
    }
}

/// Hands what `heard` brings to `each` until it is quiet, or fails;
/// nothing once the feed is dropped.
fn drain(
    heard: &mut postgres::notifications::TimeoutIter<'_>,
    mut each: impl FnMut(&str),
    stop: &AtomicBool,
) -> Result<(), postgres::Error> {
    while let Some(n) = heard.next()? {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        each(n.payload());
    }
    Ok(())
}

/// Sends what this replica announces, batched: everything queued while the
/// previous batch went out goes in one round trip (one simple-query string
/// of `pg_notify` calls, which PostgreSQL runs as one transaction and
/// delivers at its commit), duplicates dropped; and a hello at start and
/// every [`HELLO_EVERY`].
fn send(connect: &crate::tls::PgConnect, replica: &str, inbox: &mpsc::Receiver<Outgoing>) {
    let mut client: Option<postgres::Client> = None;
    let mut failures = 0;
    let mut first = Some(Outgoing::Hello);
    loop {
        let next = match first.take() {
            Some(hello) => hello,
            None => match inbox.recv_timeout(HELLO_EVERY) {
                Ok(outgoing) => outgoing,
                Err(mpsc::RecvTimeoutError::Timeout) => Outgoing::Hello,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
        };
        let mut batch = vec![plain(next)];
        for outgoing in inbox.try_iter().map(plain) {
            // A long backlog (the sender was backing off) becomes one
            // change of everything, below.
            if batch.len() > MAX_BATCH {
                batch.push(Outgoing::Change(Change::All));
            } else if !batch.contains(&outgoing) {
                batch.push(outgoing);
            }
        }
        if batch.contains(&Outgoing::Change(Change::All)) {
            let hello = batch.contains(&Outgoing::Hello);
            batch = vec![Outgoing::Change(Change::All)];
            if hello {
                batch.push(Outgoing::Hello);
            }
        }
        let sql: String = batch
            .iter()
            .map(|outgoing| {
                format!(
                    "SELECT pg_notify('{CHANNEL}', {});",
                    literal(&outgoing.payload(replica))
                )
            })
            .collect();
        let sent = (|| -> Result<(), postgres::Error> {
            let c = match client.as_mut() {
                Some(c) if !c.is_closed() => c,
                _ => client.insert(connect.connect()?),
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

/// The most announcements sent one by one in a batch.
const MAX_BATCH: usize = 64;

/// A run or org whose id is not plain (`[A-Za-z0-9._-]`) is announced as a
/// change of everything: payloads go into SQL text, and only plain ones do.
fn plain(outgoing: Outgoing) -> Outgoing {
    let is_plain = |id: &str| {
        !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    match outgoing {
        Outgoing::Change(Change::Run(id)) if !is_plain(&id) => Outgoing::Change(Change::All),
        Outgoing::Change(Change::Queue { org, environment })
            if !is_plain(&org) || !is_plain(&environment) =>
        {
            Outgoing::Change(Change::All)
        }
        Outgoing::Change(Change::Dial { run, conn, .. }) if !is_plain(&run) || !is_plain(&conn) => {
            Outgoing::Change(Change::All)
        }
        other => other,
    }
}

/// A URL as lower-case hex: plain, whatever it holds.
fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// `text` as an SQL string literal (quotes doubled).
pub(crate) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::{Change, Heard, Outgoing, literal, parse, plain};

    #[test]
    fn payloads_round_trip_and_our_own_are_ignored() {
        let run = Outgoing::Change(Change::Run("run-1".into()));
        assert_eq!(
            parse(&run.payload("a"), "b"),
            Some(("a", Heard::Change(Change::Run("run-1".into()))))
        );
        assert_eq!(
            parse(&Outgoing::Change(Change::All).payload("a"), "b"),
            Some(("a", Heard::Change(Change::All)))
        );
        assert_eq!(
            parse(&Outgoing::Hello.payload("a"), "b"),
            Some(("a", Heard::Hello))
        );
        let queue = Change::Queue {
            org: "org_1".into(),
            environment: "prod".into(),
        };
        assert_eq!(
            parse(&Outgoing::Change(queue.clone()).payload("a"), "b"),
            Some(("a", Heard::Change(queue)))
        );
        let dial = Change::Dial {
            run: "run-1".into(),
            conn: "0f".into(),
            port: 8000,
            via: "https://replica-1.internal:8443/x y".into(),
        };
        let said = plain(Outgoing::Change(dial.clone())).payload("a");
        assert!(
            said.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b" _-.".contains(&b))
        );
        assert_eq!(parse(&said, "b"), Some(("a", Heard::Change(dial))));
        for bad in [
            "a dial r c 8000",
            "a dial r c port 68",
            "a dial r c 8000 6",
            "a dial r c 8000 zz",
            "a dial r c 8000 68 x",
        ] {
            assert_eq!(parse(bad, "b"), None, "{bad}");
        }
        assert_eq!(parse(&run.payload("a"), "a"), None);
        for bad in [
            "",
            "a",
            "a run ",
            "a queue ",
            "a queue o",
            "a queue o ",
            "a walk x",
            " *",
        ] {
            assert_eq!(parse(bad, "b"), None, "{bad:?}");
        }
    }

    #[test]
    fn only_plain_run_ids_reach_the_sql_text() {
        assert_eq!(literal("ab12 run r-1.x_y"), "'ab12 run r-1.x_y'");
        let run = |id: &str| Outgoing::Change(Change::Run(id.into()));
        assert_eq!(plain(run("r-1")), run("r-1"));
        assert_eq!(plain(Outgoing::Hello), Outgoing::Hello);
        let queue = |org: &str, environment: &str| {
            Outgoing::Change(Change::Queue {
                org: org.into(),
                environment: environment.into(),
            })
        };
        assert_eq!(plain(queue("org_1", "prod")), queue("org_1", "prod"));
        for odd in ["", "a'b", "a\\b", "a b", "a;b"] {
            assert_eq!(plain(run(odd)), Outgoing::Change(Change::All), "{odd:?}");
            assert_eq!(plain(queue(odd, "prod")), Outgoing::Change(Change::All));
            assert_eq!(plain(queue("org_1", odd)), Outgoing::Change(Change::All));
        }
    }
}
