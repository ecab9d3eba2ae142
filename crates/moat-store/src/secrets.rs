//! The credential proxy's storage: an org's secrets, sealed by the control
//! plane before they get here (this module never sees a plaintext), and its
//! tool definitions (which name secrets, never hold them).

use crate::{Store, StoreError};

/// A sealed secret as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SealedSecret {
    pub name: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
    pub updated_ms: i64,
}

/// A tool definition as stored (JSON, checked by the control plane).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRow {
    pub name: String,
    pub definition: serde_json::Value,
    pub updated_ms: i64,
}

/// A secret as a row of `secrets` holds it.
fn sealed(row: &crate::Row) -> Result<SealedSecret, StoreError> {
    sealed_as(row, "")
}

/// A sealed secret from columns named `{prefix}name` and so on (a row
/// that joins secrets to another table's columns).
pub(crate) fn sealed_as(row: &crate::Row, prefix: &str) -> Result<SealedSecret, StoreError> {
    Ok(SealedSecret {
        name: row.text(&format!("{prefix}name"))?,
        nonce: row.blob(&format!("{prefix}nonce"))?,
        ciphertext: row.blob(&format!("{prefix}ciphertext"))?,
        updated_ms: row.int(&format!("{prefix}updated_ms"))?,
    })
}

impl Store {
    /// Creates or replaces a secret of `org`.
    pub fn put_secret(
        &self,
        org: &str,
        name: &str,
        nonce: &[u8],
        ciphertext: &[u8],
        now: i64,
    ) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO secrets (org_id, name, nonce, ciphertext, updated_ms) VALUES (?, ?, ?, ?, ?)
                 ON CONFLICT (org_id, name) DO UPDATE SET nonce = excluded.nonce,
                 ciphertext = excluded.ciphertext, updated_ms = excluded.updated_ms",
                &[
                    org.into(),
                    name.into(),
                    nonce.to_vec().into(),
                    ciphertext.to_vec().into(),
                    now.into(),
                ],
            )?;
            Ok(())
        })
    }

    /// Every sealed secret of `org`, by name.
    pub fn secrets(&self, org: &str) -> Result<Vec<SealedSecret>, StoreError> {
        self.read(|tx| {
            tx.query(
                "SELECT name, nonce, ciphertext, updated_ms FROM secrets WHERE org_id = ? ORDER BY name",
                &[org.into()],
            )?
            .iter()
            .map(sealed)
            .collect()
        })
    }

    /// The name of `org` (none: no such org) and its sealed secrets, by
    /// name, in one statement: what judging a runner's report, and
    /// creating a run, read.
    pub fn org_name_and_secrets(
        &self,
        org: &str,
    ) -> Result<(Option<String>, Vec<SealedSecret>), StoreError> {
        self.read(|tx| {
            let rows = tx.query(
                "SELECT o.name AS org_name, s.name, s.nonce, s.ciphertext, s.updated_ms
                 FROM orgs o LEFT JOIN secrets s ON s.org_id = o.id
                 WHERE o.id = ? ORDER BY s.name",
                &[org.into()],
            )?;
            let name = rows.first().map(|row| row.text("org_name")).transpose()?;
            let secrets = rows
                .iter()
                .filter(|row| matches!(row.opt_text("name"), Ok(Some(_))))
                .map(sealed)
                .collect::<Result<_, StoreError>>()?;
            Ok((name, secrets))
        })
    }

    /// Creates or replaces a tool of `org`.
    pub fn put_tool(
        &self,
        org: &str,
        name: &str,
        definition: &serde_json::Value,
        now: i64,
    ) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO tools (org_id, name, definition, updated_ms) VALUES (?, ?, ?, ?)
                 ON CONFLICT (org_id, name) DO UPDATE SET definition = excluded.definition,
                 updated_ms = excluded.updated_ms",
                &[
                    org.into(),
                    name.into(),
                    definition.to_string().into(),
                    now.into(),
                ],
            )?;
            Ok(())
        })
    }

    /// The tools of `org`, by name.
    pub fn tools(&self, org: &str) -> Result<Vec<ToolRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                "SELECT name, definition, updated_ms FROM tools WHERE org_id = ? ORDER BY name",
                &[org.into()],
            )?
            .iter()
            .map(decode_tool)
            .collect()
        })
    }

    /// One tool of `org`.
    pub fn tool(&self, org: &str, name: &str) -> Result<Option<ToolRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                "SELECT name, definition, updated_ms FROM tools WHERE org_id = ? AND name = ?",
                &[org.into(), name.into()],
            )?
            .as_ref()
            .map(decode_tool)
            .transpose()
        })
    }
}

/// A one-operation tool token, by its hash (the token itself is never stored).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolTokenRow {
    pub org_id: String,
    pub run_id: String,
    pub op_id: String,
    /// `{tool name: definition hash}` the token may call.
    pub tools: serde_json::Value,
    pub expires_ms: i64,
}

impl Store {
    /// Records a token (by hash) for `op` of `run`, valid until `expires_ms`.
    pub fn put_tool_token(&self, hash: &str, token: &ToolTokenRow) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO tool_tokens (hash, org_id, run_id, op_id, tools, expires_ms) VALUES (?, ?, ?, ?, ?, ?)",
                &[
                    hash.into(),
                    token.org_id.as_str().into(),
                    token.run_id.as_str().into(),
                    token.op_id.as_str().into(),
                    token.tools.to_string().into(),
                    token.expires_ms.into(),
                ],
            )?;
            Ok(())
        })
    }

    /// The token with this hash, if it has not expired, its run is still
    /// held by a runner, and that runner still stands.
    pub fn tool_token(&self, hash: &str, now: i64) -> Result<Option<ToolTokenRow>, StoreError> {
        self.read(|tx| {
            // Only while the run is held (a run that ended, was given back
            // or lost its lease takes its tokens with it) by a runner that
            // still stands (a revocation ends the tokens its programs were
            // handed).
            let Some(row) = tx.query_one(
                &format!(
                    "SELECT org_id, run_id, op_id, tools, expires_ms FROM tool_tokens t
                     WHERE hash = ? AND expires_ms > ?
                       AND EXISTS (SELECT 1 FROM runs r WHERE r.org_id IS NOT DISTINCT FROM t.org_id
                                   AND r.id = t.run_id
                                   AND r.state IN ('claimed', 'running', 'paused'))
                       AND NOT EXISTS (SELECT 1 FROM runs r JOIN runners w ON w.id = r.runner_id
                                   WHERE r.org_id IS NOT DISTINCT FROM t.org_id AND r.id = t.run_id AND NOT ({}))",
                    crate::runners::RUNNER_STANDS
                ),
                &[hash.into(), now.into()],
            )?
            else {
                return Ok(None);
            };
            Ok(Some(ToolTokenRow {
                org_id: row.text("org_id")?,
                run_id: row.text("run_id")?,
                op_id: row.text("op_id")?,
                tools: serde_json::from_str(&row.text("tools")?)
                    .map_err(|e| StoreError::Corrupt(format!("tool token: {e}")))?,
                expires_ms: row.int("expires_ms")?,
            }))
        })
    }

    /// Marks a tool call of an operation as started, once: `false` if it
    /// was started before (a retried or concurrent request must not call
    /// the vendor twice).
    pub fn start_tool_call(&self, run: &str, op: &str, now: i64) -> Result<bool, StoreError> {
        self.tx(|tx| {
            let inserted = tx.execute(
                "INSERT INTO tool_calls (run_id, op_id, started_ms) VALUES (?, ?, ?)
                 ON CONFLICT (run_id, op_id) DO NOTHING",
                &[run.into(), op.into(), now.into()],
            )?;
            Ok(inserted == 1)
        })
    }
}

fn decode_tool(row: &crate::Row) -> Result<ToolRow, StoreError> {
    Ok(ToolRow {
        name: row.text("name")?,
        definition: serde_json::from_str(&row.text("definition")?)
            .map_err(|e| StoreError::Corrupt(format!("tool definition: {e}")))?,
        updated_ms: row.int("updated_ms")?,
    })
}
