//! Files that passed the export rules and wait for a person: the policy
//! asked for an approval before they leave. Their bytes are stored (so the
//! approval does not depend on the runner, or on the run still existing),
//! but no artifact names them, so they cannot be downloaded; settling the
//! approval promotes them (an artifact) or rejects them (quarantine), in
//! the transaction that settles it.

use moat_core::exports::Rejection;

use crate::approvals::NewApproval;
use crate::{Row, Store, StoreError, Tx};

/// A file to hold, with its bytes and the approval it waits for.
#[derive(Debug, Clone)]
pub struct HeldExport {
    pub path: String,
    pub sha256: String,
    pub exported_as: String,
    pub data: Vec<u8>,
    pub approval_id: String,
    pub rule: String,
    pub risk: String,
    /// What the approver sees (an `ApprovalSummary`).
    pub summary: serde_json::Value,
    pub expires_ms: i64,
}

/// A held file, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldRow {
    pub approval_id: String,
    pub run_id: String,
    pub op_id: String,
    pub path: String,
    pub sha256: String,
    pub size: i64,
    pub exported_as: String,
    pub created_ms: i64,
}

/// How settling an export's approval ends for its file.
#[derive(Debug, Clone, Copy)]
pub enum HeldOutcome<'a> {
    /// An artifact of the op, downloadable, its bytes kept there (with
    /// `Kept::Outputs`, the caller stored them in the output store first,
    /// and they leave `blobs`).
    Promote(crate::Kept),
    /// Quarantined, with these reasons.
    Reject(&'a [Rejection]),
}

const COLUMNS: &str = "approval_id, run_id, op_id, path, sha256, size, exported_as, created_ms";

fn decode(row: &Row) -> Result<HeldRow, StoreError> {
    Ok(HeldRow {
        approval_id: row.text("approval_id")?,
        run_id: row.text("run_id")?,
        op_id: row.text("op_id")?,
        path: row.text("path")?,
        sha256: row.text("sha256")?,
        size: row.int("size")?,
        exported_as: row.text("exported_as")?,
        created_ms: row.int("created_ms")?,
    })
}

/// Stores `held`'s bytes, records it and opens its approval, in `tx`.
pub(super) fn hold(
    tx: &mut dyn Tx,
    org: &str,
    run: &str,
    op: &str,
    held: &HeldExport,
    now: i64,
) -> Result<(), StoreError> {
    let sha = moat_core::hash::sha256_hex(&held.data);
    if sha != held.sha256 {
        return Err(StoreError::Corrupt(format!(
            "held export {:?} does not hash to its name",
            held.path
        )));
    }
    let size = i64::try_from(held.data.len()).unwrap_or(i64::MAX);
    tx.execute(
        "INSERT INTO blobs (sha256, size, data) VALUES (?, ?, ?) ON CONFLICT (sha256) DO NOTHING",
        &[sha.as_str().into(), size.into(), held.data.clone().into()],
    )?;
    tx.execute(
        "INSERT INTO held_exports (approval_id, org_id, run_id, op_id, path, sha256, size, exported_as, created_ms)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        &[
            held.approval_id.as_str().into(),
            org.into(),
            run.into(),
            op.into(),
            held.path.as_str().into(),
            sha.into(),
            size.into(),
            held.exported_as.as_str().into(),
            now.into(),
        ],
    )?;
    crate::approvals::insert(
        tx,
        org,
        run,
        op,
        &NewApproval {
            id: &held.approval_id,
            rule: &held.rule,
            risk: &held.risk,
            summary: &held.summary,
            expires_ms: held.expires_ms,
        },
        now,
    )
}

/// Promotes or rejects the file held for `approval`, in `tx`; nothing if
/// none is (an operation's approval).
pub(super) fn settle(
    tx: &mut dyn Tx,
    org: &str,
    approval: &str,
    outcome: HeldOutcome<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let Some(row) = tx.query_one(
        &format!("SELECT {COLUMNS} FROM held_exports WHERE org_id = ? AND approval_id = ?"),
        &[org.into(), approval.into()],
    )?
    else {
        return Ok(());
    };
    let held = decode(&row)?;
    match outcome {
        HeldOutcome::Promote(kept) => {
            if kept == crate::Kept::Outputs {
                crate::objects::insert_output(tx, &held.sha256, held.size, now)?;
            }
            tx.execute(
                "INSERT INTO artifacts (org_id, run_id, op_id, sha256, size, kind, label, created_ms)
                 VALUES (?, ?, ?, ?, ?, 'export', ?, ?) ON CONFLICT DO NOTHING",
                &[
                    org.into(),
                    held.run_id.as_str().into(),
                    held.op_id.as_str().into(),
                    held.sha256.as_str().into(),
                    held.size.into(),
                    held.path.as_str().into(),
                    now.into(),
                ],
            )?;
        }
        HeldOutcome::Reject(reasons) => {
            let reasons = serde_json::to_string(reasons)
                .map_err(|e| StoreError::Corrupt(format!("quarantine reasons: {e}")))?;
            crate::quarantine::insert(
                tx,
                org,
                &held.run_id,
                &held.op_id,
                &held.path,
                Some(&held.sha256),
                held.size,
                &reasons,
                now,
            )?;
        }
    }
    tx.execute(
        "DELETE FROM held_exports WHERE approval_id = ?",
        &[approval.into()],
    )?;
    match outcome {
        HeldOutcome::Reject(_) => {
            // A rejected file's bytes are not kept, unless something else
            // (an artifact, an input, another held file) is the same bytes.
            tx.execute(
                "DELETE FROM blobs WHERE sha256 = ?
                   AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.sha256 = blobs.sha256)
                   AND NOT EXISTS (SELECT 1 FROM held_exports h WHERE h.sha256 = blobs.sha256)",
                &[held.sha256.as_str().into()],
            )?;
        }
        HeldOutcome::Promote(crate::Kept::Outputs) => {
            // Promoted into the output store: the database keeps the bytes
            // only for what else is the same bytes (an input, a stdout
            // capture, another held file); promoted files are read from
            // the store.
            tx.execute(
                "DELETE FROM blobs WHERE sha256 = ?
                   AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.sha256 = blobs.sha256 AND a.kind <> 'export')
                   AND NOT EXISTS (SELECT 1 FROM held_exports h WHERE h.sha256 = blobs.sha256)",
                &[held.sha256.as_str().into()],
            )?;
        }
        HeldOutcome::Promote(crate::Kept::Database) => {}
    }
    Ok(())
}

impl Store {
    /// The newest file of content `sha256` held for an approval in the org.
    pub fn held_export(&self, org: &str, sha256: &str) -> Result<Option<HeldRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                &format!(
                    "SELECT {COLUMNS} FROM held_exports WHERE org_id = ? AND sha256 = ?
                     ORDER BY created_ms DESC LIMIT 1"
                ),
                &[org.into(), sha256.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// The file held for approval `approval` of the org, if it still is.
    pub fn held_for(&self, org: &str, approval: &str) -> Result<Option<HeldRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                &format!("SELECT {COLUMNS} FROM held_exports WHERE org_id = ? AND approval_id = ?"),
                &[org.into(), approval.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// The whole of the file held for approval `approval` of the org, if it
    /// still is (to stage it in the output store before it is promoted).
    pub fn held_bytes(&self, org: &str, approval: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                "SELECT b.data FROM blobs b JOIN held_exports h ON h.sha256 = b.sha256
                 WHERE h.org_id = ? AND h.approval_id = ?",
                &[org.into(), approval.into()],
            )?
            .map(|r| r.blob("data"))
            .transpose()
        })
    }

    /// At most the first `max` bytes held for approval `approval` of the
    /// org (what the Inspector previews), if it is still held: never the
    /// whole of a large file.
    pub fn held_prefix(
        &self,
        org: &str,
        approval: &str,
        max: usize,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.read(|tx| {
            let sql = match tx.dialect() {
                crate::Dialect::Sqlite => {
                    "SELECT substr(b.data, 1, ?) AS head FROM blobs b
                     JOIN held_exports h ON h.sha256 = b.sha256
                     WHERE h.org_id = ? AND h.approval_id = ?"
                }
                crate::Dialect::Postgres => {
                    "SELECT substring(b.data from 1 for ?::int) AS head FROM blobs b
                     JOIN held_exports h ON h.sha256 = b.sha256
                     WHERE h.org_id = ? AND h.approval_id = ?"
                }
            };
            tx.query_one(sql, &[max.into(), org.into(), approval.into()])?
                .map(|r| r.blob("head"))
                .transpose()
        })
    }

    /// Whether an artifact of one of `kinds` names `sha256` in the org.
    pub fn artifact_of_kind(
        &self,
        org: &str,
        sha256: &str,
        kinds: &[&str],
    ) -> Result<bool, StoreError> {
        self.read(|tx| {
            for kind in kinds {
                let found = tx.query_one(
                    "SELECT 1 FROM artifacts WHERE org_id = ? AND sha256 = ? AND kind = ?",
                    &[org.into(), sha256.into(), (*kind).into()],
                )?;
                if found.is_some() {
                    return Ok(true);
                }
            }
            Ok(false)
        })
    }
}
