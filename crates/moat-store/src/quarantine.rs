//! Files the export boundary rejected: what was judged and why, never the
//! bytes. Recorded from an op's `artifact.rejected` events in the
//! transaction that records them, so the two cannot disagree.

use moat_core::event_data::ArtifactRejected;
use moat_core::exports::Rejection;
use moat_core::{Event, EventData, EventType};

use crate::{Row, Store, StoreError, Tx};

/// A rejected file, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct QuarantineRow {
    pub run_id: String,
    pub op_id: String,
    /// Relative to the run's workspace.
    pub path: String,
    /// Of the content judged; absent when it was refused unread.
    pub sha256: Option<String>,
    pub size: i64,
    pub reasons: Vec<Rejection>,
    pub created_ms: i64,
}

const COLUMNS: &str = "run_id, op_id, path, sha256, size, reasons, created_ms";

fn decode(row: &Row) -> Result<QuarantineRow, StoreError> {
    let reasons = row.text("reasons")?;
    Ok(QuarantineRow {
        run_id: row.text("run_id")?,
        op_id: row.text("op_id")?,
        path: row.text("path")?,
        sha256: row.opt_text("sha256")?,
        size: row.int("size")?,
        reasons: serde_json::from_str(&reasons)
            .map_err(|e| StoreError::Corrupt(format!("quarantine reasons: {e}")))?,
        created_ms: row.int("created_ms")?,
    })
}

/// Whether [`record`] would write anything for `events`.
pub(super) fn records_any(events: &[Event]) -> bool {
    events
        .iter()
        .any(|e| e.event_type == EventType::ArtifactRejected)
}

/// Records the files `events` reject, in `tx`.
pub(super) fn record(
    tx: &mut dyn Tx,
    org: &str,
    run: &str,
    op: &str,
    events: &[Event],
    now: i64,
) -> Result<(), StoreError> {
    for e in events {
        if e.event_type != EventType::ArtifactRejected {
            continue;
        }
        // Checked when reported; one the scrub made unreadable is still
        // in the ledger, only not here.
        let Ok(EventData::ArtifactRejected(ArtifactRejected {
            path,
            size,
            sha256,
            reasons,
            ..
        })) = EventData::parse(e.event_type, &e.data)
        else {
            continue;
        };
        let reasons = serde_json::to_string(&reasons)
            .map_err(|err| StoreError::Corrupt(format!("quarantine reasons: {err}")))?;
        insert(
            tx,
            org,
            run,
            op,
            &path,
            sha256.as_deref(),
            i64::try_from(size).unwrap_or(i64::MAX),
            &reasons,
            now,
        )?;
    }
    Ok(())
}

/// One rejected file (`reasons`: JSON), in `tx`.
#[allow(clippy::too_many_arguments)]
pub(super) fn insert(
    tx: &mut dyn Tx,
    org: &str,
    run: &str,
    op: &str,
    path: &str,
    sha256: Option<&str>,
    size: i64,
    reasons: &str,
    now: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO quarantine (org_id, run_id, op_id, path, sha256, size, reasons, created_ms)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (run_id, op_id, path) DO UPDATE
         SET sha256 = excluded.sha256, size = excluded.size, reasons = excluded.reasons",
        &[
            org.into(),
            run.into(),
            op.into(),
            path.into(),
            sha256.into(),
            size.into(),
            reasons.into(),
            now.into(),
        ],
    )?;
    Ok(())
}

impl Store {
    /// The newest rejection of content `sha256` among the org's runs.
    pub fn quarantined(
        &self,
        org: &str,
        sha256: &str,
    ) -> Result<Option<QuarantineRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                &format!(
                    "SELECT {COLUMNS} FROM quarantine WHERE org_id = ? AND sha256 = ?
                     ORDER BY created_ms DESC, run_id, op_id, path LIMIT 1"
                ),
                &[org.into(), sha256.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// The run's rejected files, oldest first.
    pub fn run_quarantine(&self, org: &str, run: &str) -> Result<Vec<QuarantineRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM quarantine WHERE org_id = ? AND run_id = ?
                     ORDER BY created_ms, op_id, path"
                ),
                &[org.into(), run.into()],
            )?
            .iter()
            .map(decode)
            .collect()
        })
    }
}
