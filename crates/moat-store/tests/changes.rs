//! Cross-replica wake-ups: two stores on one PostgreSQL database (two
//! replicas) hear each other's changes over LISTEN/NOTIFY, never their
//! own; a lone replica announces nothing; SQLite has no feed.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use moat_store::{Change, ChangeFeed, Store, TempPostgres};
use postgres::fallible_iterator::FallibleIterator as _;

/// Longer than a hello period on a loaded machine; a liveness bound, not a
/// speed claim.
const PATIENCE: Duration = Duration::from_secs(30);

fn pg() -> TempPostgres {
    TempPostgres::create().expect(
        "PostgreSQL is needed: bash tests/suite.sh starts a throwaway one \
         (set MOAT_TEST_POSTGRES to a libpq key=value string to use another server)",
    )
}

fn replica(url: &str) -> (Store, ChangeFeed, mpsc::Receiver<Change>) {
    let store = Store::open(url).expect("store");
    let (tx, rx) = mpsc::channel();
    let feed = store
        .change_feed(move |change| {
            let _ = tx.send(change);
        })
        .expect("feed")
        .expect("PostgreSQL has a feed");
    (store, feed, rx)
}

fn until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every payload on the channel, from a connection of the test's own.
fn tap(url: &str) -> postgres::Client {
    let mut client = url
        .parse::<postgres::Config>()
        .unwrap()
        .connect(postgres::NoTls)
        .unwrap();
    client.batch_execute("LISTEN moat_changes").unwrap();
    client
}

fn heard(tap: &mut postgres::Client, wait: Duration) -> Vec<String> {
    let mut notifications = tap.notifications();
    let mut iter = notifications.timeout_iter(wait);
    let mut out = Vec::new();
    while let Ok(Some(n)) = iter.next() {
        out.push(n.payload().to_owned());
    }
    out
}

#[test]
fn replicas_hear_each_others_changes_and_not_their_own() {
    let pg = pg();
    let (_a, feed_a, heard_a) = replica(&pg.url);
    let (_b, feed_b, heard_b) = replica(&pg.url);
    assert_ne!(feed_a.replica(), feed_b.replica());
    until("the listeners connect", || {
        feed_a.listening() && feed_b.listening()
    });
    until("the replicas hear each other's hello", || {
        feed_a.others_present() && feed_b.others_present()
    });

    feed_a.publish(Change::Run("run-1".into()));
    assert_eq!(
        heard_b.recv_timeout(PATIENCE).expect("b hears a"),
        Change::Run("run-1".into())
    );
    feed_b.publish(Change::All);
    assert_eq!(
        heard_a.recv_timeout(PATIENCE).expect("a hears b"),
        Change::All
    );
    let queued = Change::Queue {
        org: "org_1".into(),
        environment: "prod".into(),
    };
    feed_a.publish(queued.clone());
    assert_eq!(heard_b.recv_timeout(PATIENCE).expect("b hears a"), queued);
    // Each has heard exactly the other's changes, nothing of its own.
    assert!(heard_a.recv_timeout(Duration::from_millis(500)).is_err());
    assert!(heard_b.try_recv().is_err());

    // A dropped feed stops delivering; the other goes on.
    drop(feed_a);
    feed_b.publish(Change::Run("run-2".into()));
    assert!(
        heard_a.recv_timeout(Duration::from_secs(3)).is_err(),
        "a dropped feed still delivers"
    );
}

#[test]
fn a_lone_replica_announces_nothing_until_another_says_hello() {
    let pg = pg();
    let mut tap = tap(&pg.url);
    let (_a, feed_a, _heard_a) = replica(&pg.url);
    until("the listener connects", || feed_a.listening());
    assert!(!feed_a.others_present());
    feed_a.publish(Change::Run("alone".into()));
    let said = heard(&mut tap, Duration::from_secs(1));
    assert!(
        said.iter().all(|p| p.ends_with(" hello")),
        "a lone replica announced a change: {said:?}"
    );

    let (_b, feed_b, _heard_b) = replica(&pg.url);
    until("a hears b's hello", || feed_a.others_present());
    feed_a.publish(Change::Run("together".into()));
    let start = Instant::now();
    let mut said = Vec::new();
    while !said.iter().any(|p: &String| p.ends_with(" run together")) {
        assert!(start.elapsed() < PATIENCE, "never announced: {said:?}");
        said.extend(heard(&mut tap, Duration::from_millis(200)));
    }
    drop(feed_b);
}

#[test]
fn sqlite_has_no_feed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store =
        Store::open(&format!("sqlite:{}", dir.path().join("moat.db").display())).expect("store");
    assert!(store.change_feed(|_| {}).expect("no error").is_none());
}
