//! Operations of a run: decided by the control plane, queued, dispatched to
//! the runner holding the run, finished once with their result.

use moat_core::Event;

use crate::approvals::{self, NewApproval};
use crate::objects::{self, NewArtifact};
use crate::{Row, Store, StoreError, events};

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpState {
    /// Waiting for a person's approval (see `approvals`).
    PendingApproval,
    /// Allowed, waiting for the runner.
    Queued,
    /// Handed to the runner; waiting for its result.
    Dispatched,
    Succeeded,
    Failed,
    /// Refused by policy (never queued).
    Denied,
}

impl OpState {
    pub fn as_str(self) -> &'static str {
        match self {
            OpState::PendingApproval => "pending_approval",
            OpState::Queued => "queued",
            OpState::Dispatched => "dispatched",
            OpState::Succeeded => "succeeded",
            OpState::Failed => "failed",
            OpState::Denied => "denied",
        }
    }

    fn parse(text: &str) -> Option<OpState> {
        [
            OpState::PendingApproval,
            OpState::Queued,
            OpState::Dispatched,
            OpState::Succeeded,
            OpState::Failed,
            OpState::Denied,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }

    pub fn is_final(self) -> bool {
        matches!(self, OpState::Succeeded | OpState::Failed | OpState::Denied)
    }
}

/// An operation as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRow {
    pub run_id: String,
    pub id: String,
    pub n: i64,
    pub op: String,
    pub state: OpState,
    /// The envelope as the runner gets it (with its capability).
    pub envelope: serde_json::Value,
    pub decision: serde_json::Value,
    pub result: Option<serde_json::Value>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

const COLUMNS: &str =
    "run_id, id, n, op, state, envelope, decision, result, created_ms, updated_ms";

fn json(text: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn decode(row: &Row) -> Result<OpRow, StoreError> {
    let state = row.text("state")?;
    Ok(OpRow {
        run_id: row.text("run_id")?,
        id: row.text("id")?,
        n: row.int("n")?,
        op: row.text("op")?,
        state: OpState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("op state {state:?}")))?,
        envelope: json(&row.text("envelope")?, "op envelope")?,
        decision: json(&row.text("decision")?, "op decision")?,
        result: row
            .opt_text("result")?
            .map(|t| json(&t, "op result"))
            .transpose()?,
        created_ms: row.int("created_ms")?,
        updated_ms: row.int("updated_ms")?,
    })
}

/// A decided operation to record.
pub struct NewOp<'a> {
    pub org: &'a str,
    pub run: &'a str,
    pub id: &'a str,
    pub op: &'a str,
    pub state: OpState,
    pub envelope: &'a serde_json::Value,
    pub decision: &'a serde_json::Value,
    /// For a denied op, the error result the agent gets.
    pub result: Option<&'a serde_json::Value>,
    /// The decision's events (`capability.requested`, `.granted`/`.denied`,
    /// `approval.requested`).
    pub events: &'a [Event],
    /// The approval request a `PendingApproval` operation waits on.
    pub approval: Option<NewApproval<'a>>,
}

/// A dispatched operation decided again (see [`Store::redecide_op`]).
pub struct Redecided<'a> {
    pub org: &'a str,
    pub runner: &'a str,
    pub run: &'a str,
    pub id: &'a str,
    /// `Dispatched`, `PendingApproval` or `Denied`.
    pub state: OpState,
    pub decision: &'a serde_json::Value,
    pub result: Option<&'a serde_json::Value>,
    pub events: &'a [Event],
    pub approval: Option<NewApproval<'a>>,
}

/// A runner's result for an operation.
pub struct OpResult<'a> {
    pub org: &'a str,
    pub runner: &'a str,
    pub run: &'a str,
    pub op: &'a str,
    pub succeeded: bool,
    pub result: &'a serde_json::Value,
    /// The runner's own events for this operation (sandbox, artifacts...).
    pub events: &'a [Event],
    pub artifacts: &'a [NewArtifact],
    /// Files that passed the export rules and wait for an approval.
    pub held: &'a [crate::HeldExport],
    /// New heads of the run's read-write volumes: moved with the result
    /// or not at all.
    pub heads: &'a [crate::NewHead],
}

impl Store {
    /// Records a decided operation with its events. `Conflict` if the run
    /// already has an operation with that id; `Ok(None)` if the run is not
    /// the org's or has ended.
    pub fn insert_op(&self, op: &NewOp<'_>, now: i64) -> Result<Option<OpRow>, StoreError> {
        self.tx(|tx| insert_op_in(tx, op, now))
    }

    /// One operation of the org's run.
    pub fn op(&self, org: &str, run: &str, id: &str) -> Result<Option<OpRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                &format!("SELECT {COLUMNS} FROM ops WHERE org_id = ? AND run_id = ? AND id = ?"),
                &[org.into(), run.into(), id.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// Every operation of the org's run, in order.
    pub fn ops(&self, org: &str, run: &str) -> Result<Vec<OpRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                &format!("SELECT {COLUMNS} FROM ops WHERE org_id = ? AND run_id = ? ORDER BY n"),
                &[org.into(), run.into()],
            )?
            .iter()
            .map(decode)
            .collect()
        })
    }

    /// The org's run's operations handed to its runner and not answered
    /// yet (one at a time today): what a request to a port the run's
    /// program exposes is checked against.
    pub fn dispatched_ops(&self, org: &str, run: &str) -> Result<Vec<OpRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM ops WHERE org_id = ? AND run_id = ? \
                     AND state = 'dispatched' ORDER BY n"
                ),
                &[org.into(), run.into()],
            )?
            .iter()
            .map(decode)
            .collect()
        })
    }

    /// A run with how many of its operations are still open (waiting for
    /// approval, queued or dispatched), in one statement: what a runner's
    /// wait for its run's next step looks at each time it wakes.
    pub fn run_with_open_ops(
        &self,
        org: &str,
        run: &str,
    ) -> Result<Option<(crate::RunRow, i64)>, StoreError> {
        self.read(|tx| crate::runs::get_with_open_ops(tx, org, run))
    }

    /// Hands the next operation of `run` to `runner`, if it holds the run:
    /// the one already handed to it and not answered, or else the oldest
    /// queued. A runner asks again only once it has answered what it was
    /// given, so an operation still dispatched when its holder asks is one
    /// whose hand-over was lost (a replica killed between committing the
    /// dispatch and answering): it is handed over again rather than left
    /// dispatched for ever while the runner's asking keeps the lease alive.
    pub fn dispatch_op(
        &self,
        org: &str,
        runner: &str,
        run: &str,
        now: i64,
    ) -> Result<Option<OpRow>, StoreError> {
        // One statement: the oldest open op of a run this runner holds
        // (operations are handed over in order, so a dispatched one comes
        // before every queued one), while the runner still stands. A
        // concurrent asker waits for the row rather than skip it: skipping
        // would hand over the op after one not answered yet.
        self.single(|tx| {
            let sql = format!(
                "UPDATE ops SET state = 'dispatched', updated_ms = ?
                 WHERE run_id = ? AND state IN ('queued', 'dispatched') AND id = (
                     SELECT q.id FROM ops q WHERE q.run_id = ?
                       AND q.state IN ('queued', 'dispatched')
                       AND EXISTS (SELECT 1 FROM runs r WHERE r.org_id IS NOT DISTINCT FROM ? AND r.id = ?
                                   AND r.runner_id IS NOT DISTINCT FROM ? AND r.state IN ('claimed', 'running'))
                       AND NOT EXISTS (SELECT 1 FROM runners w WHERE w.id = ? AND NOT ({stands}))
                     ORDER BY q.n LIMIT 1)
                 RETURNING {COLUMNS}",
                stands = crate::runners::RUNNER_STANDS,
            );
            tx.query_one(
                &sql,
                &[
                    now.into(),
                    run.into(),
                    run.into(),
                    org.into(),
                    run.into(),
                    runner.into(),
                    runner.into(),
                ],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// Records a decision made again on an operation its runner holds (an
    /// acting browser step, decided on the element its browser found): the
    /// op stays `dispatched` (allowed: the runner takes it), waits for a
    /// person (`PendingApproval`, with `approval`) or is `Denied` (with
    /// `result`). `false` if the op is not dispatched in a run `runner`
    /// holds.
    pub fn redecide_op(&self, op: &Redecided<'_>, now: i64) -> Result<bool, StoreError> {
        self.tx(|tx| {
            let updated = tx.execute(
                "UPDATE ops SET state = ?, decision = ?, result = COALESCE(?, result), updated_ms = ?
                 WHERE run_id = ? AND id = ? AND state = 'dispatched'
                   AND EXISTS (SELECT 1 FROM runs r WHERE r.org_id IS NOT DISTINCT FROM ? AND r.id = ?
                                   AND r.runner_id IS NOT DISTINCT FROM ?
                               AND r.state IN ('claimed', 'running'))",
                &[
                    op.state.as_str().into(),
                    op.decision.to_string().into(),
                    op.result.map(|r| r.to_string()).into(),
                    now.into(),
                    op.run.into(),
                    op.id.into(),
                    op.org.into(),
                    op.run.into(),
                    op.runner.into(),
                ],
            )?;
            if updated == 0 {
                return Ok(false);
            }
            if let Some(approval) = &op.approval {
                approvals::insert(tx, op.org, op.run, op.id, approval, now)?;
            }
            events::append(tx, op.org, op.events)?;
            Ok(true)
        })
    }

    /// Records the runner's result, its events and artifacts, once: a
    /// repeated report (a retry after a lost answer) changes nothing and
    /// returns `false`.
    pub fn finish_op(&self, result: &OpResult<'_>, now: i64) -> Result<bool, StoreError> {
        self.tx(|tx| {
            let state = if result.succeeded {
                OpState::Succeeded
            } else {
                OpState::Failed
            };
            // Only the runner holding the run reports on its ops; its tool
            // token, if it had one, ends with it.
            let update = "UPDATE ops SET state = ?, result = ?, updated_ms = ?
                 WHERE run_id = ? AND id = ? AND state = 'dispatched'
                   AND EXISTS (SELECT 1 FROM runs r WHERE r.org_id IS NOT DISTINCT FROM ? AND r.id = ?
                                   AND r.runner_id IS NOT DISTINCT FROM ?)";
            let params: [crate::Value; 10] = [
                state.as_str().into(),
                result.result.to_string().into(),
                now.into(),
                result.run.into(),
                result.op.into(),
                result.org.into(),
                result.run.into(),
                result.runner.into(),
                result.run.into(),
                result.op.into(),
            ];
            let delete = "DELETE FROM tool_tokens WHERE run_id = ? AND op_id = ?";
            // Only events left to write (the common case): on PostgreSQL
            // one statement does the above and appends them after the
            // ledger's head (two round trips fewer). Otherwise the head is
            // locked only once the rest is written, as every append does:
            // it serialises every writer.
            let only_events = !result.events.is_empty()
                && result.events.len() <= events::IN_STATEMENT_MOST
                && result.heads.is_empty()
                && result.artifacts.is_empty()
                && result.held.is_empty()
                && !crate::quarantine::records_any(result.events);
            if tx.dialect() == crate::db::Dialect::Postgres {
                let with = format!(
                    "done AS ({update} RETURNING 1),
                     gone AS ({delete} AND EXISTS (SELECT 1 FROM done))"
                );
                let updated = ", (SELECT COUNT(*) FROM done) AS updated";
                if only_events {
                    let chain = events::InStatement::new(result.org, result.events)?;
                    let row = chain
                        .query_one(tx, &with, params, Some("done"), updated)?
                        .ok_or_else(|| StoreError::Corrupt("no row".into()))?;
                    if row.int("updated")? == 0 {
                        return Ok(false);
                    }
                    chain.stored(&row)?;
                    return Ok(true);
                }
                let row = tx
                    .query_one(&format!("WITH {with} SELECT 1 AS one{updated}"), &params)?
                    .ok_or_else(|| StoreError::Corrupt("no row".into()))?;
                if row.int("updated")? == 0 {
                    return Ok(false);
                }
            } else {
                if tx.execute(update, &params[..8])? == 0 {
                    return Ok(false);
                }
                tx.execute(delete, &params[8..])?;
            }
            if !result.heads.is_empty() {
                let run = crate::runs::get(tx, result.org, result.run)?
                    .ok_or_else(|| StoreError::Corrupt("run vanished".into()))?;
                crate::volumes::move_heads(tx, result.org, &run, result.heads, now)?;
            }
            for artifact in result.artifacts {
                objects::insert_artifact(tx, result.org, result.run, result.op, artifact, now)?;
            }
            crate::quarantine::record(tx, result.org, result.run, result.op, result.events, now)?;
            for held in result.held {
                crate::held::hold(tx, result.org, result.run, result.op, held, now)?;
            }
            events::append(tx, result.org, result.events)?;
            Ok(true)
        })
    }
}

/// [`Store::insert_op`] inside `tx`.
pub(crate) fn insert_op_in(
    tx: &mut dyn crate::Tx,
    op: &NewOp<'_>,
    now: i64,
) -> Result<Option<OpRow>, StoreError> {
    // The run's counter gives the op its number and locks the run's row,
    // so two inserts cannot take one number (a refused insert rolls the
    // counter back with its transaction). An ended run takes no more ops.
    let counter =
        "UPDATE runs SET last_op_n = last_op_n + 1 WHERE org_id IS NOT DISTINCT FROM ? AND id = ?
           AND state NOT IN ('succeeded', 'failed', 'dead_lettered', 'cancelled')
         RETURNING last_op_n";
    let columns =
        "(run_id, id, org_id, n, op, state, envelope, decision, result, created_ms, updated_ms)";
    let envelope = op.envelope.to_string();
    let decision = op.decision.to_string();
    let values = |n: crate::Value| -> [crate::Value; 11] {
        [
            op.run.into(),
            op.id.into(),
            op.org.into(),
            n,
            op.op.into(),
            op.state.as_str().into(),
            envelope.as_str().into(),
            decision.as_str().into(),
            op.result.map(|r| r.to_string()).into(),
            now.into(),
            now.into(),
        ]
    };
    // With events and nothing else to write before them (no approval), on
    // PostgreSQL the statement that queues the op also appends them after
    // the ledger's head.
    let postgres = tx.dialect() == crate::db::Dialect::Postgres;
    let appending = postgres
        && op.approval.is_none()
        && !op.events.is_empty()
        && op.events.len() <= events::IN_STATEMENT_MOST;
    let mut chain = None;
    let inserted = if postgres {
        // One statement: the counter, the op numbered from it, whether
        // the run took it, and its events if wanted.
        let with = format!(
            "counted AS ({counter}),
             ins AS (INSERT INTO ops {columns} SELECT ?, ?, ?, counted.last_op_n, ?, ?, ?, ?, ?, ?, ?
                     FROM counted ON CONFLICT (run_id, id) DO NOTHING RETURNING {COLUMNS})"
        );
        let select = "ins.*, (SELECT COUNT(*) FROM counted) AS counted
             FROM (SELECT 1 AS one) one LEFT JOIN ins ON TRUE";
        let [run, id, org, _, rest @ ..] = values(crate::Value::Null);
        let params: Vec<crate::Value> = [op.org.into(), op.run.into(), run, id, org]
            .into_iter()
            .chain(rest)
            .collect();
        let row = if appending {
            let appended = events::InStatement::new(op.org, op.events)?;
            let row = appended.query_one(tx, &with, params, Some("ins"), &format!(", {select}"))?;
            chain = Some(appended);
            row
        } else {
            tx.query_one(&format!("WITH {with} SELECT {select}"), &params)?
        }
        .ok_or_else(|| StoreError::Corrupt("no row".into()))?;
        if row.int("counted")? == 0 {
            return Ok(None);
        }
        Some(row)
    } else {
        let Some(run) = tx.query_one(counter, &[op.org.into(), op.run.into()])? else {
            return Ok(None);
        };
        let n = run.int("last_op_n")?;
        tx.query_one(
            &format!(
                "INSERT INTO ops {columns} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (run_id, id) DO NOTHING RETURNING {COLUMNS}"
            ),
            &values(n.into()),
        )?
    };
    // (A row whose op columns are null: nothing was inserted.)
    let Some(inserted) = inserted.filter(|row| !matches!(row.opt_text("id"), Ok(None))) else {
        return Err(StoreError::Conflict(format!("operation {}", op.id)));
    };
    if let Some(chain) = chain {
        chain.stored(&inserted)?;
        return decode(&inserted).map(Some);
    }
    if let Some(approval) = &op.approval {
        approvals::insert(tx, op.org, op.run, op.id, approval, now)?;
    }
    events::append(tx, op.org, op.events)?;
    decode(&inserted).map(Some)
}
