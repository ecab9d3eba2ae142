//! Cross-replica wake-ups: two stores on one PostgreSQL database (two
//! replicas) hear each other's changes over LISTEN/NOTIFY, never their
//! own; SQLite has no feed.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use moat_store::{Change, ChangeFeed, Store, TempPostgres};

/// Long enough for a loaded machine; a liveness bound, not a speed claim.
const PATIENCE: Duration = Duration::from_secs(20);

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

fn until_listening(feed: &ChangeFeed) {
    let start = Instant::now();
    while !feed.listening() {
        assert!(start.elapsed() < PATIENCE, "the listener never connected");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn replicas_hear_each_others_changes_and_not_their_own() {
    let pg = TempPostgres::create().expect(
        "PostgreSQL is needed: bash tests/suite.sh starts a throwaway one \
         (set MOAT_TEST_POSTGRES to a libpq key=value string to use another server)",
    );
    let (_a, feed_a, heard_a) = replica(&pg.url);
    let (_b, feed_b, heard_b) = replica(&pg.url);
    assert_ne!(feed_a.replica(), feed_b.replica());
    until_listening(&feed_a);
    until_listening(&feed_b);

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
    // Each has heard exactly the other's one change, nothing of its own.
    assert!(heard_a.recv_timeout(Duration::from_millis(500)).is_err());
    assert!(heard_b.try_recv().is_err());

    // A dropped feed stops listening; the other goes on.
    drop(feed_a);
    feed_b.publish(Change::Run("run-2".into()));
    assert!(
        heard_a.recv_timeout(Duration::from_secs(3)).is_err(),
        "a dropped feed still delivers"
    );
}

#[test]
fn sqlite_has_no_feed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store =
        Store::open(&format!("sqlite:{}", dir.path().join("moat.db").display())).expect("store");
    assert!(store.change_feed(|_| {}).expect("no error").is_none());
}
