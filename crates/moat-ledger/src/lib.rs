//! The ledger: every event Moat records, append-only and hash-chained, in
//! one embedded SQLite file; plus the records of content-addressed artifacts.
//!
//! Each event is stored as its canonical JSON text with a sequence number,
//! the previous event's hash and its own hash:
//! `hash = sha256(prev_hash ‖ "\n" ‖ seq ‖ "\n" ‖ canonical_json(event))`.
//! [`Ledger::verify`] recomputes the chain and names the first event that
//! was edited, reordered or deleted; a separate head record catches the
//! deletion of the newest events. Appends are one transaction per batch with
//! `synchronous=FULL`: once [`Ledger::append`] returns, the events survive a
//! crash or power loss.
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

mod artifacts;
mod nonces;
mod verify;

use std::path::Path;

use moat_core::Event;
use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

pub use artifacts::ArtifactRecord;
pub use verify::{Verified, VerifyError, Walk};

/// The hash before the first event.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Errors of the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("event cannot be serialised: {0}")]
    Encode(String),
    #[error("stored event #{seq} is not valid JSON: {message}")]
    Decode { seq: i64, message: String },
}

/// An event as stored, with its place in the chain.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: i64,
    pub prev_hash: String,
    pub hash: String,
    pub event: Event,
}

impl StoredEvent {
    /// The JSON line `moat ledger tail` prints.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(&self.event).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert("seq".into(), self.seq.into());
            map.insert("prevHash".into(), self.prev_hash.clone().into());
            map.insert("hash".into(), self.hash.clone().into());
        }
        value
    }
}

/// The chain hash of one event.
pub fn chain_hash(prev_hash: &str, seq: i64, canonical: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev_hash.as_bytes());
    hasher.update(b"\n");
    hasher.update(seq.to_string().as_bytes());
    hasher.update(b"\n");
    hasher.update(canonical);
    hex::encode(hasher.finalize())
}

/// An open ledger.
pub struct Ledger {
    conn: Connection,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    seq        INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL,
    event_type TEXT NOT NULL,
    body       BLOB NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_run ON events (run_id, seq);
CREATE TABLE IF NOT EXISTS head (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  INTEGER NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS artifacts (
    sha256     TEXT NOT NULL,
    size       INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    label      TEXT NOT NULL,
    redaction  TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    op_id      TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS artifacts_by_run ON artifacts (run_id);
";

impl Ledger {
    /// Opens (creating if needed) the ledger at `path`.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        nonces::open(&conn)?;
        Ok(Ledger { conn })
    }

    fn head(&self) -> Result<(i64, String), LedgerError> {
        Ok(self
            .conn
            .query_row("SELECT seq, hash FROM head WHERE id = 1", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
            .unwrap_or((0, GENESIS.to_owned())))
    }

    /// Appends `events` in one durable transaction, chained after the head.
    pub fn append(&mut self, events: &[Event]) -> Result<Vec<StoredEvent>, LedgerError> {
        self.append_with_artifacts(events, &[])
    }

    /// Appends `events` and records `artifacts` in one durable transaction
    /// (one fsync for a whole batch of operations: group commit).
    pub fn append_with_artifacts(
        &mut self,
        events: &[Event],
        artifacts: &[ArtifactRecord],
    ) -> Result<Vec<StoredEvent>, LedgerError> {
        if events.is_empty() && artifacts.is_empty() {
            return Ok(Vec::new());
        }
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let (mut seq, mut prev) = tx
            .query_row("SELECT seq, hash FROM head WHERE id = 1", [], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .optional()?
            .unwrap_or((0, GENESIS.to_owned()));
        let mut stored = Vec::with_capacity(events.len());
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO events (seq, run_id, event_type, body, prev_hash, hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for event in events {
                seq += 1;
                let body = moat_core::hash::canonical_json(event)
                    .map_err(|e| LedgerError::Encode(e.to_string()))?;
                let hash = chain_hash(&prev, seq, &body);
                insert.execute(params![
                    seq,
                    event.run_id,
                    event.event_type.as_str(),
                    body,
                    prev,
                    hash
                ])?;
                stored.push(StoredEvent {
                    seq,
                    prev_hash: std::mem::replace(&mut prev, hash.clone()),
                    hash,
                    event: event.clone(),
                });
            }
        }
        for record in artifacts {
            artifacts::insert(&tx, record)?;
        }
        nonces::record(&tx, events)?;
        tx.execute(
            "INSERT INTO head (id, seq, hash) VALUES (1, ?1, ?2)
             ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
            params![seq, prev],
        )?;
        tx.commit()?;
        Ok(stored)
    }

    /// Events after `after_seq` (oldest first), optionally of one run, at most `limit`.
    pub fn events(
        &self,
        run_id: Option<&str>,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<StoredEvent>, LedgerError> {
        // Two statements, not `?2 IS NULL OR run_id = ?2`: SQLite cannot
        // take `events_by_run` for that, and walked every later event of
        // every run to find one run's (a runner's teardown, which asks
        // from the start, read the whole shells' ledger for each run).
        let Some(run_id) = run_id else {
            let mut stmt = self.conn.prepare_cached(
                "SELECT seq, body, prev_hash, hash FROM events
                 WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?;
            return read_events(&mut stmt, params![after_seq, limit]);
        };
        let mut stmt = self.conn.prepare_cached(EVENTS_OF_RUN)?;
        read_events(&mut stmt, params![run_id, after_seq, limit])
    }

    /// Events newest first: `limit` of them before `before_seq`.
    pub fn latest(&self, before_seq: i64, limit: i64) -> Result<Vec<StoredEvent>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, body, prev_hash, hash FROM events
             WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2",
        )?;
        read_events(&mut stmt, params![before_seq, limit])
    }

    /// Number of events and the head hash.
    pub fn summary(&self) -> Result<(i64, String), LedgerError> {
        self.head()
    }

    /// The underlying connection, for tests that tamper with the file.
    #[doc(hidden)]
    pub fn connection(&self) -> &Connection {
        &self.conn
    }
}

/// One run's events after a sequence number, through `events_by_run`.
const EVENTS_OF_RUN: &str = "SELECT seq, body, prev_hash, hash FROM events
     WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";

/// Rows of `seq, body, prev_hash, hash`, decoded.
fn read_events(
    stmt: &mut rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
) -> Result<Vec<StoredEvent>, LedgerError> {
    let rows = stmt.query_map(params, |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, Vec<u8>>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, body, prev_hash, hash) = row?;
        let event = serde_json::from_slice(&body).map_err(|e| LedgerError::Decode {
            seq,
            message: e.to_string(),
        })?;
        out.push(StoredEvent {
            seq,
            prev_hash,
            hash,
            event,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A run's events are found through its index, however many events
    /// other runs have: the plan SQLite chooses says so.
    #[test]
    fn one_runs_events_are_read_through_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
        let plan: Vec<String> = ledger
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {EVENTS_OF_RUN}"))
            .unwrap()
            .query_map(params!["run-1", 0, 10], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            plan,
            ["SEARCH events USING INDEX events_by_run (run_id=? AND seq>?)"],
            "{plan:?}"
        );
    }
}
