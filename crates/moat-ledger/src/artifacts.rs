//! Records of content-addressed artifacts.

use rusqlite::params;
use serde::{Deserialize, Serialize};

use crate::{Ledger, LedgerError};

/// One artifact: a file stored under its SHA-256 in the state directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactRecord {
    pub sha256: String,
    pub size: u64,
    /// `file`, `stdout`, `stderr`, ...
    pub kind: String,
    /// Human label: the workspace path, or the program and stream.
    pub label: String,
    /// `none` until redaction exists.
    pub redaction: String,
    pub run_id: String,
    pub op_id: String,
    pub created_at: String,
}

pub(crate) fn insert(
    conn: &rusqlite::Connection,
    record: &ArtifactRecord,
) -> Result<(), LedgerError> {
    conn.execute(
        "INSERT INTO artifacts (sha256, size, kind, label, redaction, run_id, op_id, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            record.sha256,
            record.size as i64,
            record.kind,
            record.label,
            record.redaction,
            record.run_id,
            record.op_id,
            record.created_at
        ],
    )?;
    Ok(())
}

impl Ledger {
    pub fn record_artifact(&mut self, record: &ArtifactRecord) -> Result<(), LedgerError> {
        insert(&self.conn, record)
    }

    pub fn artifacts_of_run(&self, run_id: &str) -> Result<Vec<ArtifactRecord>, LedgerError> {
        let mut stmt = self.conn.prepare(
            "SELECT sha256, size, kind, label, redaction, run_id, op_id, created_at
             FROM artifacts WHERE run_id = ?1 ORDER BY rowid",
        )?;
        let rows = stmt.query_map(params![run_id], |r| {
            Ok(ArtifactRecord {
                sha256: r.get(0)?,
                size: r.get::<_, i64>(1)? as u64,
                kind: r.get(2)?,
                label: r.get(3)?,
                redaction: r.get(4)?,
                run_id: r.get(5)?,
                op_id: r.get(6)?,
                created_at: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
