//! The control plane's ledger: one hash chain over every org's events (the
//! chain rule of the local [`moat_ledger::Ledger`], over the org id and the
//! event's canonical JSON, so an event moved to another org breaks the
//! chain too); appends serialise on the head row, so two replicas never
//! fork the chain.

use moat_core::Event;

use crate::db::Dialect;
use crate::{Store, StoreError, Tx, Value};
use moat_ledger::Walk;
use moat_ledger::{StoredEvent, Verified, VerifyError, chain_hash};

/// What is hashed for one event: its org and its canonical JSON (which
/// holds its run and type).
fn chained(org: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(org.len() + 1 + body.len());
    bytes.extend_from_slice(org.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(body);
    bytes
}

/// Most events appended by one statement that also moves the head
/// ([`InStatement`]); more go in batches after the head is locked.
pub(crate) const IN_STATEMENT_MOST: usize = 8;

/// Most events in one INSERT statement.
const INSERT_BATCH: usize = 32;

/// A page of events and where the next one starts.
#[derive(Debug, Clone)]
pub struct Page {
    pub events: Vec<StoredEvent>,
    /// The last sequence number returned (or the `after` asked for).
    pub last_seq: i64,
}

thread_local! {
    /// What the transaction running on this thread appended, while the
    /// store has an observer (see `Store::observe_appends`).
    static APPENDED: std::cell::RefCell<Option<Vec<Event>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `attempt` (one transaction, on this thread) and returns what it
/// appended.
pub(crate) fn collecting<T>(attempt: impl FnOnce() -> T) -> (T, Vec<Event>) {
    /// Puts the enclosing collection back, even if `attempt` panics.
    struct Restore(Option<Option<Vec<Event>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0.take() {
                APPENDED.with(|a| *a.borrow_mut() = outer);
            }
        }
    }
    let restore = Restore(Some(APPENDED.with(|a| a.borrow_mut().replace(Vec::new()))));
    let result = attempt();
    let appended = APPENDED.with(|a| a.borrow_mut().take());
    drop(restore);
    (result, appended.unwrap_or_default())
}

const MOVE_HEAD: &str = "UPDATE ledger_head SET seq = ?, hash = ? WHERE id = 1";

/// Appends `events` of `org` after the head, in the caller's transaction.
pub fn append(
    tx: &mut dyn Tx,
    org: &str,
    events: &[Event],
) -> Result<Vec<StoredEvent>, StoreError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    if tx.dialect() == Dialect::Postgres && events.len() <= IN_STATEMENT_MOST {
        let chain = InStatement::new(org, events)?;
        let row = chain
            .query_one(tx, "", [], None, "")?
            .ok_or_else(|| StoreError::Corrupt("ledger head missing".into()))?;
        return chain.stored(&row);
    }
    let sql = format!(
        "SELECT seq AS head_seq, hash AS head_hash FROM ledger_head WHERE id = 1{}",
        tx.for_update()
    );
    let head = tx
        .query_one(&sql, &[])?
        .ok_or_else(|| StoreError::Corrupt("ledger head missing".into()))?;
    append_after(tx, org, events, &head)
}

/// As [`append`], after the head read and locked (`head_seq` and
/// `head_hash` of `head`).
fn append_after(
    tx: &mut dyn Tx,
    org: &str,
    events: &[Event],
    head: &crate::Row,
) -> Result<Vec<StoredEvent>, StoreError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let (mut seq, mut prev) = (head.int("head_seq")?, head.text("head_hash")?);
    let mut stored = Vec::with_capacity(events.len());
    let mut rows: Vec<Value> = Vec::with_capacity(events.len() * 7);
    for event in events {
        seq += 1;
        let body = moat_core::hash::canonical_json(event)
            .map_err(|e| StoreError::Encode(e.to_string()))?;
        let hash = chain_hash(&prev, seq, &chained(org, &body));
        rows.extend([
            seq.into(),
            org.into(),
            event.run_id.as_str().into(),
            event.event_type.as_str().into(),
            body.into(),
            prev.as_str().into(),
            hash.as_str().into(),
        ]);
        stored.push(StoredEvent {
            seq,
            prev_hash: std::mem::replace(&mut prev, hash.clone()),
            hash,
            event: event.clone(),
        });
    }
    // One statement per batch of rows: one round trip instead of one per
    // event. On PostgreSQL the last batch moves the head in the same
    // statement (a data-modifying WITH): one round trip less per append.
    let batches: Vec<&[Value]> = rows.chunks(7 * INSERT_BATCH).collect();
    let head = [Value::from(seq), Value::from(prev)];
    for (i, batch) in batches.iter().enumerate() {
        let tuples = vec!["(?, ?, ?, ?, ?, ?, ?)"; batch.len() / 7].join(", ");
        let insert = format!(
            "INSERT INTO events (seq, org_id, run_id, event_type, body, prev_hash, hash) VALUES {tuples}"
        );
        if i + 1 == batches.len() && tx.dialect() == Dialect::Postgres {
            let params: Vec<Value> = batch.iter().chain(&head).cloned().collect();
            tx.execute(&format!("WITH inserted AS ({insert}) {MOVE_HEAD}"), &params)?;
            note_appended(events);
            return Ok(stored);
        }
        tx.execute(&insert, batch)?;
    }
    tx.execute(MOVE_HEAD, &head)?;
    note_appended(events);
    Ok(stored)
}

/// PostgreSQL: `events` of `org` appended after the ledger's head inside
/// a statement of the caller's, as CTEs of its `WITH`: the head read and
/// locked, each event's hash computed by the database by the rule of
/// [`chain_hash`] (`sha256` over the previous hash, the sequence number
/// and [`chained`]), the events inserted and the head moved, in the one
/// statement. A single-statement write then needs no transaction of its
/// own, and the head is never held across a round trip. The chain the
/// database computed is checked against this process's own computation
/// when the row comes back ([`InStatement::stored`]).
pub(crate) struct InStatement<'a> {
    org: &'a str,
    events: &'a [Event],
    bodies: Vec<Vec<u8>>,
}

/// The chain's hash of the event after `prev` (a CTE with `seq` and
/// `hash`), over the bytes of the parameter (`chained`), as
/// [`chain_hash`] computes it. The text hashed is ASCII (hex and digits),
/// the same bytes in every database encoding.
const NEXT_HASH: &str = "encode(sha256(convert_to(p.hash || chr(10) || (p.seq + 1)::text || chr(10), 'UTF8') || ?::bytea), 'hex')";

impl<'a> InStatement<'a> {
    pub fn new(org: &'a str, events: &'a [Event]) -> Result<Self, StoreError> {
        if events.is_empty() || events.len() > IN_STATEMENT_MOST {
            // More would make a statement that grows with them (a CTE per
            // event): those go in batches (`append`).
            return Err(StoreError::Encode(format!(
                "{} events to append in one statement (1 to {IN_STATEMENT_MOST})",
                events.len()
            )));
        }
        let bodies = events
            .iter()
            .map(|event| {
                moat_core::hash::canonical_json(event)
                    .map_err(|e| StoreError::Encode(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        Ok(InStatement {
            org,
            events,
            bodies,
        })
    }

    /// The CTEs (to follow the caller's own in its `WITH`, after a comma)
    /// and their parameters, in order. With `gate`, the name of a CTE of
    /// the caller's, nothing is appended (nor the head locked) unless it
    /// yields a row.
    fn ctes(&self, gate: Option<&str>) -> (String, Vec<Value>) {
        let gate = gate
            .map(|cte| format!(" AND EXISTS (SELECT 1 FROM {cte})"))
            .unwrap_or_default();
        let mut sql = format!(
            "chain_head AS MATERIALIZED (SELECT h.seq, h.hash FROM ledger_head h
                 WHERE h.id = 1{gate} FOR UPDATE OF h)"
        );
        let mut params = Vec::with_capacity(self.events.len() * 5);
        let mut prev = "chain_head".to_owned();
        for (i, body) in self.bodies.iter().enumerate() {
            sql.push_str(&format!(
                ",\n chain_{i} AS MATERIALIZED (SELECT p.seq + 1 AS seq, p.hash AS prev_hash,
                     {NEXT_HASH} AS hash FROM {prev} p)"
            ));
            params.push(Value::from(chained(self.org, body)));
            prev = format!("chain_{i}");
        }
        let rows: Vec<String> = (0..self.events.len())
            .map(|i| {
                format!(
                    "SELECT seq, ?::text, ?::text, ?::text, ?::bytea, prev_hash, hash FROM chain_{i}"
                )
            })
            .collect();
        for (event, body) in self.events.iter().zip(&self.bodies) {
            params.extend([
                Value::from(self.org),
                Value::from(event.run_id.as_str()),
                Value::from(event.event_type.as_str()),
                Value::from(body.clone()),
            ]);
        }
        sql.push_str(&format!(
            ",\n chain_inserted AS (INSERT INTO events
                 (seq, org_id, run_id, event_type, body, prev_hash, hash) {}),
             chain_moved AS (UPDATE ledger_head SET seq = c.seq, hash = c.hash
                 FROM {prev} c WHERE ledger_head.id = 1)",
            rows.join(" UNION ALL ")
        ));
        (sql, params)
    }

    /// Runs `WITH {with}, <the chain's CTEs> SELECT <the chain's
    /// columns>{and_select}` in `tx`: `with`, the caller's own CTEs (or
    /// nothing), takes `params`, the chain's parameters follow; `gate` as
    /// for [`InStatement::ctes`]; `and_select`, the rest of the `SELECT`
    /// (more columns after a comma, a `FROM`), may be empty and takes no
    /// parameters (they would be numbered after the chain's). Needs
    /// PostgreSQL 12 or later (`MATERIALIZED`).
    pub fn query_one(
        &self,
        tx: &mut dyn Tx,
        with: &str,
        params: impl IntoIterator<Item = Value>,
        gate: Option<&str>,
        and_select: &str,
    ) -> Result<Option<crate::Row>, StoreError> {
        let (ctes, chained) = self.ctes(gate);
        let params: Vec<Value> = params.into_iter().chain(chained).collect();
        let with = if with.is_empty() {
            ctes
        } else {
            format!("{with}, {ctes}")
        };
        tx.query_one(
            &format!("WITH {with} SELECT {}{and_select}", self.columns()),
            &params,
        )
    }

    /// The columns the caller's final `SELECT` returns for
    /// [`InStatement::stored`] (scalar subqueries: no join needed).
    fn columns(&self) -> String {
        format!(
            "(SELECT seq FROM chain_head) AS head_seq, (SELECT hash FROM chain_head) AS head_hash,
             (SELECT hash FROM chain_{}) AS chain_last",
            self.events.len().saturating_sub(1)
        )
    }

    /// What was appended, from the caller's row (see
    /// [`InStatement::columns`]): the chain computed here from the head the
    /// statement read must end where the database's did; if not, the
    /// database does not hash as this build does: an error (a caller's
    /// transaction rolls back; a statement alone was written, and the
    /// ledger's verification will name the event).
    pub fn stored(self, row: &crate::Row) -> Result<Vec<StoredEvent>, StoreError> {
        let head = row.opt_int("head_seq")?.zip(row.opt_text("head_hash")?);
        let (mut seq, mut prev) =
            head.ok_or_else(|| StoreError::Corrupt("ledger head missing".into()))?;
        let mut stored = Vec::with_capacity(self.events.len());
        for (event, body) in self.events.iter().zip(&self.bodies) {
            seq += 1;
            let hash = chain_hash(&prev, seq, &chained(self.org, body));
            stored.push(StoredEvent {
                seq,
                prev_hash: std::mem::replace(&mut prev, hash.clone()),
                hash,
                event: event.clone(),
            });
        }
        if row.text("chain_last")? != prev {
            return Err(StoreError::Corrupt(format!(
                "the database's chain hash for event #{seq} is not this build's"
            )));
        }
        note_appended(self.events);
        Ok(stored)
    }
}

fn note_appended(events: &[Event]) {
    APPENDED.with(|a| {
        if let Some(appended) = a.borrow_mut().as_mut() {
            appended.extend_from_slice(events);
        }
    });
}

fn decode(row: &crate::Row) -> Result<StoredEvent, StoreError> {
    let seq = row.int("seq")?;
    let event = serde_json::from_slice(&row.blob("body")?)
        .map_err(|e| StoreError::Corrupt(format!("event #{seq}: {e}")))?;
    Ok(StoredEvent {
        seq,
        prev_hash: row.text("prev_hash")?,
        hash: row.text("hash")?,
        event,
    })
}

impl Store {
    /// Appends `events` of `org` in their own transaction.
    pub fn append_events(
        &self,
        org: &str,
        events: &[Event],
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.tx(|tx| append(tx, org, events))
    }

    /// Appends `event` of `org` if its run is one of the org's (`false`:
    /// no such run, nothing appended). On PostgreSQL the look for the run
    /// and the append are one statement, with no transaction around it.
    pub fn append_run_event(&self, org: &str, event: &Event) -> Result<bool, StoreError> {
        let run = event.run_id.as_str();
        let exists =
            "EXISTS (SELECT 1 FROM runs r WHERE r.org_id IS NOT DISTINCT FROM ? AND r.id = ?)";
        if self.backend() == "postgres" {
            let events = std::slice::from_ref(event);
            return self.single(|tx| {
                let chain = InStatement::new(org, events)?;
                let row = chain
                    .query_one(
                        tx,
                        &format!("found AS MATERIALIZED (SELECT 1 AS one WHERE {exists})"),
                        [org.into(), run.into()],
                        Some("found"),
                        ", (SELECT COUNT(*) FROM found) AS found",
                    )?
                    .ok_or_else(|| StoreError::Corrupt("no row".into()))?;
                if row.int("found")? != 1 {
                    return Ok(false);
                }
                chain.stored(&row)?;
                Ok(true)
            });
        }
        self.tx(|tx| {
            let found = tx.query_one(
                &format!("SELECT {exists} AS found"),
                &[org.into(), run.into()],
            )?;
            if found.map(|row| row.int("found")).transpose()? != Some(1) {
                return Ok(false);
            }
            append(tx, org, std::slice::from_ref(event))?;
            Ok(true)
        })
    }

    /// Events of `org` after `after` (oldest first), of one run if given.
    pub fn events(
        &self,
        org: &str,
        run: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Page, StoreError> {
        self.read(|tx| {
            let rows = match run {
                Some(run) => tx.query(
                    "SELECT seq, body, prev_hash, hash FROM events
                     WHERE org_id = ? AND run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    &[org.into(), run.into(), after.into(), limit.into()],
                )?,
                None => tx.query(
                    "SELECT seq, body, prev_hash, hash FROM events
                     WHERE org_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    &[org.into(), after.into(), limit.into()],
                )?,
            };
            let events = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
            let last_seq = events.last().map_or(after, |e| e.seq);
            Ok(Page { events, last_seq })
        })
    }

    /// Every event of every org in chain order, `limit` after `after`
    /// (operators' view and tests that check the whole ledger).
    pub fn all_events(&self, after: i64, limit: i64) -> Result<Vec<StoredEvent>, StoreError> {
        self.read(|tx| {
            tx.query(
                "SELECT seq, body, prev_hash, hash FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
                &[after.into(), limit.into()],
            )?
            .iter()
            .map(decode)
            .collect()
        })
    }

    /// Every event of one run, whichever org it is in, in chain order (the
    /// auditor's view; run ids are unique across orgs).
    pub fn events_of_run(&self, run: &str) -> Result<Vec<StoredEvent>, StoreError> {
        self.read(|tx| {
            tx.query(
                "SELECT seq, body, prev_hash, hash FROM events WHERE run_id = ? ORDER BY seq",
                &[run.into()],
            )?
            .iter()
            .map(decode)
            .collect()
        })
    }

    /// The chain's head: the last sequence number and its hash.
    pub fn ledger_head(&self) -> Result<(i64, String), StoreError> {
        self.read(|tx| {
            let head = tx
                .query_one("SELECT seq, hash FROM ledger_head WHERE id = 1", &[])?
                .ok_or_else(|| StoreError::Corrupt("ledger head missing".into()))?;
            Ok((head.int("seq")?, head.text("hash")?))
        })
    }

    /// Recomputes the whole chain; `Ok(Err(_))` names the first break.
    pub fn verify_ledger(&self) -> Result<Result<Verified, VerifyError>, StoreError> {
        let head = self.tx(|tx| {
            tx.query_one("SELECT seq, hash FROM ledger_head WHERE id = 1", &[])?
                .ok_or_else(|| StoreError::Corrupt("ledger head missing".into()))
        })?;
        let (head_seq, head_hash) = (head.int("seq")?, head.text("hash")?);
        let mut walk = Walk::new();
        // Up to the head read first: later appends are for the next check.
        while walk.expected() <= head_seq {
            let rows = self.read(|tx| {
                tx.query(
                    "SELECT seq, body, prev_hash, hash, org_id, run_id, event_type FROM events
                     WHERE seq >= ? AND seq <= ? ORDER BY seq LIMIT 1000",
                    &[Value::Int(walk.expected()), Value::Int(head_seq)],
                )
            })?;
            if rows.is_empty() {
                break;
            }
            for row in rows {
                let seq = row.int("seq")?;
                let body = row.blob("body")?;
                let hashed = chained(&row.text("org_id")?, &body);
                if let Err(broken) =
                    walk.step(seq, &row.text("prev_hash")?, &row.text("hash")?, &hashed)
                {
                    return Ok(Err(broken));
                }
                // The columns queries filter on must say what the hashed body says.
                let event: Event = serde_json::from_slice(&body)
                    .map_err(|e| StoreError::Corrupt(format!("event #{seq}: {e}")))?;
                if event.run_id != row.text("run_id")?
                    || event.event_type.as_str() != row.text("event_type")?
                {
                    return Ok(Err(VerifyError::Edited(seq)));
                }
            }
        }
        Ok(walk.finish(head_seq, &head_hash))
    }
}
