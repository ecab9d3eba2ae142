//! The control plane's storage: orgs and tokens, runs and their claims, ops,
//! the hash-chained event ledger, artifacts, runner builds, registered
//! runners and published manifests — on embedded SQLite (one file, the
//! default) or PostgreSQL (shared by control-plane replicas), behind one
//! type whose logic is written once (see [`db`]).
//!
//! Every method takes the current time from the caller (milliseconds since
//! the epoch), so the control plane's clock can be injected in tests.

pub mod db;
mod events;
mod objects;
mod ops;
mod orgs;
mod runners;
mod runs;
mod schema;

use std::sync::Mutex;

pub use db::{Dialect, Row, Tx, Value};
pub use events::Page;
pub use objects::{ArtifactRow, ManifestRow, NewArtifact};
pub use ops::{NewOp, OpResult, OpRow, OpState};
pub use orgs::TokenKind;
pub use runners::{RunnerRequest, RunnerRow, Standing};
pub use runs::{NewRun, RunRow, RunState, event, stamp};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgresql: {0}")]
    Postgres(#[from] postgres::Error),
    #[error("database URL {0:?}: expected sqlite:PATH or postgres://...")]
    Url(String),
    #[error("stored data is not what this version expects: {0}")]
    Corrupt(String),
    #[error("{0} already exists")]
    Conflict(String),
    #[error("event cannot be serialised: {0}")]
    Encode(String),
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
    Postgres(PgPool),
}

/// Idle PostgreSQL connections, reused; a new one is opened when none is free.
struct PgPool {
    config: postgres::Config,
    idle: Mutex<Vec<db::PgConn>>,
}

const POOL_IDLE_MAX: usize = 16;

impl PgPool {
    fn take(&self) -> Result<db::PgConn, StoreError> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        match idle {
            Some(conn) if !conn.client.is_closed() => Ok(conn),
            _ => Ok(db::PgConn::new(self.config.connect(postgres::NoTls)?)),
        }
    }

    fn give(&self, client: db::PgConn) {
        if client.client.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < POOL_IDLE_MAX {
                idle.push(client);
            }
        }
    }
}

/// The store. Cheap to share behind an `Arc`; every method is one transaction.
pub struct Store {
    backend: Backend,
}

impl Store {
    /// Opens `sqlite:PATH` or a PostgreSQL URL (`postgres://`, `postgresql://`,
    /// or a libpq `key=value` string), creating the schema if needed.
    pub fn open(url: &str) -> Result<Store, StoreError> {
        let backend = if let Some(path) = url.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(StoreError::Url(url.to_owned()));
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
            let mut config: postgres::Config =
                url.parse().map_err(|_| StoreError::Url(url.to_owned()))?;
            if config.get_password().is_none() {
                if let Ok(password) = std::env::var("PGPASSWORD") {
                    config.password(password);
                }
            }
            config.application_name("moat");
            Backend::Postgres(PgPool {
                config,
                idle: Mutex::new(Vec::new()),
            })
        } else {
            return Err(StoreError::Url(url.to_owned()));
        };
        let store = Store { backend };
        store.tx(schema::create)?;
        Ok(store)
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
        let mut attempt = 0;
        loop {
            let result = self.tx_once(&mut body);
            match result {
                Err(e) if e.retryable() && attempt < 8 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(5 << attempt.min(6)));
                }
                other => return other,
            }
        }
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
            Backend::Postgres(pool) => {
                let mut conn = pool.take()?;
                let result = body(&mut conn.autocommit());
                pool.give(conn);
                result
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
            Backend::Postgres(pool) => {
                let mut conn = pool.take()?;
                let result = (|| {
                    let mut tx = conn.transaction()?;
                    let value = body(&mut tx)?;
                    tx.commit()?;
                    Ok(value)
                })();
                pool.give(conn);
                result
            }
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

/// A random identifier: `prefix` and 16 bytes of hex.
pub fn new_id(prefix: &str) -> String {
    let mut bytes = [0u8; 16];
    random_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

/// Fills `buf` from the kernel's CSPRNG.
pub fn random_bytes(buf: &mut [u8]) {
    use std::io::Read;
    let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(buf));
    if filled.is_err() {
        // Without randomness no id or token is safe to hand out.
        std::process::abort();
    }
}

/// A PostgreSQL database of its own for one test, dropped afterwards.
/// The server comes from `MOAT_TEST_POSTGRES` (a libpq `key=value` string;
/// default: the local server's socket as the current user), as `.ci/run`
/// starts it.
#[doc(hidden)]
pub struct TempPostgres {
    admin: String,
    pub name: String,
    pub url: String,
}

#[doc(hidden)]
impl TempPostgres {
    pub fn create() -> Result<TempPostgres, StoreError> {
        let admin = std::env::var("MOAT_TEST_POSTGRES")
            .unwrap_or_else(|_| "host=/var/run/postgresql dbname=postgres".to_owned());
        let name = new_id("moat_test_");
        let mut client = admin
            .parse::<postgres::Config>()
            .map_err(|_| StoreError::Url(admin.clone()))?
            .connect(postgres::NoTls)?;
        client.batch_execute(&format!("CREATE DATABASE {name}"))?;
        // libpq key=value strings: a later key overrides an earlier one.
        let url = format!("{admin} dbname={name}");
        Ok(TempPostgres { admin, name, url })
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        if let Ok(config) = self.admin.parse::<postgres::Config>() {
            if let Ok(mut client) = config.connect(postgres::NoTls) {
                let _ = client.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ));
            }
        }
    }
}
