//! Runs: created by an org, claimed by one of its runners under a lease,
//! finished once. Every state change writes its event in the same
//! transaction, so the ledger and the run table never disagree.
//!
//! A statement about one run finds it by its id, the primary key; the org
//! (and the runner) it also names is written `IS NOT DISTINCT FROM`, the
//! same as `=` there (neither side is ever NULL), which no index can take:
//! on PostgreSQL, an index narrowed by the org alone would otherwise look
//! as cheap as the key while the planner has no statistics, and a plan
//! cached then reads all the org's runs (migration V13).

use moat_core::event_data::{
    ApprovalExpired, FinalRunState, RunClaimed, RunCreated, RunDeadLettered, RunFinished, RunInput,
    RunLeaseExpired, RunReleased, RunRetried, RunUsage,
};
use moat_core::{Event, EventData};
use serde_json::json;

use crate::{Row, Store, StoreError, Tx, events};

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    Queued,
    Claimed,
    Running,
    Paused,
    Succeeded,
    Failed,
    DeadLettered,
    Cancelled,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Claimed => "claimed",
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::DeadLettered => "dead_lettered",
            RunState::Cancelled => "cancelled",
        }
    }

    pub const ALL: [RunState; 8] = [
        RunState::Queued,
        RunState::Claimed,
        RunState::Running,
        RunState::Paused,
        RunState::Succeeded,
        RunState::Failed,
        RunState::DeadLettered,
        RunState::Cancelled,
    ];

    pub fn parse(text: &str) -> Option<RunState> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunState::Succeeded | RunState::Failed | RunState::DeadLettered | RunState::Cancelled
        )
    }
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub id: String,
    pub org_id: String,
    pub state: RunState,
    pub environment: String,
    pub runner_id: Option<String>,
    pub manifest_hash: Option<String>,
    pub lease_until_ms: i64,
    pub attempts: i64,
    pub max_attempts: i64,
    pub finish_wanted: bool,
    /// JSON array of `{path, sha256, size}`.
    pub inputs: serde_json::Value,
    pub error: Option<String>,
    pub created_ms: i64,
    pub claimed_ms: i64,
    pub updated_ms: i64,
    /// The workload classes a runner must offer to claim it, as bits
    /// ([`moat_core::WorkloadClass::bit`]).
    pub needs_classes: i64,
    /// CPU (millicores) and memory (bytes) it holds of its runner's while
    /// claimed, running or paused (from the runner's manifest limits).
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// Why runners that asked could not take it (placement), as a JSON
    /// object of reasons by runner id, until one does: see
    /// [`RunRow::placement_notes`].
    pub placement_note: Option<String>,
    /// Its persistent volumes.
    pub volumes: Vec<crate::RunVolume>,
}

impl RunRow {
    /// The placement refusals the run remembers: reason by runner id.
    pub fn placement_notes(&self) -> std::collections::BTreeMap<String, String> {
        self.placement_note
            .as_deref()
            .and_then(|n| serde_json::from_str(n).ok())
            .unwrap_or_default()
    }

    /// Its waiting reason from those: each distinct reason, with the
    /// runners it was given to.
    pub fn placement_waiting(&self) -> Option<String> {
        let mut by_reason: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (runner, reason) in self.placement_notes() {
            by_reason.entry(reason).or_default().push(runner);
        }
        let parts: Vec<String> = by_reason
            .into_iter()
            .map(|(reason, runners)| format!("{reason} (runner {})", runners.join(", ")))
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

const COLUMNS: &str = "id, org_id, state, environment, runner_id, manifest_hash, lease_until_ms,
    attempts, max_attempts, finish_wanted, inputs, error, created_ms, claimed_ms, updated_ms,
    needs_classes, cpu_millis, memory_bytes, placement_note, volumes";

fn decode(row: &Row) -> Result<RunRow, StoreError> {
    let state = row.text("state")?;
    Ok(RunRow {
        id: row.text("id")?,
        org_id: row.text("org_id")?,
        state: RunState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("run state {state:?}")))?,
        environment: row.text("environment")?,
        runner_id: row.opt_text("runner_id")?,
        manifest_hash: row.opt_text("manifest_hash")?,
        lease_until_ms: row.int("lease_until_ms")?,
        attempts: row.int("attempts")?,
        max_attempts: row.int("max_attempts")?,
        finish_wanted: row.int("finish_wanted")? != 0,
        inputs: serde_json::from_str(&row.text("inputs")?)
            .map_err(|e| StoreError::Corrupt(format!("run inputs: {e}")))?,
        error: row.opt_text("error")?,
        created_ms: row.int("created_ms")?,
        claimed_ms: row.int("claimed_ms")?,
        updated_ms: row.int("updated_ms")?,
        needs_classes: row.int("needs_classes")?,
        cpu_millis: row.int("cpu_millis")?,
        memory_bytes: row.int("memory_bytes")?,
        placement_note: row.opt_text("placement_note")?,
        volumes: crate::volumes::decode_run_volumes(row.opt_text("volumes")?)?,
    })
}

/// RFC 3339 (milliseconds, UTC) of `ms` since the epoch.
pub use moat_core::time::stamp_ms as stamp;

/// An event of `data`'s type about `run` (empty: about none), at `now`.
pub fn typed_event(data: moat_core::EventData, run: &str, now: i64) -> Event {
    Event::of(data, stamp(now), run.to_owned())
}

pub(super) fn get(tx: &mut dyn Tx, org: &str, id: &str) -> Result<Option<RunRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM runs WHERE org_id IS NOT DISTINCT FROM ? AND id = ?");
    tx.query_one(&sql, &[org.into(), id.into()])?
        .as_ref()
        .map(decode)
        .transpose()
}

/// [`get`], with the count of the run's open operations.
/// A column of a statement over `runs`: how many of the run's operations
/// are open (waiting for approval, queued or dispatched).
const OPEN_OPS: &str = ", (SELECT COUNT(*) FROM ops o WHERE o.org_id = runs.org_id
     AND o.run_id = runs.id AND o.state IN ('pending_approval', 'queued', 'dispatched'))
     AS open_ops";

pub(super) fn get_with_open_ops(
    tx: &mut dyn Tx,
    org: &str,
    id: &str,
) -> Result<Option<(RunRow, i64)>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS}{OPEN_OPS} FROM runs WHERE org_id IS NOT DISTINCT FROM ? AND id = ?"
    );
    tx.query_one(&sql, &[org.into(), id.into()])?
        .as_ref()
        .map(|row| Ok((decode(row)?, row.int("open_ops")?)))
        .transpose()
}

fn set_state(
    tx: &mut dyn Tx,
    run: &RunRow,
    state: RunState,
    error: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE runs SET state = ?, error = ?, updated_ms = ? WHERE id = ?",
        &[
            state.as_str().into(),
            error.map(str::to_owned).into(),
            now.into(),
            run.id.as_str().into(),
        ],
    )?;
    Ok(())
}

/// Ends `run` in a final `state` with its event, then `then` (what the
/// end closed) in the same append; ops still waiting fail.
fn end(
    tx: &mut dyn Tx,
    run: &RunRow,
    (state, reason): (RunState, Option<&str>),
    then: &[Event],
    now: i64,
) -> Result<(), StoreError> {
    let failed = json!({"status": "error", "error": {"reason": "run_ended", "message": format!("the run ended ({})", state.as_str())}})
        .to_string();
    let fail_ops = format!(
        "UPDATE ops SET state = 'failed', result = ?, updated_ms = ?
         WHERE run_id = ? AND state IN ({})",
        quoted_list(&OPS_FAILED_AT_END)
    );
    // Approvals still asked for have nothing left to approve; but a file
    // held for an export's approval is stored here, not on the runner, and
    // waits for its approver (or its expiry) after the run.
    let expire_approvals =
        "UPDATE approvals SET state = 'expired', resolved_ms = ?, reason = 'the run ended'
         WHERE run_id = ? AND state = 'pending'
           AND NOT EXISTS (SELECT 1 FROM held_exports h WHERE h.approval_id = approvals.id)
         RETURNING id, op_id, rule, risk";
    let id = run.id.as_str();
    let postgres = tx.dialect() == crate::Dialect::Postgres;
    let (expired, used) = if postgres {
        // One statement: its three writes touch three tables, and each
        // runs to completion whether or not the query reads it; it reads
        // what the run used too, as it was before the statement (see
        // `usage_before_end`), and how many ops it failed.
        let rows = tx.query(
            &format!(
                "WITH run_end AS (UPDATE runs SET state = ?, error = ?, updated_ms = ? WHERE id = ?),
                 failed AS ({fail_ops} RETURNING id),
                 expired AS ({expire_approvals})
                 SELECT 'expired' AS part, id, op_id, rule, risk, NULL AS state, 0 AS n,
                   CAST(NULL AS BYTEA) AS body FROM expired
                 UNION ALL
                 SELECT 'failed', NULL, NULL, NULL, NULL, NULL, COUNT(*), NULL FROM failed
                 UNION ALL
                 SELECT 'usage', NULL, NULL, NULL, NULL, u.state, u.n, u.body FROM ({USAGE_READ}) u"
            ),
            &[
                state.as_str().into(),
                reason.map(str::to_owned).into(),
                now.into(),
                id.into(),
                failed.into(),
                now.into(),
                id.into(),
                now.into(),
                id.into(),
                id.into(),
                run.org_id.as_str().into(),
                id.into(),
            ],
        )?;
        let (mut expired, mut used, mut failed_now) = (Vec::new(), Vec::new(), 0);
        for row in rows {
            match row.text("part")?.as_str() {
                "expired" => expired.push(row),
                "failed" => failed_now = row.int("n")?,
                _ => used.push(row),
            }
        }
        let used = match usage_before_end(&used, failed_now)? {
            Some(used) => used,
            // An op changed under the statement: read again, after it.
            None => usage(tx, run)?,
        };
        (expired, used)
    } else {
        set_state(tx, run, state, reason, now)?;
        tx.execute(&fail_ops, &[failed.into(), now.into(), id.into()])?;
        let expired = tx.query(expire_approvals, &[now.into(), id.into()])?;
        (expired, usage(tx, run)?)
    };
    let mut ended = Vec::with_capacity(expired.len() + 1);
    for row in &expired {
        let expired_one = ApprovalExpired {
            approval_id: row.text("id")?,
            reason: Some("the run ended".into()),
            rule: Some(row.text("rule")?),
            risk: Some(row.text("risk")?),
            via: Some("run_end".into()),
            by: None,
        };
        let mut e = typed_event(EventData::ApprovalExpired(expired_one), &run.id, now);
        e.op_id = Some(row.text("op_id")?);
        ended.push(e);
    }
    let (reason, runner_id, attempts) = (
        reason.map(str::to_owned),
        run.runner_id.clone(),
        run.attempts,
    );
    let data = match state {
        RunState::DeadLettered => EventData::RunDeadLettered(RunDeadLettered {
            state: FinalRunState::DeadLettered,
            reason,
            runner_id,
            attempts,
        }),
        RunState::Succeeded => EventData::RunFinished(RunFinished {
            state: FinalRunState::Succeeded,
            reason,
            runner_id,
            attempts,
        }),
        RunState::Cancelled => EventData::RunFinished(RunFinished {
            state: FinalRunState::Cancelled,
            reason,
            runner_id,
            attempts,
        }),
        _ => EventData::RunFinished(RunFinished {
            state: FinalRunState::Failed,
            reason,
            runner_id,
            attempts,
        }),
    };
    let (add_usage, params) = crate::usage::add_statement(tx.dialect(), &run.org_id, now, &used);
    ended.push(typed_event(EventData::RunUsage(used), &run.id, now));
    ended.push(typed_event(data, &run.id, now));
    ended.extend_from_slice(then);
    if postgres && ended.len() <= events::IN_STATEMENT_MOST {
        // The day's usage added and the events appended after the ledger's
        // head in one statement, the last write of the run's end. (The
        // head is locked before the day's row, as the data-modifying WITH
        // nothing reads runs last; older builds locked the row first, so
        // during a rolling upgrade two run ends may deadlock: the database
        // breaks it and the transaction is retried, see `retrying`.)
        let chain = events::InStatement::new(&run.org_id, &ended)?;
        let row = chain
            .query_one(tx, &format!("added AS ({add_usage})"), params, None, "")?
            .ok_or_else(|| StoreError::Corrupt("ledger head missing".into()))?;
        chain.stored(&row)?;
    } else {
        // More events than one statement takes (a runner reports up to
        // thousands with its finish): appended in batches, the head locked
        // before the day's row as above.
        events::append(tx, &run.org_id, &ended)?;
        tx.execute(&add_usage, &params)?;
    }
    Ok(())
}

/// `run`'s lease is lost (its runner stopped answering, or its claim was
/// never handed over): the op in flight fails (`interrupted`), and the run
/// is queued again while it has attempts left, else dead-lettered.
fn lapse(tx: &mut dyn Tx, run: &RunRow, now: i64) -> Result<RunState, StoreError> {
    tx.execute(
        "UPDATE ops SET state = 'failed', result = ?, updated_ms = ?
         WHERE run_id = ? AND state = 'dispatched'",
        &[
            json!({"status": "error", "error": {"reason": "interrupted", "message": "the runner stopped answering while the operation ran: it may or may not have taken effect; the run resumes on another runner from its last acknowledged operation (and its volumes' last snapshots), where it may be submitted again"}})
                .to_string()
                .into(),
            now.into(),
            run.id.as_str().into(),
        ],
    )?;
    let data = EventData::RunLeaseExpired(RunLeaseExpired {
        runner_id: run.runner_id.clone(),
        attempt: run.attempts,
        max_attempts: run.max_attempts,
    });
    events::append(tx, &run.org_id, &[typed_event(data, &run.id, now)])?;
    if run.attempts < run.max_attempts {
        tx.execute(
            "UPDATE runs SET state = 'queued', runner_id = NULL, lease_until_ms = 0,
                 manifest_hash = manifest_pin, updated_ms = ? WHERE id = ?",
            &[now.into(), run.id.as_str().into()],
        )?;
        let data = EventData::RunRetried(RunRetried {
            attempt: run.attempts + 1,
        });
        events::append(tx, &run.org_id, &[typed_event(data, &run.id, now)])?;
        Ok(RunState::Queued)
    } else {
        end(
            tx,
            run,
            (RunState::DeadLettered, Some("lease_expired")),
            &[],
            now,
        )?;
        Ok(RunState::DeadLettered)
    }
}

/// The states of a run's ops that its end fails.
const OPS_FAILED_AT_END: [&str; 3] = ["pending_approval", "queued", "dispatched"];

fn quoted_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|item| crate::changes::literal(item))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a run used, as rows: its ops counted by state (rows with a state),
/// then the reports its runners sent (rows with a body). Parameters: the
/// run's id, its org, its id.
const USAGE_READ: &str =
    "SELECT state, COUNT(*) AS n, NULL AS body FROM ops WHERE run_id = ? GROUP BY state
     UNION ALL
     SELECT NULL, 0, body FROM events WHERE org_id = ? AND run_id = ?
       AND event_type IN ('sandbox.exec.finished', 'network.request')";

/// What `run` used, from its ops and the reports its runners sent (in the
/// caller's transaction, as the run ends, after its open ops failed).
fn usage(tx: &mut dyn Tx, run: &RunRow) -> Result<RunUsage, StoreError> {
    let rows = tx.query(
        USAGE_READ,
        &[
            run.id.as_str().into(),
            run.org_id.as_str().into(),
            run.id.as_str().into(),
        ],
    )?;
    usage_of(&rows, false)
}

/// A run's usage from [`USAGE_READ`]'s rows read in the statement that
/// ended it, which failed `failed_now` of its ops. That read sees the ops
/// as they were before the statement, so those in a state the end fails
/// are counted as failed, if the end failed every one of them. An op
/// another writer was moving out of such a state (its result recorded,
/// its approval denied) as the statement began is read in its old state,
/// but the statement, waiting for that writer, left it as it became: then
/// the end failed fewer than were read (`None`: read again).
fn usage_before_end(
    rows: &[crate::db::Row],
    failed_now: i64,
) -> Result<Option<RunUsage>, StoreError> {
    let mut open = 0i64;
    for row in rows {
        if let Some(state) = row.opt_text("state")?
            && OPS_FAILED_AT_END.contains(&state.as_str())
        {
            open = open.saturating_add(row.int("n")?);
        }
    }
    if open != failed_now {
        return Ok(None);
    }
    usage_of(rows, true).map(Some)
}

/// A run's usage from [`USAGE_READ`]'s rows; `before_end`: read before its
/// end failed its open ops, which are counted as failed.
fn usage_of(rows: &[crate::db::Row], before_end: bool) -> Result<RunUsage, StoreError> {
    let mut usage = RunUsage::default();
    for row in rows {
        if let Some(state) = row.opt_text("state")? {
            let n = u64::try_from(row.int("n")?).unwrap_or(0);
            let state = if before_end && OPS_FAILED_AT_END.contains(&state.as_str()) {
                "failed".to_owned()
            } else {
                state
            };
            let count = usage.ops.entry(state).or_insert(0);
            *count = count.saturating_add(n);
            continue;
        }
        // (Runners report the figures below: saturate, never overflow.)
        let event: serde_json::Value = serde_json::from_slice(&row.blob("body")?)
            .map_err(|e| StoreError::Corrupt(format!("event body: {e}")))?;
        let data = &event["data"];
        let n = |key: &str| data[key].as_u64().unwrap_or(0);
        if event["type"] == "sandbox.exec.finished" {
            usage.programs = usage.programs.saturating_add(1);
            usage.cpu_ms = usage.cpu_ms.saturating_add(n("cpuMs"));
            usage.program_wall_ms = usage.program_wall_ms.saturating_add(n("wallMs"));
            usage.peak_memory_bytes = usage.peak_memory_bytes.max(n("peakMemoryBytes"));
            let listed = data["violations"]
                .as_array()
                .or(data["deniedSyscalls"].as_array());
            let refused = listed.into_iter().flatten().fold(0u64, |a, v| {
                a.saturating_add(v["count"].as_u64().unwrap_or(1))
            });
            usage.violations = usage.violations.saturating_add(refused);
            usage.bytes_written = usage.bytes_written.saturating_add(n("bytesWritten"));
            usage.peak_pids = usage.peak_pids.max(n("peakPids"));
        } else {
            usage.egress_requests = usage.egress_requests.saturating_add(1);
            usage.egress_bytes_out = usage.egress_bytes_out.saturating_add(n("bytesOut"));
            usage.egress_bytes_in = usage.egress_bytes_in.saturating_add(n("bytesIn"));
        }
    }
    Ok(usage)
}

/// A run a runner claimed.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub run: RunRow,
    /// Other runs were queued in its org and environment when it was
    /// claimed.
    pub more_queued: bool,
    /// The agent had already asked to finish it and none of its
    /// operations was open: its runner's next step is its end, as the
    /// runner's first ask for it would answer.
    pub finish_now: bool,
}

/// What a claim found ([`Store::claim`]).
#[derive(Debug, Clone)]
pub enum ClaimLook {
    /// It took this run.
    Took(Box<Claimed>),
    /// Nothing to take now, but a queued run it could take was locked for
    /// the moment by another writer (a finish being asked, a cancel): no
    /// change may come to say it is free again, so the claim looks again
    /// soon.
    Locked,
    /// Nothing to take.
    Nothing,
}

impl ClaimLook {
    /// The run taken, if any.
    pub fn took(self) -> Option<Claimed> {
        match self {
            ClaimLook::Took(claimed) => Some(*claimed),
            ClaimLook::Locked | ClaimLook::Nothing => None,
        }
    }
}

/// What deciding an operation of a run needs ([`Store::op_context`]).
#[derive(Debug, Clone)]
pub struct OpContext {
    pub run: RunRow,
    pub org_name: String,
    pub manifest: Option<crate::ManifestRow>,
    /// The classes of the runner that holds the run (`None`: none does).
    pub runner_classes: Option<Vec<moat_core::WorkloadClass>>,
    /// The org's sealed secrets, by name.
    pub secrets: Vec<crate::SealedSecret>,
}

/// The manifest (columns `m_...`, of the first row) and the org's sealed
/// secrets (columns `secret_...`, one row each) of a context's rows.
fn manifest_and_secrets(
    rows: &[Row],
) -> Result<(Option<crate::ManifestRow>, Vec<crate::SealedSecret>), StoreError> {
    let manifest = match rows.first() {
        Some(row) if row.opt_text("m_hash")?.is_some() => {
            Some(crate::objects::decode_manifest_as(row, "m_")?)
        }
        _ => None,
    };
    let secrets = rows
        .iter()
        .filter(|row| matches!(row.opt_text("secret_name"), Ok(Some(_))))
        .map(|row| crate::secrets::sealed_as(row, "secret_"))
        .collect::<Result<_, StoreError>>()?;
    Ok((manifest, secrets))
}

/// What creating a run checks and shows ([`Store::new_run_context`]).
#[derive(Debug, Clone, Default)]
pub struct NewRunContext {
    /// The org's name (`None`: no such org).
    pub org_name: Option<String>,
    /// The org's sealed secrets, by name.
    pub secrets: Vec<crate::SealedSecret>,
    /// The manifest the run would be decided under, if any (revoked ones
    /// included: the caller says what a revoked one means).
    pub manifest: Option<crate::ManifestRow>,
    /// The quota the org has reached, and what its setting says to do.
    pub quota_reached: Option<(moat_core::quota::Exceeded, moat_core::quota::OverQuota)>,
    /// The presence of the org's runners, oldest first.
    pub runners: Vec<crate::RunnerPresence>,
}

/// New run parameters.
pub struct NewRun<'a> {
    pub org: &'a str,
    pub id: &'a str,
    pub environment: &'a str,
    pub inputs: &'a [RunInput],
    /// The inputs' bytes, stored with the run (a run is never claimable
    /// before its inputs exist).
    pub blobs: &'a [crate::NewArtifact],
    pub max_attempts: i64,
    /// Only runners under this manifest may claim the run (default: any
    /// runner of the environment, under the manifest it runs with).
    pub manifest_hash: Option<&'a str>,
    /// Only runners that offer these workload classes may claim it.
    pub needs_classes: &'a [moat_core::WorkloadClass],
    /// The org's volumes it attaches.
    pub volumes: &'a [crate::Attach<'a>],
}

impl NewRun<'_> {
    /// Nothing to write beside the run itself (no volume, no stored input).
    fn alone(&self) -> bool {
        self.volumes.is_empty() && self.blobs.is_empty()
    }
}

impl Store {
    /// Queues a new run (and records `run.created`).
    /// On PostgreSQL a run with nothing beside it is one statement, with
    /// no transaction around it.
    pub fn create_run(&self, run: &NewRun<'_>, now: i64) -> Result<RunRow, StoreError> {
        if self.backend() == "postgres" && run.alone() {
            return self.single(|tx| create_run_in(tx, run, now));
        }
        self.tx(|tx| create_run_in(tx, run, now))
    }

    /// What deciding an operation of the org's run `id` needs, in one
    /// statement (one row per secret of the org): the run, its org's
    /// name, the classes of the runner holding it, the manifest it
    /// decides under (its own if pinned or claimed, otherwise its
    /// environment's current one) and the org's sealed secrets.
    pub fn op_context(&self, org: &str, id: &str) -> Result<Option<OpContext>, StoreError> {
        self.read(|tx| {
            let sql = format!(
                "SELECT r.*, o.name AS org_name,
                   (SELECT w.classes FROM runners w WHERE w.id = r.runner_id) AS runner_classes,
                   {manifest}, s.name AS secret_name, s.nonce AS secret_nonce,
                   s.ciphertext AS secret_ciphertext, s.updated_ms AS secret_updated_ms
                 FROM (SELECT {COLUMNS} FROM runs WHERE org_id IS NOT DISTINCT FROM ? AND id = ?) r
                 LEFT JOIN orgs o ON o.id = r.org_id
                 LEFT JOIN manifests pm ON pm.org_id = r.org_id AND pm.hash = COALESCE(r.manifest_hash,
                   (SELECT m.hash FROM manifests m WHERE m.org_id = r.org_id
                      AND m.environment = r.environment AND {current} LIMIT 1))
                 LEFT JOIN secrets s ON s.org_id = r.org_id
                 ORDER BY s.name",
                manifest = crate::objects::manifest_columns_as("pm", "m_"),
                current = crate::objects::CURRENT,
            );
            let rows = tx.query(&sql, &[org.into(), id.into()])?;
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            let (manifest, secrets) = manifest_and_secrets(&rows)?;
            Ok(Some(OpContext {
                run: decode(row)?,
                org_name: row.opt_text("org_name")?.unwrap_or_default(),
                manifest,
                runner_classes: row
                    .opt_int("runner_classes")?
                    .map(moat_core::WorkloadClass::from_mask),
                secrets,
            }))
        })
    }

    /// What creating a run of `org` in `environment` checks and shows, in
    /// one statement on PostgreSQL, two on SQLite (one row per secret of
    /// the org): the org's name (`None`: no such org), its sealed secrets,
    /// the manifest the run would be decided under (`pinned` by hash, else
    /// the environment's current one), the quota the org has reached, if
    /// any (one statement more when it has a quota), and its runners.
    pub fn new_run_context(
        &self,
        org: &str,
        environment: &str,
        pinned: Option<&str>,
        now: i64,
    ) -> Result<NewRunContext, StoreError> {
        self.read(|tx| {
            let (manifest_hash, first) = match pinned {
                Some(hash) => ("?".to_owned(), hash),
                None => (
                    format!(
                        "(SELECT m.hash FROM manifests m WHERE m.org_id = o.id
                           AND m.environment = ? AND {} LIMIT 1)",
                        crate::objects::CURRENT
                    ),
                    environment,
                ),
            };
            // On PostgreSQL the runners come in the same statement (a
            // round trip fewer on every run's creation).
            let postgres = tx.dialect() == crate::Dialect::Postgres;
            let (presence, joined) = if postgres {
                (", rp.runner_presence", crate::runners::PRESENCE_JOINED_PG)
            } else {
                ("", "")
            };
            let sql = format!(
                "SELECT o.name AS org_name, {manifest}, {quota},
                   s.name AS secret_name, s.nonce AS secret_nonce,
                   s.ciphertext AS secret_ciphertext, s.updated_ms AS secret_updated_ms{presence}
                 FROM orgs o {joined}
                 LEFT JOIN manifests pm ON pm.org_id = o.id AND pm.hash = {manifest_hash}
                 LEFT JOIN org_quotas q ON q.org_id = o.id
                 LEFT JOIN secrets s ON s.org_id = o.id
                 WHERE o.id = ? ORDER BY s.name",
                manifest = crate::objects::manifest_columns_as("pm", "m_"),
                quota = crate::quotas::joined_columns("q"),
            );
            let rows = tx.query(&sql, &[first.into(), org.into()])?;
            let runners = match (postgres, rows.first()) {
                (true, Some(row)) => {
                    crate::runners::presence_of_json(row.opt_text("runner_presence")?)?
                }
                // No such org: no runners either.
                (true, None) => Vec::new(),
                (false, _) => crate::runners::presence_of_org(tx, org)?,
            };
            let Some(row) = rows.first() else {
                return Ok(NewRunContext {
                    runners,
                    ..NewRunContext::default()
                });
            };
            let (manifest, secrets) = manifest_and_secrets(&rows)?;
            let quota = crate::quotas::decode_joined(row)?;
            Ok(NewRunContext {
                org_name: Some(row.text("org_name")?),
                secrets,
                manifest,
                quota_reached: crate::quotas::reached_of(tx, org, quota, now)?,
                runners,
            })
        })
    }

    pub fn run(&self, org: &str, id: &str) -> Result<Option<RunRow>, StoreError> {
        self.read(|tx| get(tx, org, id))
    }

    /// A run by id, whichever org it is in (run ids are unique across
    /// orgs): for operators' tools that read the database directly.
    pub fn run_by_id(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                &format!("SELECT {COLUMNS} FROM runs WHERE id = ?"),
                &[id.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// The org's runs, newest first, optionally in one state.
    pub fn runs(
        &self,
        org: &str,
        state: Option<RunState>,
        limit: i64,
    ) -> Result<Vec<RunRow>, StoreError> {
        self.read(|tx| {
            let rows = match state {
                Some(state) => tx.query(
                    &format!("SELECT {COLUMNS} FROM runs WHERE org_id = ? AND state = ? ORDER BY created_ms DESC, id LIMIT ?"),
                    &[org.into(), state.as_str().into(), limit.into()],
                )?,
                None => tx.query(
                    &format!("SELECT {COLUMNS} FROM runs WHERE org_id = ? ORDER BY created_ms DESC, id LIMIT ?"),
                    &[org.into(), limit.into()],
                )?,
            };
            rows.iter().map(decode).collect()
        })
    }

    /// Claims the oldest queued run of `org` in `environment` for `runner`,
    /// with nothing reserved and no placement policy: [`Store::claim`].
    pub fn claim_run(
        &self,
        org: &str,
        environment: &str,
        runner: &str,
        manifest_hash: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<Option<Claimed>, StoreError> {
        let ask = ClaimAsk {
            org,
            environment,
            runner,
            manifest_hash,
            now,
            lease_ms,
            cpu_millis: 0,
            memory_bytes: 0,
            oldest_only: true,
        };
        self.claim(&ask, &mut |_| Ok(None)).map(ClaimLook::took)
    }

    /// Claims for `ask.runner` the oldest queued run of its org and
    /// environment that it may take, leased until `now + lease_ms`: one its
    /// manifest and classes fit, while the runner has a free slot and the
    /// CPU and memory the run reserves, stands (build, manifest, enrolment)
    /// and is not draining, while the org is under its quotas, and that
    /// `place` (the placement policy) does not refuse. A refusal is noted on
    /// the run, with a `run.placement_denied` event when its reason is new.
    ///
    /// On PostgreSQL, claims of one org, and claims onto one host, take
    /// turns (transaction-scoped advisory locks, org before host), so that
    /// a quota or a co-tenancy rule holds across replicas; queued rows
    /// another writer has locked are skipped, and said to be
    /// ([`ClaimLook::Locked`]). A run taken says whether other
    /// runs were queued there too (a hint: another claim may have taken
    /// them meanwhile), so that only then another waiting claim looks.
    /// Within this process, claims of one org take turns from their look
    /// on, so that none opens a transaction for a run another is taking.
    pub fn claim(
        &self,
        ask: &ClaimAsk<'_>,
        place: &mut dyn FnMut(&PlacementAsk<'_>) -> Result<Option<PlacementRefusal>, StoreError>,
    ) -> Result<ClaimLook, StoreError> {
        let _turn = self.claim_turns.take(ask.org);
        // Most asks find nothing queued: a plain read says so, with no
        // transaction (on PostgreSQL two round trips fewer; on SQLite no
        // write lock taken) and no turn taken in the database (only this
        // process's, above). A run queued after it is found by the next
        // ask, as it would be after a look inside one.
        let queued = self.read(|tx| {
            tx.query_one(
                "SELECT 1 AS queued FROM runs WHERE org_id = ? AND environment = ?
                   AND state = 'queued' LIMIT 1",
                &[ask.org.into(), ask.environment.into()],
            )
        })?;
        if queued.is_none() {
            return Ok(ClaimLook::Nothing);
        }
        self.tx(|tx| claim_in(tx, ask, place))
    }
    /// Gives a run `runner` holds back to the queue, unfinished, with its
    /// claim not counted as an attempt (`run.released`): the runner is
    /// stopping. Refused (`None`) unless the runner holds the run and no
    /// operation of it is dispatched: it releases only at an operation
    /// boundary, so that no operation's outcome is lost.
    pub fn release_run(
        &self,
        org: &str,
        runner: &str,
        run: &str,
        now: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        self.tx(|tx| {
            let Some(row) = tx.query_one(
                &format!(
                    "UPDATE runs SET state = 'queued', runner_id = NULL, lease_until_ms = 0,
                         attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
                         manifest_hash = manifest_pin, updated_ms = ?
                     WHERE org_id IS NOT DISTINCT FROM ? AND id = ? AND runner_id IS NOT DISTINCT FROM ?
                       AND state IN ('claimed', 'running', 'paused')
                       AND NOT EXISTS (SELECT 1 FROM ops o
                           WHERE o.run_id = runs.id AND o.state = 'dispatched')
                     RETURNING {COLUMNS}"
                ),
                &[now.into(), org.into(), run.into(), runner.into()],
            )?
            else {
                return Ok(None);
            };
            let released = decode(&row)?;
            let data = EventData::RunReleased(RunReleased {
                runner_id: runner.to_owned(),
                attempts: released.attempts,
            });
            events::append(tx, org, &[typed_event(data, run, now)])?;
            Ok(Some(released))
        })
    }

    /// Run `run`, claimed for `runner` but never handed over to it (the
    /// control plane could not read its inputs), lapses now as a lost lease
    /// does in [`Store::expire_leases`]: queued again with its attempt
    /// counted, or dead-lettered after its last. `attempt` is the claim's
    /// (the claimed row's `attempts`): a later claim of the run, after this
    /// one's lease ran out meanwhile, is not the one that lapses. `None` if
    /// that claim no longer stands.
    pub fn lapse_claim(
        &self,
        org: &str,
        runner: &str,
        run: &str,
        attempt: i64,
        now: i64,
    ) -> Result<Option<RunState>, StoreError> {
        self.tx(|tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM runs WHERE org_id IS NOT DISTINCT FROM ? AND id = ?
                   AND runner_id IS NOT DISTINCT FROM ? AND state = 'claimed' AND attempts = ?{}",
                tx.for_update()
            );
            let params = [org.into(), run.into(), runner.into(), attempt.into()];
            let Some(row) = tx.query_one(&sql, &params)? else {
                return Ok(None);
            };
            lapse(tx, &decode(&row)?, now).map(Some)
        })
    }

    /// Extends the lease of a run `runner` holds (and marks it running);
    /// `None` if the runner no longer holds it (lease lost, run ended).
    pub fn renew_lease(
        &self,
        org: &str,
        runner: &str,
        run: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        Ok(self
            .renew(org, runner, run, now, lease_ms, false)?
            .map(|(run, _)| run))
    }

    /// As [`Store::renew_lease`], with how many of the run's operations
    /// are open (waiting for approval, queued or dispatched), in the same
    /// statement: what a runner's ask for its next step looks at.
    pub fn renew_lease_counting(
        &self,
        org: &str,
        runner: &str,
        run: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<Option<(RunRow, i64)>, StoreError> {
        self.renew(org, runner, run, now, lease_ms, true)
    }

    fn renew(
        &self,
        org: &str,
        runner: &str,
        run: &str,
        now: i64,
        lease_ms: i64,
        counting: bool,
    ) -> Result<Option<(RunRow, i64)>, StoreError> {
        self.single(|tx| {
            // On PostgreSQL in the same statement (SQLite's RETURNING
            // takes no subquery; a second statement there costs no trip).
            let inline = counting && tx.dialect() == crate::db::Dialect::Postgres;
            let extra = if inline { OPEN_OPS } else { "" };
            let Some(row) = tx.query_one(
                &format!(
                    "UPDATE runs SET lease_until_ms = ?, updated_ms = ?,
                         state = CASE WHEN state = 'claimed' THEN 'running' ELSE state END
                     WHERE org_id IS NOT DISTINCT FROM ? AND id = ? AND runner_id IS NOT DISTINCT FROM ?
                       AND state IN ('claimed', 'running', 'paused')
                     RETURNING {COLUMNS}{extra}"
                ),
                &[
                    (now + lease_ms).into(),
                    now.into(),
                    org.into(),
                    run.into(),
                    runner.into(),
                ],
            )?
            else {
                return Ok(None);
            };
            let open = if inline {
                row.int("open_ops")?
            } else if counting {
                get_with_open_ops(tx, org, run)?.map_or(0, |(_, open)| open)
            } else {
                0
            };
            Ok(Some((decode(&row)?, open)))
        })
    }

    /// The agent is done with the run: the runner finishes it after the
    /// queued ops. A queued run is finished by the runner that claims it
    /// (its claim says so: [`Claimed::finish_now`]).
    pub fn request_finish(
        &self,
        org: &str,
        run: &str,
        now: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        self.single(|tx| {
            tx.query_one(
                &format!(
                    "UPDATE runs SET finish_wanted = 1, updated_ms = ?
                     WHERE org_id IS NOT DISTINCT FROM ? AND id = ?
                     RETURNING {COLUMNS}"
                ),
                &[now.into(), org.into(), run.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// The runner reports the run's end (its state, and the error of a
    /// failed one), with `events` (what the end
    /// closed) recorded in the same transaction. Idempotent: only the
    /// holder of a live claim can finish it, and only once: a repeated
    /// report records nothing again.
    pub fn finish_run(
        &self,
        org: &str,
        runner: &str,
        run: &str,
        end: (RunState, Option<&str>),
        events: &[Event],
        now: i64,
    ) -> Result<bool, StoreError> {
        let ended = self.end_live_run(org, run, Some(runner), end, events, None, now)?;
        Ok(ended == Some(true))
    }

    /// As [`Store::finish_run`], with the run's teardown (`torn_down`, the
    /// runner's `run.destroyed`) recorded last in the same transaction,
    /// whether or not the finish took effect, as the runner's report of
    /// it alone would be: `None` if the org has no such run (nothing
    /// recorded), else whether the finish took effect.
    #[allow(clippy::too_many_arguments)]
    pub fn finish_torn_down_run(
        &self,
        org: &str,
        runner: &str,
        run: &str,
        end: (RunState, Option<&str>),
        events: &[Event],
        torn_down: &Event,
        now: i64,
    ) -> Result<Option<bool>, StoreError> {
        self.end_live_run(org, run, Some(runner), end, events, Some(torn_down), now)
    }

    /// Ends a run from the control plane's side (dead-letter on manifest
    /// expiry, operator action), whoever holds it.
    pub fn force_end_run(
        &self,
        org: &str,
        run: &str,
        state: RunState,
        reason: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let ended = self.end_live_run(org, run, None, (state, Some(reason)), &[], None, now)?;
        Ok(ended == Some(true))
    }

    /// Ends `run` if it is live (and held by `holder`, when given), then
    /// records `last` if given, ended or not: `None` if the org has no
    /// such run, else whether it ended it.
    #[allow(clippy::too_many_arguments)]
    fn end_live_run(
        &self,
        org: &str,
        run: &str,
        holder: Option<&str>,
        end_as: (RunState, Option<&str>),
        events: &[Event],
        last: Option<&Event>,
        now: i64,
    ) -> Result<Option<bool>, StoreError> {
        self.tx(|tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM runs WHERE org_id IS NOT DISTINCT FROM ? AND id = ?{}",
                tx.for_update()
            );
            let Some(row) = tx.query_one(&sql, &[org.into(), run.into()])? else {
                return Ok(None);
            };
            let row = decode(&row)?;
            let held = holder.is_none_or(|h| row.runner_id.as_deref() == Some(h));
            if row.state.is_final() || !held {
                crate::events::append(tx, org, last.map(std::slice::from_ref).unwrap_or_default())?;
                return Ok(Some(false));
            }
            let then: Vec<Event> = events.iter().chain(last).cloned().collect();
            end(tx, &row, end_as, &then, now)?;
            Ok(Some(true))
        })
    }

    /// Runs whose runner stopped renewing: the op in flight fails
    /// (`interrupted`: the agent may submit it again), and the run is queued again while it has attempts
    /// left, else dead-lettered. Returns the runs handled.
    pub fn expire_leases(&self, now: i64) -> Result<Vec<(String, RunState)>, StoreError> {
        self.tx(|tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM runs WHERE state IN ('claimed', 'running') AND lease_until_ms < ?
                 ORDER BY lease_until_ms LIMIT 100{}",
                tx.skip_locked()
            );
            let rows = tx.query(&sql, &[now.into()])?;
            let mut handled = Vec::new();
            for row in rows {
                let run = decode(&row)?;
                let state = lapse(tx, &run, now)?;
                handled.push((run.id, state));
            }
            Ok(handled)
        })
    }

    /// Ends, with reason `idle_timeout`, the open runs nothing has happened
    /// in for `idle_ms`: no operation submitted, waiting, running or
    /// answered, and no approval pending. A run an agent walked away from
    /// would otherwise hold a runner's slot for ever. Returns the runs ended.
    pub fn finish_idle_runs(&self, now: i64, idle_ms: i64) -> Result<Vec<String>, StoreError> {
        let before = now.saturating_sub(idle_ms);
        self.tx(|tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM runs r
                 WHERE state IN ('queued', 'claimed', 'running')
                 AND created_ms < ? AND claimed_ms < ?
                 AND NOT EXISTS (SELECT 1 FROM ops o WHERE o.run_id = r.id
                     AND (o.updated_ms >= ? OR o.state IN ('pending_approval', 'queued', 'dispatched')))
                 ORDER BY created_ms LIMIT 100{}",
                tx.skip_locked()
            );
            let rows = tx.query(&sql, &[before.into(), before.into(), before.into()])?;
            let mut ended = Vec::new();
            for row in rows {
                let run = decode(&row)?;
                end(tx, &run, (RunState::Succeeded, Some("idle_timeout")), &[], now)?;
                ended.push(run.id);
            }
            Ok(ended)
        })
    }

    /// Every live run of every org (the manifest-grace sweep).
    pub fn live_runs(&self) -> Result<Vec<RunRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM runs WHERE state IN ('claimed', 'running', 'paused')"
                ),
                &[],
            )?
            .iter()
            .map(decode)
            .collect()
        })
    }
}

/// What a runner's claim asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimAsk<'a> {
    pub org: &'a str,
    pub environment: &'a str,
    pub runner: &'a str,
    /// The manifest the runner runs under (a pinned run needs it).
    pub manifest_hash: &'a str,
    pub now: i64,
    pub lease_ms: i64,
    /// What the run will hold of the runner while it holds it: its
    /// manifest's limits (0: nothing).
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// The placement policy places every run on every host: the claim
    /// looks at (and on PostgreSQL locks) the oldest queued run it may
    /// take only, not up to 64 of them. Each row a claim locks keeps an
    /// agent's write to that run (its finish) waiting until the claim
    /// commits, and locking costs the database a write per row.
    pub oldest_only: bool,
}

/// A queued run the claiming runner could take, for the placement policy.
#[derive(Debug)]
pub struct PlacementAsk<'a> {
    pub run: &'a RunRow,
    /// The org's name.
    pub org_name: &'a str,
    /// The claiming runner (`None`: not registered, as in store tests).
    pub runner: Option<&'a crate::RunnerRow>,
    /// The names of the other orgs with runs held on the runner's host now.
    pub tenants: &'a [String],
}

/// Why the placement policy refused a run to a runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementRefusal {
    /// Shown as the run's waiting reason (`placement_waiting: ...`).
    pub reason: String,
    /// The policies that refused.
    pub policies: Vec<String>,
}

/// The queued runs a claim may take (org, environment, the runner's
/// manifest hash, the classes it offers).
const TAKEABLE: &str = "q.org_id = ? AND q.environment = ? AND q.state = 'queued'
    AND (q.manifest_hash IS NULL OR q.manifest_hash = ?) AND (q.needs_classes & ?) = q.needs_classes";

/// Queued runs one claim looks at, oldest first: those the placement
/// policy refuses are passed over for younger ones.
const CANDIDATES: i64 = 64;

fn claim_in(
    tx: &mut dyn Tx,
    ask: &ClaimAsk<'_>,
    place: &mut dyn FnMut(&PlacementAsk<'_>) -> Result<Option<PlacementRefusal>, StoreError>,
) -> Result<ClaimLook, StoreError> {
    // Runners that named no host count as one host: who shares a machine
    // with them is unknown, so a co-tenancy rule sees all of them together.
    let org_turn = format!("org:{}", ask.org);
    let runner = if tx.dialect() == crate::Dialect::Postgres {
        crate::runners::get_taking_turns(tx, ask.runner, &org_turn)?
    } else {
        crate::runners::get(tx, ask.runner)?
    };
    let offered = runner.as_ref().map_or(1, |w| w.classes);
    // The org's name comes with them, for the placement policy.
    let sql = format!(
        "SELECT {COLUMNS}, (SELECT o.name FROM orgs o WHERE o.id = q.org_id) AS org_name
         FROM runs q WHERE {TAKEABLE} ORDER BY q.created_ms, q.id LIMIT {limit}{skip}",
        limit = if ask.oldest_only { 1 } else { CANDIDATES },
        skip = tx.skip_locked()
    );
    let takeable = [
        ask.org.into(),
        ask.environment.into(),
        ask.manifest_hash.into(),
        offered.into(),
    ];
    let mut too_big = None;
    // The org's quota, read with what the runner holds when it has one
    // (and on PostgreSQL its host's other tenants, for the placement
    // policy, and the queued runs it could take, locked: one statement).
    let mut quota = None;
    let mut tenants = None;
    let mut candidates = None;
    if let Some(w) = &runner {
        if w.draining {
            return Ok(ClaimLook::Nothing);
        }
        let joined = tx.dialect() == crate::Dialect::Postgres;
        let also = joined.then(|| crate::runners::AlsoRead {
            select: &sql,
            params: &takeable,
            order: "also.created_ms, also.id",
        });
        // Fresh figures, read under the turns just taken.
        let Some(crate::runners::HeldFigures {
            mut held,
            quota: org_quota,
            also: queued,
        }) = crate::runners::held_if_standing(tx, &w.id, ask.org, also)?
        else {
            return Ok(ClaimLook::Nothing);
        };
        candidates = joined.then_some(queued);
        tenants = held.tenants.take();
        quota = Some(org_quota);
        too_big = never_fits(w, ask);
        let fits = |have: i64, reserved: i64, need: i64| {
            have == 0 || reserved.saturating_add(need) <= have
        };
        if too_big.is_none()
            && (held.runs >= w.slots
                || !fits(w.cpu_millis, held.cpu_millis, ask.cpu_millis)
                || !fits(w.memory_bytes, held.memory_bytes, ask.memory_bytes))
        {
            return Ok(ClaimLook::Nothing);
        }
    }
    let reached = match quota {
        Some(quota) => crate::quotas::reached_of(tx, ask.org, quota, ask.now)?,
        None => crate::quotas::reached(tx, ask.org, ask.now)?,
    };
    if reached.is_some() {
        return Ok(ClaimLook::Nothing);
    }
    let candidates = match candidates {
        Some(read) => read,
        None => tx.query(&sql, &takeable)?,
    };
    let host_id = runner.as_ref().and_then(|w| w.host_id.clone());
    if let Some(why) = too_big {
        // Each would be refused alike: say so on them, take none.
        for row in &candidates {
            let refusal = PlacementRefusal {
                reason: why.clone(),
                policies: Vec::new(),
            };
            note_refusal(tx, ask, &decode(row)?, host_id.as_deref(), refusal)?;
        }
        return Ok(ClaimLook::Nothing);
    }
    if candidates.is_empty() {
        // Skipped rows (another writer's lock) are told apart from none.
        let locked = tx.dialect() == crate::Dialect::Postgres
            && tx
                .query_one(
                    &format!("SELECT 1 AS queued FROM runs q WHERE {TAKEABLE} LIMIT 1"),
                    &takeable,
                )?
                .is_some();
        return Ok(if locked {
            ClaimLook::Locked
        } else {
            ClaimLook::Nothing
        });
    }
    let tenants = match (tenants, &runner) {
        (Some(tenants), _) => tenants,
        (None, Some(w)) => tenants_of(tx, &w.id, ask.org)?,
        (None, None) => Vec::new(),
    };
    let org_name = match candidates.first().map(|row| row.opt_text("org_name")) {
        Some(name) => name?.unwrap_or_else(|| ask.org.to_owned()),
        None => ask.org.to_owned(),
    };
    for row in &candidates {
        let run = decode(row)?;
        let refusal = place(&PlacementAsk {
            run: &run,
            org_name: &org_name,
            runner: runner.as_ref(),
            tenants: &tenants,
        })?;
        match refusal {
            Some(refusal) => note_refusal(tx, ask, &run, host_id.as_deref(), refusal)?,
            None => return Ok(ClaimLook::Took(Box::new(take(tx, ask, &run)?))),
        }
    }
    Ok(ClaimLook::Nothing)
}

/// Why no run of this runner's manifest could ever fit it, even with
/// nothing held: what one reserves is more than it has.
fn never_fits(w: &crate::RunnerRow, ask: &ClaimAsk<'_>) -> Option<String> {
    let over = |have: i64, need: i64| have != 0 && need > have;
    if over(w.cpu_millis, ask.cpu_millis) {
        return Some(format!(
            "placement_waiting: a run reserves {} millicores (its manifest's limits.cpuMillis), \
             more than the runner has ({})",
            ask.cpu_millis, w.cpu_millis
        ));
    }
    if over(w.memory_bytes, ask.memory_bytes) {
        return Some(format!(
            "placement_waiting: a run reserves {} bytes of memory (its manifest's \
             limits.memoryBytes), more than the runner has ({})",
            ask.memory_bytes, w.memory_bytes
        ));
    }
    None
}

/// The names of the orgs other than `org` whose runs runners on runner
/// `id`'s host hold now (on PostgreSQL read with what the runner holds,
/// see `held_if_standing`).
fn tenants_of(tx: &mut dyn Tx, id: &str, org: &str) -> Result<Vec<String>, StoreError> {
    tx.query(
        &format!(
            "SELECT DISTINCT o.name FROM runners w, {} AND w.id = ? ORDER BY o.name",
            crate::runners::HOST_TENANTS
        ),
        &[org.into(), id.into()],
    )?
    .iter()
    .map(|row| row.text("name"))
    .collect()
}

/// Runners whose refusals a run remembers at most.
const NOTED_RUNNERS: usize = 32;

/// Keeps a placement refusal on the run, by runner; recorded as an event
/// only when that runner's reason is new (runners ask again every second
/// or so, and several may be refused the same run).
fn note_refusal(
    tx: &mut dyn Tx,
    ask: &ClaimAsk<'_>,
    run: &RunRow,
    host: Option<&str>,
    refusal: PlacementRefusal,
) -> Result<(), StoreError> {
    let mut notes = run.placement_notes();
    if notes.get(ask.runner) == Some(&refusal.reason) {
        return Ok(());
    }
    if notes.len() >= NOTED_RUNNERS {
        notes.clear();
    }
    notes.insert(ask.runner.to_owned(), refusal.reason.clone());
    let note = serde_json::to_string(&notes).unwrap_or_default();
    tx.execute(
        "UPDATE runs SET placement_note = ? WHERE id = ?",
        &[note.into(), run.id.as_str().into()],
    )?;
    let data = EventData::RunPlacementDenied(moat_core::event_data::RunPlacementDenied {
        runner_id: ask.runner.to_owned(),
        host_id: host.map(str::to_owned),
        reason: refusal.reason,
        policies: refusal.policies,
    });
    events::append(tx, ask.org, &[typed_event(data, &run.id, ask.now)])?;
    Ok(())
}

/// Hands the queued run `queued` (read, and on PostgreSQL locked, by the
/// claim) to the claiming runner, with its reservation.
fn take(tx: &mut dyn Tx, ask: &ClaimAsk<'_>, queued: &RunRow) -> Result<Claimed, StoreError> {
    // Its open operations are counted only for a run the agent asked to
    // finish while it was queued (the row is the claim's, so that does not
    // move meanwhile), on PostgreSQL in the taking statement; SQLite's
    // RETURNING reads no other table.
    let inline_open = queued.finish_wanted && tx.dialect() == crate::Dialect::Postgres;
    // The state is a parameter: a cached plan cannot then use the index
    // of queued runs (its WHERE is not implied), whose scan would read
    // every queued run, only the primary key (migration V13).
    let update = format!(
        "UPDATE runs SET state = 'claimed', runner_id = ?, manifest_hash = ?,
             lease_until_ms = ?, attempts = attempts + 1, claimed_ms = ?, updated_ms = ?,
             cpu_millis = ?, memory_bytes = ?, placement_note = NULL
         WHERE id = ? AND state = ?
         RETURNING {COLUMNS}, EXISTS (SELECT 1 FROM runs m WHERE m.org_id = runs.org_id
             AND m.environment = runs.environment AND m.state = 'queued'
             AND m.id <> runs.id) AS more_queued{open}",
        open = if inline_open { OPEN_OPS } else { "" }
    );
    let params = [
        ask.runner.into(),
        ask.manifest_hash.into(),
        (ask.now + ask.lease_ms).into(),
        ask.now.into(),
        ask.now.into(),
        ask.cpu_millis.into(),
        ask.memory_bytes.into(),
        queued.id.as_str().into(),
        crate::RunState::Queued.as_str().into(),
    ];
    // The event says what the statement writes: the row is the claim's
    // (locked on PostgreSQL), so its attempts do not move meanwhile.
    let attempt = queued.attempts + 1;
    let data = EventData::RunClaimed(RunClaimed {
        runner_id: ask.runner.to_owned(),
        manifest_hash: ask.manifest_hash.to_owned(),
        attempt,
        lease_until: stamp(ask.now + ask.lease_ms),
    });
    let claimed = [typed_event(data, &queued.id, ask.now)];
    let gone = || {
        StoreError::Corrupt(format!(
            "run {} was locked for the claim but is no longer queued",
            queued.id
        ))
    };
    // On PostgreSQL the statement that takes the run also appends its
    // event (the ledger's head locked there, the last write of the
    // claim's transaction): one round trip.
    let (row, appended) = if tx.dialect() == crate::Dialect::Postgres {
        let chain = events::InStatement::new(ask.org, &claimed)?;
        let row = chain
            .query_one(
                tx,
                &format!("taken AS ({update})"),
                params,
                Some("taken"),
                ", taken.* FROM taken",
            )?
            .ok_or_else(gone)?;
        (row, Some(chain))
    } else {
        (tx.query_one(&update, &params)?.ok_or_else(gone)?, None)
    };
    let run = decode(&row)?;
    if run.attempts != attempt {
        return Err(StoreError::Corrupt(format!(
            "run {} changed while its claim held it",
            run.id
        )));
    }
    match appended {
        Some(chain) => {
            chain.stored(&row)?;
        }
        None => {
            events::append(tx, ask.org, &claimed)?;
        }
    }
    let finish_now = queued.finish_wanted
        && if inline_open {
            row.int("open_ops")? == 0
        } else {
            get_with_open_ops(tx, ask.org, &run.id)?.is_some_and(|(_, open)| open == 0)
        };
    Ok(Claimed {
        more_queued: row.int("more_queued")? != 0,
        finish_now,
        run,
    })
}

/// [`Store::create_run`] inside `tx`.
pub(crate) fn create_run_in(
    tx: &mut dyn Tx,
    run: &NewRun<'_>,
    now: i64,
) -> Result<RunRow, StoreError> {
    let insert = "INSERT INTO runs (id, org_id, state, environment, max_attempts, inputs, created_ms, updated_ms, manifest_hash, manifest_pin, needs_classes)
             VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING";
    let values = [
        run.id.into(),
        run.org.into(),
        run.environment.into(),
        run.max_attempts.into(),
        serde_json::to_string(run.inputs)
            .map_err(|e| StoreError::Encode(e.to_string()))?
            .into(),
        now.into(),
        now.into(),
        run.manifest_hash.map(str::to_owned).into(),
        run.manifest_hash.map(str::to_owned).into(),
        moat_core::WorkloadClass::mask(run.needs_classes).into(),
    ];
    let created = |volumes: &[crate::RunVolume]| {
        typed_event(
            EventData::RunCreated(RunCreated {
                environment: run.environment.to_owned(),
                inputs: run.inputs.to_vec(),
                max_attempts: run.max_attempts,
                workload_classes: run.needs_classes.to_vec(),
                volumes: volumes
                    .iter()
                    .map(|v| moat_core::event_data::VolumeAttached {
                        volume: v.volume.clone(),
                        path: v.path.clone(),
                        read_only: v.read_only,
                        snapshot: v.start_snapshot.clone(),
                    })
                    .collect(),
            }),
            run.id,
            now,
        )
    };
    // A run with nothing to write beside it (the common case): on
    // PostgreSQL one statement inserts it, returns it and appends its
    // event after the ledger's head (which it holds for that statement
    // only). Otherwise the head is locked only once the rest is written,
    // as every append does: it serialises every writer.
    if tx.dialect() == crate::Dialect::Postgres && run.alone() {
        let created = [created(&[])];
        let chain = events::InStatement::new(run.org, &created)?;
        let Some(row) = chain.query_one(
            tx,
            &format!("ins AS ({insert} RETURNING {COLUMNS})"),
            values,
            Some("ins"),
            ", ins.* FROM ins",
        )?
        else {
            return Err(StoreError::Conflict(format!("run {}", run.id)));
        };
        chain.stored(&row)?;
        return decode(&row);
    }
    if tx.execute(insert, &values)? == 0 {
        return Err(StoreError::Conflict(format!("run {}", run.id)));
    }
    let volumes = crate::volumes::attach(tx, run.org, run.id, run.volumes)?;
    if !volumes.is_empty() {
        tx.execute(
            "UPDATE runs SET volumes = ? WHERE id = ?",
            &[crate::volumes::encode(&volumes)?.into(), run.id.into()],
        )?;
    }
    for blob in run.blobs {
        crate::objects::insert_artifact(tx, run.org, run.id, "", blob, now)?;
    }
    events::append(tx, run.org, &[created(&volumes)])?;
    get(tx, run.org, run.id)?.ok_or_else(|| StoreError::Corrupt("run vanished".into()))
}
