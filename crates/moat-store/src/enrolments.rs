//! Runner enrolments: identity providers (issuer, audience, subject and
//! public keys) whose tokens register an org's runners.

use crate::{Row, Store, StoreError};

/// One enrolment. `jwks` is the JSON document as the org gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct EnrolmentRow {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub issuer: String,
    pub audience: String,
    pub subject: String,
    pub jwks: String,
    pub created_ms: i64,
    pub revoked_ms: Option<i64>,
}

const COLUMNS: &str = "id, org_id, name, issuer, audience, subject, jwks, created_ms, revoked_ms";

fn decode(row: &Row) -> Result<EnrolmentRow, StoreError> {
    Ok(EnrolmentRow {
        id: row.text("id")?,
        org_id: row.text("org_id")?,
        name: row.text("name")?,
        issuer: row.text("issuer")?,
        audience: row.text("audience")?,
        subject: row.text("subject")?,
        jwks: row.text("jwks")?,
        created_ms: row.int("created_ms")?,
        revoked_ms: row.opt_int("revoked_ms")?,
    })
}

impl Store {
    /// Adds an enrolment. `Conflict` if the org already has one of that
    /// name (or, never in practice, the made audience is taken).
    pub fn add_enrolment(&self, row: &EnrolmentRow) -> Result<(), StoreError> {
        let added = self.tx(|tx| {
            tx.execute(
                &format!(
                    "INSERT INTO runner_enrolments ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)"
                ),
                &[
                    row.id.as_str().into(),
                    row.org_id.as_str().into(),
                    row.name.as_str().into(),
                    row.issuer.as_str().into(),
                    row.audience.as_str().into(),
                    row.subject.as_str().into(),
                    row.jwks.as_str().into(),
                    row.created_ms.into(),
                ],
            )?;
            Ok(())
        });
        // The unique keys decide, so two replicas adding at once cannot
        // both succeed.
        match added {
            Err(e) if e.is_unique_violation() => {
                Err(StoreError::Conflict(format!("enrolment {:?}", row.name)))
            }
            other => other,
        }
    }

    /// The org's enrolments, revoked ones too, oldest first.
    pub fn enrolments(&self, org: &str) -> Result<Vec<EnrolmentRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM runner_enrolments WHERE org_id = ? ORDER BY created_ms, id"
                ),
                &[org.into()],
            )?
            .iter()
            .map(decode)
            .collect()
        })
    }

    /// The standing enrolment whose audience is `audience`, of any org.
    pub fn enrolment_for_audience(
        &self,
        audience: &str,
    ) -> Result<Option<EnrolmentRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                &format!(
                    "SELECT {COLUMNS} FROM runner_enrolments
                     WHERE audience = ? AND revoked_ms IS NULL"
                ),
                &[audience.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }

    /// Revokes the org's enrolment `id` (once); the enrolment as it now is,
    /// or `None` if the org has no such enrolment.
    pub fn revoke_enrolment(
        &self,
        org: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<EnrolmentRow>, StoreError> {
        self.tx(|tx| {
            tx.execute(
                "UPDATE runner_enrolments SET revoked_ms = ?
                 WHERE org_id = ? AND id = ? AND revoked_ms IS NULL",
                &[now.into(), org.into(), id.into()],
            )?;
            tx.query_one(
                &format!("SELECT {COLUMNS} FROM runner_enrolments WHERE org_id = ? AND id = ?"),
                &[org.into(), id.into()],
            )?
            .as_ref()
            .map(decode)
            .transpose()
        })
    }
}
