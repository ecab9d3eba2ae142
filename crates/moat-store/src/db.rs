//! One SQL surface over SQLite and PostgreSQL: the store's logic is written
//! once against [`Tx`], and each backend only moves values in and out.
//!
//! Statements use `?` placeholders (rewritten to `$n` for PostgreSQL) and
//! the common subset of both dialects (`ON CONFLICT`, `RETURNING`); the few
//! places that differ ask [`Tx::dialect`].

use std::collections::HashMap;
use std::sync::Arc;

use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::StoreError;

/// Which SQL dialect a transaction speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A parameter or a column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Blob(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// One result row: values read by column name (the name a `SELECT` gives
/// a column, or its `AS` alias; lower case, as PostgreSQL folds them), so
/// a reordered or widened select list cannot shift what a field reads.
#[derive(Debug, Clone)]
pub struct Row {
    columns: Arc<[String]>,
    values: Vec<Value>,
}

impl Row {
    pub fn new(columns: Arc<[String]>, values: Vec<Value>) -> Row {
        Row { columns, values }
    }

    fn at(&self, name: &str) -> Result<&Value, StoreError> {
        self.columns
            .iter()
            .position(|c| c == name)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| StoreError::Corrupt(format!("column {name} missing")))
    }

    pub fn int(&self, name: &str) -> Result<i64, StoreError> {
        match self.at(name)? {
            Value::Int(v) => Ok(*v),
            other => Err(StoreError::Corrupt(format!(
                "column {name}: expected an integer, found {other:?}"
            ))),
        }
    }

    pub fn opt_int(&self, name: &str) -> Result<Option<i64>, StoreError> {
        match self.at(name)? {
            Value::Null => Ok(None),
            _ => self.int(name).map(Some),
        }
    }

    pub fn text(&self, name: &str) -> Result<String, StoreError> {
        self.opt_text(name)?
            .ok_or_else(|| StoreError::Corrupt(format!("column {name}: unexpected NULL")))
    }

    pub fn opt_text(&self, name: &str) -> Result<Option<String>, StoreError> {
        match self.at(name)? {
            Value::Null => Ok(None),
            Value::Text(v) => Ok(Some(v.clone())),
            other => Err(StoreError::Corrupt(format!(
                "column {name}: expected text, found {other:?}"
            ))),
        }
    }

    pub fn blob(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        match self.at(name)? {
            Value::Blob(v) => Ok(v.clone()),
            Value::Text(v) => Ok(v.clone().into_bytes()),
            other => Err(StoreError::Corrupt(format!(
                "column {name}: expected bytes, found {other:?}"
            ))),
        }
    }
}

/// An open transaction on either backend.
pub trait Tx {
    fn dialect(&self) -> Dialect;
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, StoreError>;
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError>;

    fn query_one(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>, StoreError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// `FOR UPDATE SKIP LOCKED` where rows can be locked (PostgreSQL); SQLite
    /// transactions here take the write lock up front, which serialises claims.
    fn skip_locked(&self) -> &'static str {
        match self.dialect() {
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        }
    }

    /// `FOR UPDATE` on PostgreSQL (row lock held to commit); nothing on SQLite.
    fn for_update(&self) -> &'static str {
        match self.dialect() {
            Dialect::Postgres => " FOR UPDATE",
            Dialect::Sqlite => "",
        }
    }
}

// ---- SQLite -------------------------------------------------------------

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(v) => ValueRef::Integer(*v),
            Value::Text(v) => ValueRef::Text(v.as_bytes()),
            Value::Blob(v) => ValueRef::Blob(v),
        }))
    }
}

impl Tx for rusqlite::Transaction<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, StoreError> {
        let mut stmt = self.prepare_cached(sql)?;
        let n = stmt.execute(rusqlite::params_from_iter(params.iter()))?;
        Ok(n as u64)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        use rusqlite::types::ValueRef;
        let mut stmt = self.prepare_cached(sql)?;
        let names: Arc<[String]> = stmt.column_names().into_iter().map(str::to_owned).collect();
        let columns = names.len();
        let mut rows = stmt.query(rusqlite::params_from_iter(params.iter()))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let mut values = Vec::with_capacity(columns);
            for i in 0..columns {
                values.push(match row.get_ref(i)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(v) => Value::Int(v),
                    ValueRef::Real(v) => Value::Int(v as i64),
                    ValueRef::Text(v) => Value::Text(String::from_utf8_lossy(v).into_owned()),
                    ValueRef::Blob(v) => Value::Blob(v.to_vec()),
                });
            }
            out.push(Row::new(Arc::clone(&names), values));
        }
        Ok(out)
    }
}

// ---- PostgreSQL ---------------------------------------------------------

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut postgres::types::private::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(v) if *ty == Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
            Value::Int(v) if *ty == Type::BOOL => (*v != 0).to_sql(ty, out),
            Value::Int(v) => v.to_sql(ty, out),
            Value::Text(v) => v.to_sql(ty, out),
            Value::Blob(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// `?` placeholders as `$1, $2, ...` (statements here never hold a literal `?`).
pub(crate) fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

fn pg_params(params: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// PostgreSQL plans a prepared statement for its parameters at each of its
/// first five uses, then settles on a generic plan when that costs no more
/// (which every hot statement of the store's did: six plans each time it
/// was prepared). A connection prepares each statement anew whenever a table
/// has doubled, so on a growing database those five plans came back for
/// every statement on every pooled connection: measured on the benchmark's
/// batch, a sixteenth of the statements' executions planned, and planning
/// a ninth of the database's time. The generic plan from the first use
/// is the one it settled on anyway.
///
/// Set only where it is not already (one round trip either way): behind a
/// pooler in transaction mode a session's `SET` would stay on whichever
/// server connection ran it, so there the setting belongs on the role
/// (`ALTER ROLE ... SET plan_cache_mode = force_generic_plan`, see
/// docs/capacity.md), and then nothing is set here.
const GENERIC_PLANS: &str = "SELECT set_config('plan_cache_mode', 'force_generic_plan', false)
     WHERE current_setting('plan_cache_mode') <> 'force_generic_plan'";

/// A pooled PostgreSQL connection with its prepared statements: each
/// statement text is parsed once per connection, not once per use.
pub(crate) struct PgConn {
    pub client: postgres::Client,
    statements: HashMap<String, postgres::Statement>,
    /// The pool's plan epoch its statements were prepared in (see
    /// `replan`).
    epoch: u64,
}

impl PgConn {
    /// A pooled connection on `client`, with its statements planned
    /// generically from their first use (see [`GENERIC_PLANS`]).
    pub fn new(mut client: postgres::Client) -> Result<Self, postgres::Error> {
        client.batch_execute(GENERIC_PLANS)?;
        Ok(PgConn {
            client,
            statements: HashMap::new(),
            epoch: 0,
        })
    }

    /// Drops its prepared statements (to be prepared, and planned, anew)
    /// if they were prepared before `epoch`.
    pub fn replan_from(&mut self, epoch: u64) {
        if self.epoch != epoch {
            self.statements.clear();
            self.epoch = epoch;
        }
    }

    pub fn transaction(&mut self) -> Result<PgTx<'_>, StoreError> {
        Ok(PgTx {
            tx: self.client.transaction()?,
            statements: &mut self.statements,
        })
    }
}

/// A transaction on a [`PgConn`].
pub(crate) struct PgTx<'a> {
    tx: postgres::Transaction<'a>,
    statements: &'a mut HashMap<String, postgres::Statement>,
}

/// Single statements on a [`PgConn`] without a transaction (reads).
pub(crate) struct PgAuto<'a> {
    client: &'a mut postgres::Client,
    statements: &'a mut HashMap<String, postgres::Statement>,
}

impl PgConn {
    pub fn autocommit(&mut self) -> PgAuto<'_> {
        PgAuto {
            client: &mut self.client,
            statements: &mut self.statements,
        }
    }
}

impl PgTx<'_> {
    pub fn commit(self) -> Result<(), StoreError> {
        Ok(self.tx.commit()?)
    }
}

/// `sql` prepared once per connection.
fn statement(
    client: &mut impl postgres::GenericClient,
    statements: &mut HashMap<String, postgres::Statement>,
    sql: &str,
) -> Result<postgres::Statement, StoreError> {
    if let Some(statement) = statements.get(sql) {
        return Ok(statement.clone());
    }
    let statement = client.prepare(&numbered(sql))?;
    statements.insert(sql.to_owned(), statement.clone());
    Ok(statement)
}

fn pg_execute(
    client: &mut impl postgres::GenericClient,
    statements: &mut HashMap<String, postgres::Statement>,
    sql: &str,
    params: &[Value],
) -> Result<u64, StoreError> {
    let prepared = statement(client, statements, sql)?;
    Ok(client.execute(&prepared, &pg_params(params))?)
}

fn pg_query(
    client: &mut impl postgres::GenericClient,
    statements: &mut HashMap<String, postgres::Statement>,
    sql: &str,
    params: &[Value],
) -> Result<Vec<Row>, StoreError> {
    let prepared = statement(client, statements, sql)?;
    let names: Arc<[String]> = prepared
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let rows = client.query(&prepared, &pg_params(params))?;
    rows.iter().map(|row| pg_row(row, &names)).collect()
}

impl Tx for PgTx<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, StoreError> {
        pg_execute(&mut self.tx, self.statements, sql, params)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        pg_query(&mut self.tx, self.statements, sql, params)
    }
}

impl Tx for PgAuto<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, StoreError> {
        pg_execute(self.client, self.statements, sql, params)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        pg_query(self.client, self.statements, sql, params)
    }
}

fn pg_row(row: &postgres::Row, names: &Arc<[String]>) -> Result<Row, StoreError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let ty = column.type_();
        let value = if *ty == Type::INT8 {
            row.try_get::<_, Option<i64>>(i)?.map(Value::Int)
        } else if *ty == Type::INT4 {
            row.try_get::<_, Option<i32>>(i)?
                .map(|v| Value::Int(v.into()))
        } else if *ty == Type::BOOL {
            row.try_get::<_, Option<bool>>(i)?
                .map(|v| Value::Int(v.into()))
        } else if *ty == Type::BYTEA {
            row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob)
        } else {
            row.try_get::<_, Option<String>>(i)?.map(Value::Text)
        };
        values.push(value.unwrap_or(Value::Null));
    }
    Ok(Row::new(Arc::clone(names), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_by_name_whatever_the_order() -> Result<(), StoreError> {
        let mut conn = rusqlite::Connection::open_in_memory()?;
        let mut tx = conn.transaction()?;
        let row = Tx::query_one(&mut tx, "SELECT 'x' AS b, 7 AS a, NULL AS c", &[])?
            .ok_or_else(|| StoreError::Corrupt("no row".into()))?;
        assert_eq!(row.int("a")?, 7);
        assert_eq!(row.text("b")?, "x");
        assert_eq!(row.opt_text("c")?, None);
        assert!(matches!(row.int("d"), Err(StoreError::Corrupt(m)) if m.contains("column d")));
        assert!(row.int("b").is_err(), "text read as an integer");
        Ok(())
    }

    #[test]
    fn placeholders_are_numbered_in_order() {
        assert_eq!(
            numbered("SELECT a FROM t WHERE b = ? AND c > ?"),
            "SELECT a FROM t WHERE b = $1 AND c > $2"
        );
    }
}
