//! Registered runners and the nonces of their signed requests.

use crate::{Dialect, Row, Store, StoreError, Tx};

/// A registered runner: what it said about itself at bootstrap.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerRow {
    pub id: String,
    pub org_id: String,
    pub runner_hash: String,
    pub manifest_hash: String,
    pub policy_hash: String,
    pub version: String,
    pub environment: String,
    /// JSON array of op names.
    pub ops: serde_json::Value,
    pub sandbox_mode: String,
    pub boot_time: String,
    /// Base64 Ed25519 key its requests are signed with (one per boot).
    pub public_key: String,
    pub registered_ms: i64,
    pub seen_ms: i64,
    /// How many runs it serves at once (it said so at registration).
    pub slots: i64,
    /// Runs it holds now (claimed, running or paused); filled in on reads.
    pub slots_used: i64,
    /// The enrolment whose token it registered with (`None`: a bootstrap
    /// token).
    pub enrolment_id: Option<String>,
    /// The workload classes it offers, as bits ([`moat_core::WorkloadClass::bit`]).
    pub classes: i64,
    /// What its host can give (JSON of [`moat_core::host::HostFeatures`]),
    /// when it said.
    pub host_features: Option<String>,
    /// The host it runs on, when it said.
    pub host_id: Option<String>,
    /// The operator's labels, a JSON object of strings (`None`: none).
    pub labels: Option<String>,
    /// CPU (millicores) and memory (bytes) it may hand out to runs (0: it
    /// did not say; nothing is counted against it).
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// Told to drain: it claims nothing new.
    pub draining: bool,
    /// What the runs it holds reserve now; filled in on reads.
    pub cpu_reserved: i64,
    pub memory_reserved: i64,
}

const COLUMNS: &str = "id, org_id, runner_hash, manifest_hash, policy_hash, version, environment,
    ops, sandbox_mode, boot_time, public_key, registered_ms, seen_ms, slots, enrolment_id,
    classes, host_features, host_id, labels, cpu_millis, memory_bytes, draining";

/// `COLUMNS` and what the runs the runner holds now take of it.
const READ: &str =
    "SELECT id, org_id, runner_hash, manifest_hash, policy_hash, version, environment,
    ops, sandbox_mode, boot_time, public_key, registered_ms, seen_ms, slots, enrolment_id,
    classes, host_features, host_id, labels, cpu_millis, memory_bytes, draining,
    (SELECT COUNT(*) FROM runs WHERE runs.runner_id = runners.id
        AND runs.state IN ('claimed', 'running', 'paused')) AS slots_used,
    (SELECT CAST(COALESCE(SUM(runs.cpu_millis), 0) AS BIGINT) FROM runs WHERE runs.runner_id = runners.id
        AND runs.state IN ('claimed', 'running', 'paused')) AS cpu_reserved,
    (SELECT CAST(COALESCE(SUM(runs.memory_bytes), 0) AS BIGINT) FROM runs WHERE runs.runner_id = runners.id
        AND runs.state IN ('claimed', 'running', 'paused')) AS memory_reserved
    FROM runners";

fn decode(row: &Row) -> Result<RunnerRow, StoreError> {
    Ok(RunnerRow {
        id: row.text("id")?,
        org_id: row.text("org_id")?,
        runner_hash: row.text("runner_hash")?,
        manifest_hash: row.text("manifest_hash")?,
        policy_hash: row.text("policy_hash")?,
        version: row.text("version")?,
        environment: row.text("environment")?,
        ops: serde_json::from_str(&row.text("ops")?)
            .map_err(|e| StoreError::Corrupt(format!("runner ops: {e}")))?,
        sandbox_mode: row.text("sandbox_mode")?,
        boot_time: row.text("boot_time")?,
        public_key: row.text("public_key")?,
        registered_ms: row.int("registered_ms")?,
        seen_ms: row.int("seen_ms")?,
        slots: row.int("slots")?,
        slots_used: row.int("slots_used")?,
        enrolment_id: row.opt_text("enrolment_id")?,
        classes: row.int("classes")?,
        host_features: row.opt_text("host_features")?,
        host_id: row.opt_text("host_id")?,
        labels: row.opt_text("labels")?,
        cpu_millis: row.int("cpu_millis")?,
        memory_bytes: row.int("memory_bytes")?,
        draining: row.int("draining")? != 0,
        cpu_reserved: row.int("cpu_reserved")?,
        memory_reserved: row.int("memory_reserved")?,
    })
}

impl Store {
    pub fn register_runner(&self, runner: &RunnerRow) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                &format!(
                    "INSERT INTO runners ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                &[
                    runner.id.as_str().into(),
                    runner.org_id.as_str().into(),
                    runner.runner_hash.as_str().into(),
                    runner.manifest_hash.as_str().into(),
                    runner.policy_hash.as_str().into(),
                    runner.version.as_str().into(),
                    runner.environment.as_str().into(),
                    runner.ops.to_string().into(),
                    runner.sandbox_mode.as_str().into(),
                    runner.boot_time.as_str().into(),
                    runner.public_key.as_str().into(),
                    runner.registered_ms.into(),
                    runner.seen_ms.into(),
                    runner.slots.into(),
                    runner.enrolment_id.as_deref().into(),
                    runner.classes.into(),
                    runner.host_features.as_deref().into(),
                    runner.host_id.as_deref().into(),
                    runner.labels.as_deref().into(),
                    runner.cpu_millis.into(),
                    runner.memory_bytes.into(),
                    i64::from(runner.draining).into(),
                ],
            )?;
            Ok(())
        })
    }

    /// A runner by id (any org: request signatures are checked before scoping).
    pub fn runner(&self, id: &str) -> Result<Option<RunnerRow>, StoreError> {
        self.read(|tx| get(tx, id))
    }

    /// Every registered runner of every org (the capacity view).
    pub fn all_runners(&self) -> Result<Vec<RunnerRow>, StoreError> {
        self.read(|tx| {
            tx.query(&format!("{READ} ORDER BY host_id, registered_ms"), &[])?
                .iter()
                .map(decode)
                .collect()
        })
    }

    /// The live runs runners hold, as `(runner id, org id)`: who is present
    /// on each host.
    pub fn held_runs(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.read(|tx| {
            tx.query(
                "SELECT runner_id, org_id FROM runs
                 WHERE runner_id IS NOT NULL AND state IN ('claimed', 'running', 'paused')",
                &[],
            )?
            .iter()
            .map(|row| Ok((row.text("runner_id")?, row.text("org_id")?)))
            .collect()
        })
    }

    /// Tells `org`'s runner `id` to drain: it claims nothing new. `false`
    /// if the org has no such runner.
    pub fn drain_runner(&self, org: &str, id: &str) -> Result<bool, StoreError> {
        self.single(|tx| {
            Ok(tx.execute(
                "UPDATE runners SET draining = 1 WHERE org_id = ? AND id = ?",
                &[org.into(), id.into()],
            )? == 1)
        })
    }

    pub fn runners(&self, org: &str) -> Result<Vec<RunnerRow>, StoreError> {
        self.read(|tx| of_org(tx, org))
    }

    /// The presence of the org's runners, oldest first (see [`RunnerPresence`]).
    pub fn runner_presence(&self, org: &str) -> Result<Vec<RunnerPresence>, StoreError> {
        self.read(|tx| presence_of_org(tx, org))
    }

    /// Moves a runner to a refreshed manifest (hash and policy).
    pub fn set_runner_manifest(
        &self,
        id: &str,
        manifest_hash: &str,
        policy_hash: &str,
    ) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                "UPDATE runners SET manifest_hash = ?, policy_hash = ? WHERE id = ?",
                &[manifest_hash.into(), policy_hash.into(), id.into()],
            )?;
            Ok(())
        })
    }

    /// Forgets nonces whose requests could no longer be accepted anyway.
    pub fn prune_nonces(&self, now: i64) -> Result<u64, StoreError> {
        self.tx(|tx| {
            tx.execute(
                "DELETE FROM request_nonces WHERE expires_ms < ?",
                &[now.into()],
            )
        })
    }
}

/// SQL that holds when the runner row aliased `w` still stands: its build
/// allowed, its manifest published and unrevoked under an unrevoked key,
/// its enrolment (if any) unrevoked. Checked again inside the statements
/// that hand a runner work (a claim, an operation), so that a revocation
/// reaches a request that was already waiting when it happened.
pub(crate) const RUNNER_STANDS: &str = "EXISTS (SELECT 1 FROM runner_builds b
        WHERE b.org_id = w.org_id AND b.sha256 = w.runner_hash AND b.revoked = 0)
    AND EXISTS (SELECT 1 FROM manifests m WHERE m.org_id = w.org_id
        AND m.hash = w.manifest_hash AND m.revoked = 0
        AND NOT EXISTS (SELECT 1 FROM revoked_keys k
            WHERE k.org_id = m.org_id AND k.public_key = m.signed_by))
    AND (w.enrolment_id IS NULL OR EXISTS (SELECT 1 FROM runner_enrolments e
        WHERE e.id = w.enrolment_id AND e.revoked_ms IS NULL))";

/// A runner by id, in the caller's transaction.
pub(crate) fn get(tx: &mut dyn Tx, id: &str) -> Result<Option<RunnerRow>, StoreError> {
    tx.query_one(&format!("{READ} WHERE id = ?"), &[id.into()])?
        .as_ref()
        .map(decode)
        .transpose()
}

/// What the runs a runner holds take of it.
pub(crate) struct Held {
    pub runs: i64,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// On PostgreSQL, the names of the orgs other than the claim's whose
    /// runs runners on the runner's host hold now (runners that named no
    /// host count as one host), read in the same statement; `None` on
    /// SQLite, where they are read when needed.
    pub tenants: Option<Vec<String>>,
}

/// The live runs of orgs other than the claim's (its one parameter) on the
/// host of runner `w` (a row in scope), with their orgs as `o`; runners
/// that named no host count as one host. A `FROM` body: the placement
/// policy's `tenants`.
pub(crate) const HOST_TENANTS: &str = "runs r JOIN runners v ON v.id = r.runner_id
    JOIN orgs o ON o.id = r.org_id
    WHERE (v.host_id = w.host_id OR (v.host_id IS NULL AND w.host_id IS NULL))
      AND r.org_id <> ? AND r.state IN ('claimed', 'running', 'paused')";

/// A read [`held_if_standing`] makes in its statement (PostgreSQL): a
/// `SELECT` whose rows each have an `id` that is not null, with its
/// parameters, and the order its rows come back in (`ORDER BY` terms on
/// its columns, qualified `also.`).
pub(crate) struct AlsoRead<'a> {
    pub select: &'a str,
    pub params: &'a [crate::Value],
    pub order: &'a str,
}

/// What [`held_if_standing`] read.
pub(crate) struct HeldFigures {
    pub held: Held,
    /// The org's quota (`None`: none set).
    pub quota: Option<moat_core::quota::Quota>,
    /// The rows of its `also` read.
    pub also: Vec<crate::Row>,
}

/// What the runs of runner `id` take of it, if it still stands
/// ([`RUNNER_STANDS`]; `None`: it does not), with the quota of `org` (its
/// runner's) and, on PostgreSQL, the other tenants of its host and the
/// rows of `also`, if given: one statement, as a claim reads them under
/// its turns.
pub(crate) fn held_if_standing(
    tx: &mut dyn Tx,
    id: &str,
    org: &str,
    also: Option<AlsoRead<'_>>,
) -> Result<Option<HeldFigures>, StoreError> {
    let quota = crate::quotas::joined_columns("q");
    let postgres = tx.dialect() == Dialect::Postgres;
    let mut params: Vec<crate::Value> = Vec::new();
    if let Some(also) = &also {
        if !postgres {
            return Err(StoreError::Corrupt(
                "a read joined to a runner's figures is for PostgreSQL".into(),
            ));
        }
        params.extend(also.params.iter().cloned());
    }
    let tenants = if postgres {
        params.push(org.into());
        format!(
            ", (SELECT json_agg(t.name ORDER BY t.name)::text
                FROM (SELECT DISTINCT o.name FROM {HOST_TENANTS}) t) AS tenants"
        )
    } else {
        String::new()
    };
    params.extend([id.into(), org.into(), id.into()]);
    let figures = format!(
        "SELECT h.runs, h.cpu, h.memory, {quota}{tenants} FROM runners w
           CROSS JOIN (SELECT COUNT(*) AS runs, CAST(COALESCE(SUM(cpu_millis), 0) AS BIGINT) AS cpu,
                   CAST(COALESCE(SUM(memory_bytes), 0) AS BIGINT) AS memory
            FROM runs WHERE runner_id = ? AND state IN ('claimed', 'running', 'paused')) h
           LEFT JOIN org_quotas q ON q.org_id = ?
         WHERE w.id = ? AND {RUNNER_STANDS}"
    );
    let sql = match &also {
        // The figures once (materialized: the host's tenants are not
        // looked up again for each row joined), then each row of `also`
        // beside them, in its order.
        Some(also) => format!(
            "WITH also AS ({}), figures AS MATERIALIZED ({figures})
             SELECT figures.*, also.* FROM figures LEFT JOIN also ON TRUE ORDER BY {}",
            also.select, also.order
        ),
        None => figures,
    };
    let rows = tx.query(&sql, &params)?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let also_rows = if also.is_some() {
        let mut read = Vec::with_capacity(rows.len());
        for row in &rows {
            if row.opt_text("id")?.is_some() {
                read.push(row.clone());
            }
        }
        read
    } else {
        Vec::new()
    };
    let tenants = if postgres {
        let names = row.opt_text("tenants")?;
        Some(match names {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("a host's tenants: {e}")))?,
            None => Vec::new(),
        })
    } else {
        None
    };
    let held = Held {
        runs: row.int("runs")?,
        cpu_millis: row.int("cpu")?,
        memory_bytes: row.int("memory")?,
        tenants,
    };
    Ok(Some(HeldFigures {
        held,
        quota: crate::quotas::decode_joined(row)?,
        also: also_rows,
    }))
}

/// Runner `id` (`None`: no such runner), read as a claim takes its turns
/// (PostgreSQL, in one statement): transaction-scoped advisory locks, its
/// org's (`org_turn`, evaluated first, in the `FROM`), then its host's
/// (runners that named no host share one). Every claim takes them in that
/// order, so two turns never wait for each other crosswise; SQLite runs one
/// writing transaction at a time anyway.
pub(crate) fn get_taking_turns(
    tx: &mut dyn Tx,
    id: &str,
    org_turn: &str,
) -> Result<Option<RunnerRow>, StoreError> {
    let row = tx
        .query_one(
            &format!(
                "SELECT w.*, CASE WHEN w.id IS NULL THEN 0 ELSE (SELECT 1 FROM
                   (SELECT pg_advisory_xact_lock(hashtextextended('host:' || COALESCE(w.host_id, ''), 7701))) l)
                   END AS host_turn
                 FROM (SELECT 1 AS org_turn FROM (SELECT pg_advisory_xact_lock(hashtextextended(?, 7701))) o) t
                 LEFT JOIN ({READ} WHERE id = ?) w ON TRUE"
            ),
            &[org_turn.into(), id.into()],
        )?
        .ok_or_else(|| StoreError::Corrupt("a claim's turns read no row".into()))?;
    match row.opt_text("id")? {
        Some(_) => decode(&row).map(Some),
        None => Ok(None),
    }
}

/// Where a runner stands for one signed request.
#[derive(Debug, Clone)]
pub struct Standing {
    pub runner: RunnerRow,
    /// The request's nonce had not been used.
    pub fresh_nonce: bool,
    /// Its build is on the allowlist, unrevoked.
    pub build_allowed: bool,
    /// Its manifest is published, unrevoked, and its signing key stands.
    pub manifest_standing: bool,
    /// It came with a bootstrap token, or its enrolment is unrevoked.
    pub enrolment_standing: bool,
}

/// What [`Store::runner_request`] found.
#[derive(Debug, Clone)]
pub enum RunnerRequest {
    UnknownRunner,
    /// `verify` refused the request (bad signature): nothing was recorded.
    Refused(RunnerRow),
    Checked(Standing),
}

/// A runner with its build's, manifest's and enrolment's standing (no
/// count of held runs): what every signed request reads.
fn standing_select(filter: &str) -> String {
    format!(
        "SELECT {COLUMNS}, 0 AS slots_used, 0 AS cpu_reserved, 0 AS memory_reserved,
           EXISTS (SELECT 1 FROM runner_builds b WHERE b.org_id = r.org_id
                   AND b.sha256 = r.runner_hash AND b.revoked = 0) AS build_allowed,
           EXISTS (SELECT 1 FROM manifests m WHERE m.org_id = r.org_id
                   AND m.hash = r.manifest_hash AND m.revoked = 0
                   AND NOT EXISTS (SELECT 1 FROM revoked_keys k
                       WHERE k.org_id = m.org_id AND k.public_key = m.signed_by))
             AS manifest_standing,
           (r.enrolment_id IS NULL OR EXISTS (SELECT 1 FROM runner_enrolments e
                   WHERE e.id = r.enrolment_id AND e.revoked_ms IS NULL))
             AS enrolment_standing
         FROM runners r WHERE {filter}"
    )
}

fn standing_of(row: &Row, fresh_nonce: bool) -> Result<Standing, StoreError> {
    Ok(Standing {
        runner: decode(row)?,
        fresh_nonce,
        build_allowed: row.int("build_allowed")? == 1,
        manifest_standing: row.int("manifest_standing")? == 1,
        enrolment_standing: row.int("enrolment_standing")? == 1,
    })
}

impl Store {
    /// Everything a signed runner request needs: the runner; `verify` (the
    /// signature check, with the runner's key); then, only for a verified
    /// request, its nonce spent and its standing.
    ///
    /// `verified_with`: a key the caller already checked the request's
    /// signature with (the runner's key when last seen). While it is still
    /// the runner's key, the runner is read and the nonce spent in one
    /// statement on PostgreSQL; otherwise (a new key, no such runner) as
    /// without it.
    pub fn runner_request(
        &self,
        id: &str,
        nonce: &str,
        now: i64,
        nonce_expires_ms: i64,
        verified_with: Option<&str>,
        mut verify: impl FnMut(&RunnerRow) -> bool,
    ) -> Result<RunnerRequest, StoreError> {
        if let Some(key) = verified_with
            && let Some(standing) = self.spend_as(id, key, nonce, now, nonce_expires_ms)?
        {
            return Ok(RunnerRequest::Checked(standing));
        }
        // Otherwise in two round trips: the runner with its standing, then,
        // once its signature checks out with the key read, its nonce spent.
        let found = self.read(|tx| tx.query_one(&standing_select("r.id = ?"), &[id.into()]))?;
        let Some(row) = found else {
            return Ok(RunnerRequest::UnknownRunner);
        };
        let runner = decode(&row)?;
        if !verify(&runner) {
            return Ok(RunnerRequest::Refused(runner));
        }
        let fresh_nonce = self.single(|tx| spend_nonce(tx, id, nonce, nonce_expires_ms, now))?;
        Ok(RunnerRequest::Checked(standing_of(&row, fresh_nonce)?))
    }

    /// The request's nonce spent and the runner's standing read, if runner
    /// `id` still has `key` (`None`: nothing was recorded).
    fn spend_as(
        &self,
        id: &str,
        key: &str,
        nonce: &str,
        now: i64,
        nonce_expires_ms: i64,
    ) -> Result<Option<Standing>, StoreError> {
        let filter = "r.id = ? AND r.public_key = ?";
        self.single(|tx| {
            if tx.dialect() == Dialect::Sqlite {
                let Some(row) = tx.query_one(&standing_select(filter), &[id.into(), key.into()])?
                else {
                    return Ok(None);
                };
                let fresh = spend_nonce(tx, id, nonce, nonce_expires_ms, now)?;
                return standing_of(&row, fresh).map(Some);
            }
            // The nonce goes in only with the runner found with the key,
            // and still holding it as the statement writes (a new key
            // committed meanwhile: nothing recorded, no row).
            let Some(row) = tx.query_one(
                &format!(
                    "WITH found AS MATERIALIZED ({}),
                     seen AS (UPDATE runners SET seen_ms = ? FROM found
                         WHERE runners.id = found.id AND runners.public_key = ?
                         RETURNING runners.id),
                     fresh AS (INSERT INTO request_nonces (runner_id, nonce, expires_ms)
                         SELECT id, ?, ? FROM seen
                         ON CONFLICT (runner_id, nonce) DO NOTHING RETURNING 1)
                     SELECT found.*, (SELECT COUNT(*) FROM fresh) AS fresh FROM found
                     WHERE EXISTS (SELECT 1 FROM seen)",
                    standing_select(filter)
                ),
                &[
                    id.into(),
                    key.into(),
                    now.into(),
                    key.into(),
                    nonce.into(),
                    nonce_expires_ms.into(),
                ],
            )?
            else {
                return Ok(None);
            };
            let fresh = row.int("fresh")? == 1;
            standing_of(&row, fresh).map(Some)
        })
    }
}

/// Records a request's nonce (`false`: seen before, a replay) and that its
/// runner was seen `now`: one statement on PostgreSQL.
fn spend_nonce(
    tx: &mut dyn Tx,
    runner: &str,
    nonce: &str,
    expires_ms: i64,
    now: i64,
) -> Result<bool, StoreError> {
    match tx.dialect() {
        Dialect::Postgres => {
            let row = tx.query_one(
                "WITH fresh AS (
                     INSERT INTO request_nonces (runner_id, nonce, expires_ms) VALUES (?, ?, ?)
                     ON CONFLICT (runner_id, nonce) DO NOTHING RETURNING 1)
                 UPDATE runners SET seen_ms = ? FROM (SELECT COUNT(*) AS n FROM fresh) f
                 WHERE id = ? RETURNING f.n AS fresh",
                &[
                    runner.into(),
                    nonce.into(),
                    expires_ms.into(),
                    now.into(),
                    runner.into(),
                ],
            )?;
            Ok(row.map_or(Ok(0), |r| r.int("fresh"))? == 1)
        }
        Dialect::Sqlite => {
            let fresh = tx.execute(
                "INSERT INTO request_nonces (runner_id, nonce, expires_ms) VALUES (?, ?, ?)
                 ON CONFLICT (runner_id, nonce) DO NOTHING",
                &[runner.into(), nonce.into(), expires_ms.into()],
            )? == 1;
            tx.execute(
                "UPDATE runners SET seen_ms = ? WHERE id = ?",
                &[now.into(), runner.into()],
            )?;
            Ok(fresh)
        }
    }
}

/// Whether a runner is there to take a run, and what it offers: what says
/// why a queued run waits. Read without what the runner holds (three
/// lookups of its runs each), which that does not need.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerPresence {
    pub id: String,
    pub environment: String,
    pub seen_ms: i64,
    /// The workload classes it offers, as bits.
    pub classes: i64,
    pub draining: bool,
}

/// The presence of the org's runners, oldest first, in `tx`.
pub(crate) fn presence_of_org(
    tx: &mut dyn Tx,
    org: &str,
) -> Result<Vec<RunnerPresence>, StoreError> {
    tx.query(
        "SELECT id, environment, seen_ms, classes, draining FROM runners
         WHERE org_id = ? ORDER BY registered_ms, id",
        &[org.into()],
    )?
    .iter()
    .map(|row| {
        Ok(RunnerPresence {
            id: row.text("id")?,
            environment: row.text("environment")?,
            seen_ms: row.int("seen_ms")?,
            classes: row.int("classes")?,
            draining: row.int("draining")? != 0,
        })
    })
    .collect()
}

/// On PostgreSQL, the presence of the runners of org `o` (an alias of
/// the query it joins) as one JSON text column `runner_presence`: a
/// `LATERAL` join, so that a statement that reads the org anyway reads its
/// runners too, with no round trip of their own. Read by
/// [`presence_of_json`].
pub(crate) const PRESENCE_JOINED_PG: &str = "CROSS JOIN LATERAL (
       SELECT json_agg(json_build_array(w.id, w.environment, w.seen_ms, w.classes, w.draining)
                       ORDER BY w.registered_ms, w.id)::text AS runner_presence
       FROM runners w WHERE w.org_id = o.id) rp";

/// The runners [`PRESENCE_JOINED_PG`] read, oldest first.
pub(crate) fn presence_of_json(text: Option<String>) -> Result<Vec<RunnerPresence>, StoreError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let rows: Vec<(String, String, i64, i64, i64)> = serde_json::from_str(&text)
        .map_err(|e| StoreError::Corrupt(format!("runners' presence: {e}")))?;
    Ok(rows
        .into_iter()
        .map(
            |(id, environment, seen_ms, classes, draining)| RunnerPresence {
                id,
                environment,
                seen_ms,
                classes,
                draining: draining != 0,
            },
        )
        .collect())
}

/// The org's runners, oldest first, in `tx`.
pub(crate) fn of_org(tx: &mut dyn Tx, org: &str) -> Result<Vec<RunnerRow>, StoreError> {
    tx.query(
        &format!("{READ} WHERE org_id = ? ORDER BY registered_ms, id"),
        &[org.into()],
    )?
    .iter()
    .map(decode)
    .collect()
}
