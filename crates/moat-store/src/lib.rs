//! The control plane's storage: orgs and tokens, runs and their claims, ops,
//! the hash-chained event ledger, artifacts, runner builds, registered
//! runners and published manifests — on embedded SQLite (one file, the
//! default) or PostgreSQL (shared by control-plane replicas), behind one
//! type whose logic is written once (see [`db`]).
//!
//! Every method takes the current time from the caller (milliseconds since
//! the epoch), so the control plane's clock can be injected in tests.
//!
//! The local, single-file ledger of `moat exec` and `moat shell` is
//! `moat-ledger`; this crate shares its chain rule and adds what only the
//! control plane needs (and the PostgreSQL client only it links).
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

mod approvals;
mod changes;
pub mod db;
mod enrolments;
mod events;
#[cfg(feature = "test-fixtures")]
mod fixtures;
mod gauges;
mod held;
mod known_tokens;
mod migrate;
mod objects;
mod ops;
mod orgs;
mod outputs;
mod quarantine;
mod queues;
mod quotas;
mod replan;
mod runners;
mod runs;
mod secrets;
mod tls;
mod turns;
mod usage;
mod volumes;

use std::sync::{Condvar, Mutex};

pub use approvals::{ApprovalRow, ApprovalState, NewApproval, Settled, Settlement};
pub use changes::{Change, ChangeFeed};
pub use db::{Dialect, Row, Tx, Value};
pub use enrolments::EnrolmentRow;
pub use events::Page;
#[cfg(feature = "test-fixtures")]
pub use fixtures::{TempPostgres, runner_row};
pub use gauges::Waiting;
pub use held::{HeldExport, HeldOutcome, HeldRow};
pub use objects::{ArtifactRow, Kept, ManifestRow, NewArtifact};
pub use ops::{NewOp, OpResult, OpRow, OpState, Redecided};
pub use orgs::TokenKind;
pub use outputs::{Outputs, OutputsError};
pub use quarantine::QuarantineRow;
pub use queues::{
    Delivery, KvSnapshot, MessageRow, MessageState, NewMessage, QueueRow, Settle,
    effects as queue_effects,
};
pub use runners::{RunnerPresence, RunnerRequest, RunnerRow, Standing};
pub use runs::{
    ClaimAsk, ClaimLook, Claimed, NewRun, NewRunContext, OpContext, PlacementAsk, PlacementRefusal,
    RunRow, RunState, stamp, typed_event,
};
pub use secrets::{SealedSecret, ToolRow, ToolTokenRow};
pub use usage::UsageDay;
pub use volumes::{Attach, Bytes as VolumeBytes, Found, NewHead, RunVolume, VolumeRow};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgresql: {}", with_causes(.0))]
    Postgres(#[from] postgres::Error),
    #[error("database URL {0:?}: expected sqlite:PATH or postgres://...")]
    Url(String),
    #[error("TLS to PostgreSQL: {0}")]
    Tls(String),
    #[error("database options: {0}")]
    Options(String),
    #[error("stored data is not what this version expects: {0}")]
    Corrupt(String),
    #[error("schema migration: {0}")]
    Migration(String),
    #[error("{0} already exists")]
    Conflict(String),
    #[error("no such {0}")]
    NoSuch(String),
    /// Held by someone else: what and by whom.
    #[error("{0}")]
    InUse(String),
    #[error("event cannot be serialised: {0}")]
    Encode(String),
}

/// `error` and what caused it (the PostgreSQL client's own message for a
/// failed TLS handshake or connection says only that it failed).
fn with_causes(error: &postgres::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text
}

impl StoreError {
    /// A PostgreSQL serialisation failure or deadlock: the transaction can be retried.
    fn retryable(&self) -> bool {
        match self {
            StoreError::Postgres(e) => e.code().is_some_and(|c| {
                *c == postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == postgres::error::SqlState::T_R_DEADLOCK_DETECTED
            }),
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                e.code == rusqlite::ErrorCode::DatabaseBusy
            }
            _ => false,
        }
    }

    /// A unique-key violation (on either backend).
    pub fn is_unique_violation(&self) -> bool {
        match self {
            StoreError::Postgres(e) => {
                e.code() == Some(&postgres::error::SqlState::UNIQUE_VIOLATION)
            }
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                e.code == rusqlite::ErrorCode::ConstraintViolation
            }
            _ => false,
        }
    }
}

enum Backend {
    Sqlite(Mutex<rusqlite::Connection>),
    Postgres(Box<PgPool>),
}

/// PostgreSQL connections, reused; at most [`POOL_MAX`] open at once (a
/// caller beyond that waits for one to come back), so one busy replica
/// cannot take the server's every connection.
struct PgPool {
    connect: tls::PgConnect,
    state: Mutex<PoolState>,
    /// Signalled when a connection comes back or a slot frees, only while
    /// a caller waits (a signal costs a system call even with no waiter).
    returned: Condvar,
    replan: replan::Replan,
}

const POOL_MAX: usize = 32;

#[derive(Default)]
struct PoolState {
    idle: Vec<db::PgConn>,
    /// Connections open in all, idle or taken.
    open: usize,
    /// Callers waiting for a connection.
    waiting: usize,
}

impl PoolState {
    /// Wakes one waiting caller, if any.
    fn wake_one(&self, returned: &Condvar) {
        if self.waiting > 0 {
            returned.notify_one();
        }
    }
}

impl PgPool {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, PoolState>, StoreError> {
        self.state
            .lock()
            .map_err(|_| StoreError::Corrupt("connection pool lock poisoned".into()))
    }

    /// Calls `body` with a connection whose prepared statements were
    /// planned for the tables as they are now (give or take a doubling),
    /// and takes it back however `body` ends. After a panic (caught
    /// further up in a build that unwinds; the release build aborts) the
    /// connection's state is not known, so it is closed rather than kept,
    /// and its slot freed; before, each such panic lost a slot for good,
    /// and once all [`POOL_MAX`] were lost every store call waited for
    /// ever.
    fn with<T>(
        &self,
        body: impl FnOnce(&mut db::PgConn) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.take_open()?;
        let used = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let epoch = self.replan.epoch(&mut conn.client);
            conn.replan_from(epoch);
            body(&mut conn)
        }));
        match used {
            Ok(result) => {
                self.give(conn, true);
                result
            }
            Err(panic) => {
                self.give(conn, false);
                std::panic::resume_unwind(panic)
            }
        }
    }

    fn take_open(&self) -> Result<db::PgConn, StoreError> {
        let mut state = self.lock()?;
        loop {
            while let Some(conn) = state.idle.pop() {
                if !conn.client.is_closed() {
                    return Ok(conn);
                }
                state.open -= 1;
            }
            if state.open < POOL_MAX {
                state.open += 1;
                drop(state);
                let opened = self.connect.connect().and_then(db::PgConn::new);
                if opened.is_err() {
                    let mut state = self.lock()?;
                    state.open -= 1;
                    state.wake_one(&self.returned);
                }
                return opened.map_err(StoreError::from);
            }
            state.waiting += 1;
            let woken = self.returned.wait(state);
            state =
                woken.map_err(|_| StoreError::Corrupt("connection pool lock poisoned".into()))?;
            state.waiting -= 1;
        }
    }

    /// Takes `conn` back: kept for the next caller, or (`keep` false, or
    /// the database closed it) closed and its slot freed.
    fn give(&self, conn: db::PgConn, keep: bool) {
        let Ok(mut state) = self.lock() else {
            // Poisoned: whoever waits is told (and finds it poisoned too).
            self.returned.notify_all();
            return;
        };
        if keep && !conn.client.is_closed() {
            state.idle.push(conn);
        } else {
            state.open -= 1;
        }
        state.wake_one(&self.returned);
    }
}

/// The store. Cheap to share behind an `Arc`; every method is one transaction.
pub struct Store {
    backend: Backend,
    /// Told of every event once the transaction that appended it commits.
    observer: std::sync::OnceLock<EventObserver>,
    /// Claims' turns within this process (see [`Store::claim`]).
    claim_turns: turns::ClaimTurns,
    /// Admin and agent tokens found (see [`Store::org_of_token`]).
    known_tokens: known_tokens::KnownTokens,
}

/// What [`Store::observe_appends`] calls with each committed batch.
pub type EventObserver = Box<dyn Fn(&[moat_core::Event]) + Send + Sync>;

impl Store {
    /// Opens `sqlite:PATH` or a PostgreSQL URL (`postgres://`, `postgresql://`,
    /// or a libpq `key=value` string), bringing its schema to this build's
    /// newest version (see [`migrate`]).
    pub fn open(url: &str) -> Result<Store, StoreError> {
        Store::open_with_password(url, None)
    }

    /// [`Store::open`], with PostgreSQL's password given apart from the URL
    /// (read from a file by the caller) rather than from `PGPASSWORD`.
    pub fn open_with_password(url: &str, password: Option<&str>) -> Result<Store, StoreError> {
        let mut backend = if let Some(path) = url.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(StoreError::Url(redact_url(url)));
            }
            if password.is_some() {
                return Err(StoreError::Options(
                    "a password is for PostgreSQL; a SQLite file takes none".into(),
                ));
            }
            let conn = rusqlite::Connection::open(path)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            Backend::Sqlite(Mutex::new(conn))
        } else if url.starts_with("postgres://")
            || url.starts_with("postgresql://")
            || url.contains("host=")
        {
            Backend::Postgres(Box::new(PgPool {
                connect: tls::PgConnect::parse(url, password)?,
                state: Mutex::new(PoolState::default()),
                returned: Condvar::new(),
                replan: replan::Replan::default(),
            }))
        } else {
            return Err(StoreError::Url(redact_url(url)));
        };
        match &mut backend {
            Backend::Sqlite(conn) => migrate::sqlite(
                conn.get_mut()
                    .map_err(|_| StoreError::Corrupt("store lock poisoned".into()))?,
            )?,
            Backend::Postgres(pool) => {
                pool.with(migrate::postgres)?;
            }
        }
        Ok(Store {
            backend,
            observer: std::sync::OnceLock::new(),
            claim_turns: turns::ClaimTurns::new(),
            known_tokens: known_tokens::KnownTokens::new(),
        })
    }

    /// Calls `observer` with the events each transaction appended, after it
    /// committed (never for one rolled back or retried). Once per store;
    /// false if an observer was already set. For the metrics: they count
    /// what the ledger holds, whichever handler wrote it.
    pub fn observe_appends(&self, observer: EventObserver) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// `attempt`, collecting what it appends for the observer (if any), who
    /// hears of it when it succeeded.
    fn observed<T>(
        &self,
        attempt: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(observer) = self.observer.get() else {
            return attempt();
        };
        let (result, appended) = events::collecting(attempt);
        if result.is_ok() && !appended.is_empty() {
            observer(&appended);
        }
        result
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Runs `body` in one transaction, committed if it returns `Ok`; retried
    /// (from the start) on a deadlock, serialisation failure or busy database.
    pub fn tx<T>(
        &self,
        mut body: impl FnMut(&mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        retrying(|| self.observed(|| self.tx_once(&mut body)))
    }

    /// Runs read-only `body`: on PostgreSQL without a transaction (each
    /// statement sees the latest commits; two round trips fewer), on
    /// SQLite in a deferred one. Nothing in `body` may write.
    pub fn read<T>(
        &self,
        mut body: impl FnMut(&mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match &self.backend {
            Backend::Sqlite(conn) => {
                sqlite_tx(conn, rusqlite::TransactionBehavior::Deferred, &mut body)
            }
            Backend::Postgres(pool) => pool.with(|conn| body(&mut conn.autocommit())),
        }
    }

    /// The database answers a statement (a readiness probe): on PostgreSQL
    /// on a connection from the pool, opened anew if the pooled ones died.
    pub fn ping(&self) -> Result<(), StoreError> {
        // A pooled connection the database ended fails once and is
        // dropped; the next look takes another (at most the pool's size),
        // so readiness follows the database as soon as it is back.
        let mut tries = 0;
        loop {
            match self.read(|tx| tx.query_one("SELECT 1 AS one", &[]).map(drop)) {
                Err(StoreError::Postgres(e))
                    if tries < POOL_MAX
                        && (e.is_closed()
                            || e.code() == Some(&postgres::error::SqlState::ADMIN_SHUTDOWN)) =>
                {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Runs `body`, which writes with ONE statement (an `UPDATE ...
    /// RETURNING`, an `INSERT ... ON CONFLICT`): on PostgreSQL without a
    /// transaction around it (a statement is atomic by itself; two round
    /// trips fewer), on SQLite in an immediate one.
    pub fn single<T>(
        &self,
        mut body: impl FnMut(&mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => self.tx(body),
            Backend::Postgres(pool) => {
                retrying(|| self.observed(|| pool.with(|conn| body(&mut conn.autocommit()))))
            }
        }
    }

    fn tx_once<T>(
        &self,
        body: &mut impl FnMut(&mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match &self.backend {
            Backend::Sqlite(conn) => {
                sqlite_tx(conn, rusqlite::TransactionBehavior::Immediate, body)
            }
            Backend::Postgres(pool) => pool.with(|conn| {
                let mut tx = conn.transaction()?;
                let value = body(&mut tx)?;
                tx.commit()?;
                Ok(value)
            }),
        }
    }
}

/// `attempt` again (up to 8 times, backing off) while it fails with a
/// deadlock, a serialisation failure or a busy database.
fn retrying<T>(mut attempt: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
    let mut retries = 0;
    loop {
        match attempt() {
            Err(e) if e.retryable() && retries < 8 => {
                retries += 1;
                std::thread::sleep(std::time::Duration::from_millis(5 << retries.min(6)));
            }
            other => return other,
        }
    }
}

/// `body` in one SQLite transaction of `behavior`, committed if it returns `Ok`.
fn sqlite_tx<T>(
    conn: &Mutex<rusqlite::Connection>,
    behavior: rusqlite::TransactionBehavior,
    body: &mut impl FnMut(&mut dyn Tx) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut conn = conn
        .lock()
        .map_err(|_| StoreError::Corrupt("store lock poisoned".into()))?;
    let mut tx = conn.transaction_with_behavior(behavior)?;
    let value = body(&mut tx)?;
    tx.commit()?;
    Ok(value)
}

/// `url` with any password in it masked, for messages and logs.
pub fn redact_url(url: &str) -> String {
    if url.starts_with("sqlite:") {
        return url.to_owned();
    }
    if tls::is_url(url)
        && let Some((scheme, rest)) = url.split_once("://")
    {
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let path = match path.split_once('?') {
            // A password may also be a query parameter.
            Some((path, query)) => format!(
                "{path}?{}",
                query
                    .split('&')
                    .map(|p| match p.split_once('=') {
                        Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                            format!("{key}=***")
                        }
                        _ => p.to_owned(),
                    })
                    .collect::<Vec<_>>()
                    .join("&")
            ),
            None => path.to_owned(),
        };
        return match authority.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}{path}"),
                None => format!("{scheme}://{userinfo}@{host}{path}"),
            },
            None => format!("{scheme}://{authority}{path}"),
        };
    }
    tls::redact_pairs(url)
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact_url("postgres://moat:s3cret@db.example:5432/moat"),
            "postgres://moat:***@db.example:5432/moat"
        );
        assert_eq!(
            redact_url("host=db user=moat password=s3cret dbname=moat"),
            "host=db user=moat password=*** dbname=moat"
        );
        assert_eq!(
            redact_url("sqlite:/var/lib/moat.db"),
            "sqlite:/var/lib/moat.db"
        );
        assert_eq!(
            redact_url("host=db password = 's3 cret' application_name=http://x"),
            "host=db password=*** application_name=http://x"
        );
        assert_eq!(
            redact_url("host=db password='unterminated s3cret"),
            "(a connection string that does not parse)"
        );
        assert_eq!(
            redact_url("postgres://moat@db/moat?sslmode=require&password=s3cret"),
            "postgres://moat@db/moat?sslmode=require&password=***"
        );
    }
}
