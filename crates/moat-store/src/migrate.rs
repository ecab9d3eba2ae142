//! The store's schema, as versioned migrations (`migrations/<backend>/V<n>__<name>.sql`,
//! applied in order by refinery when a store opens, recorded in
//! `moat_schema_history` with a checksum each). A released migration is
//! never edited: a change to the schema is a new file.
//!
//! Databases made before versioning (no history table) are adopted: they
//! get the one column added after the first release, then V1, whose
//! statements all say `IF NOT EXISTS`, is recorded over them unchanged.

use crate::{Dialect, StoreError, Tx};

mod sqlite_migrations {
    refinery::embed_migrations!("migrations/sqlite");
}

mod postgres_migrations {
    refinery::embed_migrations!("migrations/postgres");
}

/// Where refinery records what it applied.
const HISTORY: &str = "moat_schema_history";

/// PostgreSQL advisory lock key held while migrating, so replicas that
/// start together apply each migration once.
const MIGRATION_LOCK: i64 = 7700;

/// Columns added after the first release, before migrations were versioned.
const ADDED_BEFORE_VERSIONING: [(&str, &str, &str); 1] =
    [("runners", "slots", "BIGINT NOT NULL DEFAULT 1")];

fn runner(migrations: refinery::Runner) -> refinery::Runner {
    let mut runner = migrations
        // One transaction for the whole upgrade: a failed one leaves the
        // database as it was.
        .set_grouped(true)
        .set_abort_divergent(true)
        .set_abort_missing(true);
    runner.set_migration_table_name(HISTORY);
    runner
}

fn latest(migrations: &refinery::Runner) -> i64 {
    migrations
        .get_migrations()
        .iter()
        .map(|m| i64::from(m.version()))
        .max()
        .unwrap_or(0)
}

/// Brings an SQLite database to the newest schema.
pub(crate) fn sqlite(conn: &mut rusqlite::Connection) -> Result<(), StoreError> {
    {
        let mut tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        prepare(&mut tx, latest(&sqlite_migrations::migrations::runner()))?;
        tx.commit()?;
    }
    // Two processes opening a fresh file together may both try V1; the
    // loser finds it recorded on a second look.
    if runner(sqlite_migrations::migrations::runner())
        .run(conn)
        .is_err()
    {
        runner(sqlite_migrations::migrations::runner())
            .run(conn)
            .map_err(|e| StoreError::Migration(e.to_string()))?;
    }
    Ok(())
}

/// Brings a PostgreSQL database to the newest schema, under an advisory
/// lock held by this session for the whole upgrade.
pub(crate) fn postgres(conn: &mut crate::db::PgConn) -> Result<(), StoreError> {
    conn.client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])?;
    let result = (|| {
        let mut tx = conn.transaction()?;
        prepare(&mut tx, latest(&postgres_migrations::migrations::runner()))?;
        tx.commit()?;
        runner(postgres_migrations::migrations::runner())
            .run(&mut conn.client)
            .map_err(|e| StoreError::Migration(e.to_string()))?;
        Ok(())
    })();
    let unlocked = conn
        .client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]);
    result.and(unlocked.map(|_| ()).map_err(StoreError::from))
}

/// Refuses a database newer than this build, and adopts one from before
/// versioning.
fn prepare(tx: &mut dyn Tx, known: i64) -> Result<(), StoreError> {
    if table_exists(tx, HISTORY)? {
        let applied = tx
            .query_one(
                &format!("SELECT MAX(version) AS version FROM {HISTORY}"),
                &[],
            )?
            .map(|row| row.opt_int("version"))
            .transpose()?
            .flatten()
            .unwrap_or(0);
        if applied > known {
            return Err(StoreError::Migration(format!(
                "the database's schema is at version {applied}, newer than this moat \
                 knows (up to {known}): run a moat at least as new as the one that \
                 upgraded it"
            )));
        }
        return Ok(());
    }
    if table_exists(tx, "orgs")? {
        add_missing_columns(tx)?;
    }
    Ok(())
}

fn table_exists(tx: &mut dyn Tx, table: &str) -> Result<bool, StoreError> {
    let found = match tx.dialect() {
        Dialect::Sqlite => tx.query_one(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
            &[table.into()],
        )?,
        Dialect::Postgres => tx.query_one(
            "SELECT 1 FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_name = ?",
            &[table.into()],
        )?,
    };
    Ok(found.is_some())
}

fn add_missing_columns(tx: &mut dyn Tx) -> Result<(), StoreError> {
    for (table, column, kind) in ADDED_BEFORE_VERSIONING {
        let present = match tx.dialect() {
            Dialect::Sqlite => tx.query_one(
                "SELECT 1 FROM pragma_table_info(?) WHERE name = ?",
                &[table.into(), column.into()],
            )?,
            Dialect::Postgres => tx.query_one(
                "SELECT 1 FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = ? AND column_name = ?",
                &[table.into(), column.into()],
            )?,
        };
        if present.is_none() {
            tx.execute(
                &format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"),
                &[],
            )?;
        }
    }
    Ok(())
}
