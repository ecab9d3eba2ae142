//! Approval requests: an operation a policy marked `@approval("required")`
//! waits, paused, until a person approves or denies it, or until its
//! request expires (then it fails closed). The request, its resolution and
//! who resolved it are rows here and events in the ledger, written in one
//! transaction.

use moat_core::Event;

use crate::ops::OpState;
use crate::{Row, Store, StoreError, Tx, events};

/// Where an approval request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalState {
    Pending,
    Approved,
    Denied,
    Expired,
}

impl ApprovalState {
    pub const ALL: [ApprovalState; 4] = [
        ApprovalState::Pending,
        ApprovalState::Approved,
        ApprovalState::Denied,
        ApprovalState::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<ApprovalState> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// An approval request as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRow {
    pub id: String,
    pub org_id: String,
    pub run_id: String,
    pub op_id: String,
    pub state: ApprovalState,
    /// The policy rule (its `@id`) that asked for the approval.
    pub rule: String,
    /// `low`, `medium`, `high` or `critical` (the rule's `@risk`).
    pub risk: String,
    /// What the approver sees: operation, resource, size, network, arguments.
    pub summary: serde_json::Value,
    pub requested_ms: i64,
    pub expires_ms: i64,
    pub resolved_ms: Option<i64>,
    /// Who resolved it (a token's fingerprint), or `None` if it expired.
    pub resolved_by: Option<String>,
    pub reason: Option<String>,
}

const COLUMNS: &str = "id, org_id, run_id, op_id, state, rule, risk, summary, requested_ms, \
                       expires_ms, resolved_ms, resolved_by, reason";

fn decode(row: &Row) -> Result<ApprovalRow, StoreError> {
    let state = row.text("state")?;
    Ok(ApprovalRow {
        id: row.text("id")?,
        org_id: row.text("org_id")?,
        run_id: row.text("run_id")?,
        op_id: row.text("op_id")?,
        state: ApprovalState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("approval state {state:?}")))?,
        rule: row.text("rule")?,
        risk: row.text("risk")?,
        summary: serde_json::from_str(&row.text("summary")?)
            .map_err(|e| StoreError::Corrupt(format!("approval summary: {e}")))?,
        requested_ms: row.int("requested_ms")?,
        expires_ms: row.int("expires_ms")?,
        resolved_ms: row.opt_int("resolved_ms")?,
        resolved_by: row.opt_text("resolved_by")?,
        reason: row.opt_text("reason")?,
    })
}

/// The request an operation's decision opens (recorded with the operation).
#[derive(Clone, Copy)]
pub struct NewApproval<'a> {
    pub id: &'a str,
    pub rule: &'a str,
    pub risk: &'a str,
    pub summary: &'a serde_json::Value,
    pub expires_ms: i64,
}

pub(super) fn insert(
    tx: &mut dyn Tx,
    org: &str,
    run: &str,
    op: &str,
    approval: &NewApproval<'_>,
    now: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO approvals (id, org_id, run_id, op_id, state, rule, risk, summary, requested_ms, expires_ms)
         VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)",
        &[
            approval.id.into(),
            org.into(),
            run.into(),
            op.into(),
            approval.rule.into(),
            approval.risk.into(),
            approval.summary.to_string().into(),
            now.into(),
            approval.expires_ms.into(),
        ],
    )?;
    Ok(())
}

/// How a pending request is settled.
pub struct Settlement<'a> {
    /// `Approved`, `Denied` or `Expired`.
    pub state: ApprovalState,
    pub by: Option<&'a str>,
    pub reason: Option<&'a str>,
    /// The operation's result when it will not run (denied or expired).
    pub op_result: Option<&'a serde_json::Value>,
    /// `approval.granted`, `.denied` or `.expired`, with its data.
    pub events: &'a [Event],
    /// For an export's approval: what becomes of the held file.
    pub export: Option<crate::HeldOutcome<'a>>,
}

/// What settling did.
#[derive(Debug)]
pub enum Settled {
    /// No such request in this org.
    Missing,
    /// Settled before (by someone else, or by expiry): nothing changed.
    Already(ApprovalRow),
    /// Its time is up: only `Expired` may settle it now.
    Late(ApprovalRow),
    Done(ApprovalRow),
}

impl Store {
    /// The org's approval requests, newest first, optionally in one state.
    pub fn approvals(
        &self,
        org: &str,
        state: Option<ApprovalState>,
        limit: i64,
    ) -> Result<Vec<ApprovalRow>, StoreError> {
        self.read(|tx| {
            let rows = match state {
                Some(state) => tx.query(
                    &format!(
                        "SELECT {COLUMNS} FROM approvals WHERE org_id = ? AND state = ?
                         ORDER BY requested_ms DESC, id LIMIT ?"
                    ),
                    &[org.into(), state.as_str().into(), limit.into()],
                )?,
                None => tx.query(
                    &format!(
                        "SELECT {COLUMNS} FROM approvals WHERE org_id = ?
                         ORDER BY requested_ms DESC, id LIMIT ?"
                    ),
                    &[org.into(), limit.into()],
                )?,
            };
            rows.iter().map(decode).collect()
        })
    }

    /// One approval request of the org.
    pub fn approval(&self, org: &str, id: &str) -> Result<Option<ApprovalRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                &format!("SELECT {COLUMNS} FROM approvals WHERE org_id = ? AND id = ?"),
                &[org.into(), id.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// Pending requests whose time is up (for the sweep), any org.
    pub fn due_approvals(&self, now: i64, limit: i64) -> Result<Vec<ApprovalRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM approvals WHERE state = 'pending' AND expires_ms <= ?
                     ORDER BY expires_ms LIMIT ?"
                ),
                &[now.into(), limit.into()],
            )?
            .iter()
            .map(decode)
            .collect()
        })
    }

    /// Settles a pending request and moves its operation on, once: approved
    /// → queued for the runner; denied or expired → `denied`.
    pub fn settle_approval(
        &self,
        org: &str,
        id: &str,
        settlement: &Settlement<'_>,
        now: i64,
    ) -> Result<Settled, StoreError> {
        self.tx(|tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM approvals WHERE org_id = ? AND id = ?{}",
                tx.for_update()
            );
            let Some(row) = tx.query_one(&sql, &[org.into(), id.into()])? else {
                return Ok(Settled::Missing);
            };
            let mut approval = decode(&row)?;
            if approval.state != ApprovalState::Pending {
                return Ok(Settled::Already(approval));
            }
            if approval.expires_ms <= now && settlement.state != ApprovalState::Expired {
                return Ok(Settled::Late(approval));
            }
            tx.execute(
                "UPDATE approvals SET state = ?, resolved_ms = ?, resolved_by = ?, reason = ?
                 WHERE id = ?",
                &[
                    settlement.state.as_str().into(),
                    now.into(),
                    settlement.by.into(),
                    settlement.reason.into(),
                    id.into(),
                ],
            )?;
            let op_state = match settlement.state {
                ApprovalState::Approved => OpState::Queued,
                // Fails closed: an expired request is a denial.
                ApprovalState::Denied | ApprovalState::Expired | ApprovalState::Pending => {
                    OpState::Denied
                }
            };
            tx.execute(
                "UPDATE ops SET state = ?, result = COALESCE(?, result), updated_ms = ?
                 WHERE run_id = ? AND id = ? AND state = 'pending_approval'",
                &[
                    op_state.as_str().into(),
                    settlement.op_result.map(|r| r.to_string()).into(),
                    now.into(),
                    approval.run_id.as_str().into(),
                    approval.op_id.as_str().into(),
                ],
            )?;
            if let Some(outcome) = settlement.export {
                crate::held::settle(tx, org, id, outcome, now)?;
            }
            events::append(tx, org, settlement.events)?;
            approval.state = settlement.state;
            approval.resolved_ms = Some(now);
            approval.resolved_by = settlement.by.map(str::to_owned);
            approval.reason = settlement.reason.map(str::to_owned);
            Ok(Settled::Done(approval))
        })
    }
}
