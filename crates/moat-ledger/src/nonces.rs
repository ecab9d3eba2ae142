//! The capabilities this ledger recorded as granted, by nonce, while they
//! could still verify: a capability is good for one use, across restarts
//! of a shell and across the shells of one runner that share a ledger.
//!
//! Kept beside the events, in the same transaction as the
//! `capability.granted` event that names the nonce. A shell used to find
//! them at start by reading back the last minutes of events; under load
//! that was hundreds of thousands of events for every run's shell.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use moat_core::{Event, EventType};
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::LedgerError;

const TABLE: &str = "CREATE TABLE IF NOT EXISTS capability_nonces (
    nonce       TEXT PRIMARY KEY,
    expires_ms  INTEGER NOT NULL
)";

/// How long past its expiry a nonce is kept: a capability verifies up to
/// its expiry plus the clock skew allowed.
const KEEP: Duration = moat_core::capability::CLOCK_SKEW;

fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The nonce and expiry a `capability.granted` event names.
fn granted(event: &Event) -> Option<(&str, i64)> {
    if event.event_type != EventType::CapabilityGranted {
        return None;
    }
    let capability = &event.data["capability"];
    let nonce = capability["nonce"].as_str()?;
    let expires = moat_core::time::parse_rfc3339(capability["expiresAt"].as_str()?).ok()?;
    Some((nonce, ms(expires)))
}

/// Creates the table; a ledger that predates it gets the nonces of its
/// recent `capability.granted` events, newest first, until they expired.
pub(crate) fn open(conn: &Connection) -> Result<(), LedgerError> {
    let existed = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'capability_nonces'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    conn.execute(TABLE, [])?;
    if existed {
        return Ok(());
    }
    let oldest = ms(SystemTime::now()).saturating_sub(i64::try_from(KEEP.as_millis()).unwrap_or(0));
    let mut stmt = conn.prepare(
        "SELECT body FROM events WHERE event_type = 'capability.granted' ORDER BY seq DESC",
    )?;
    let mut rows = stmt.query([])?;
    let mut insert = conn
        .prepare("INSERT OR IGNORE INTO capability_nonces (nonce, expires_ms) VALUES (?1, ?2)")?;
    while let Some(row) = rows.next()? {
        let body: Vec<u8> = row.get(0)?;
        let Ok(event) = serde_json::from_slice::<Event>(&body) else {
            continue;
        };
        let Some((nonce, expires)) = granted(&event) else {
            continue;
        };
        // Capabilities live a minute: one that expired this long ago is
        // older than every capability that could still verify.
        if expires < oldest.saturating_sub(600_000) {
            break;
        }
        if expires >= oldest {
            insert.execute(params![nonce, expires])?;
        }
    }
    Ok(())
}

/// Records the nonce of each `capability.granted` event among `events`.
pub(crate) fn record(tx: &Transaction<'_>, events: &[Event]) -> Result<(), LedgerError> {
    for (nonce, expires) in events.iter().filter_map(granted) {
        tx.prepare_cached(
            "INSERT OR IGNORE INTO capability_nonces (nonce, expires_ms) VALUES (?1, ?2)",
        )?
        .execute(params![nonce, expires])?;
    }
    Ok(())
}

impl crate::Ledger {
    /// Whether a capability with this nonce was recorded as granted.
    pub fn capability_used(&self, nonce: &str) -> Result<bool, LedgerError> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM capability_nonces WHERE nonce = ?1")?
            .query_row(params![nonce], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// Forgets the nonces of capabilities that can no longer verify at `now`.
    pub fn prune_capability_nonces(&self, now: SystemTime) -> Result<(), LedgerError> {
        let before = ms(now).saturating_sub(i64::try_from(KEEP.as_millis()).unwrap_or(0));
        self.conn.execute(
            "DELETE FROM capability_nonces WHERE expires_ms < ?1",
            params![before],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Ledger;

    fn granted_event(nonce: &str, expires: SystemTime) -> Event {
        Event {
            event_type: EventType::CapabilityGranted,
            at: moat_core::time::now_stamp(),
            run_id: "r".into(),
            op_id: Some("1".into()),
            correlation_id: None,
            data: serde_json::json!({"capability": {
                "nonce": nonce,
                "expiresAt": moat_core::time::stamp(expires),
            }}),
        }
    }

    #[test]
    fn a_nonce_granted_by_one_shell_is_known_to_another_already_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut first = Ledger::open(&path).unwrap();
        let second = Ledger::open(&path).unwrap();
        let soon = SystemTime::now() + Duration::from_secs(30);
        assert!(!second.capability_used("n1").unwrap());
        first.append(&[granted_event("n1", soon)]).unwrap();
        assert!(second.capability_used("n1").unwrap());
        assert!(!second.capability_used("n2").unwrap());
        // Pruned once it can no longer verify, not before.
        second.prune_capability_nonces(SystemTime::now()).unwrap();
        assert!(second.capability_used("n1").unwrap());
        second
            .prune_capability_nonces(soon + KEEP + Duration::from_secs(1))
            .unwrap();
        assert!(!second.capability_used("n1").unwrap());
    }

    #[test]
    fn a_ledger_from_before_the_table_gets_its_live_nonces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let soon = SystemTime::now() + Duration::from_secs(30);
        let past = SystemTime::now() - Duration::from_secs(3600);
        {
            let mut ledger = Ledger::open(&path).unwrap();
            ledger
                .append(&[granted_event("old", past), granted_event("live", soon)])
                .unwrap();
            ledger
                .connection()
                .execute_batch("DROP TABLE capability_nonces")
                .unwrap();
        }
        let ledger = Ledger::open(&path).unwrap();
        assert!(ledger.capability_used("live").unwrap());
        assert!(!ledger.capability_used("old").unwrap());
    }
}
