//! Orgs and their tokens. Only SHA-256 hashes of tokens are stored.

use moat_core::random::new_id;

use crate::{Store, StoreError};

/// What a token lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// The org's administrator: everything of the org (runner builds,
    /// bootstrap and agent tokens, manifests, revocations) and what agents do.
    Api,
    /// An agent: runs, operations, events and artifacts of the org only.
    Agent,
    /// One runner registration, once, before it expires.
    Bootstrap,
}

impl TokenKind {
    fn as_str(self) -> &'static str {
        match self {
            TokenKind::Api => "api",
            TokenKind::Agent => "agent",
            TokenKind::Bootstrap => "bootstrap",
        }
    }
}

impl Store {
    /// The name of org `id` (what policies call it).
    pub fn org_name(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.read(|tx| {
            tx.query_one("SELECT name FROM orgs WHERE id = ?", &[id.into()])?
                .map(|row| row.text("name"))
                .transpose()
        })
    }

    /// The id of the org named `name` (or whose id is `name`).
    pub fn org_id(&self, name: &str) -> Result<Option<String>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                "SELECT id FROM orgs WHERE name = ? OR id = ?",
                &[name.into(), name.into()],
            )?
            .map(|row| row.text("id"))
            .transpose()
        })
    }

    /// Every org, as `(id, name)`.
    pub fn orgs(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.read(|tx| {
            tx.query("SELECT id, name FROM orgs ORDER BY name", &[])?
                .iter()
                .map(|row| Ok((row.text("id")?, row.text("name")?)))
                .collect()
        })
    }

    /// Creates an org named `name` with a first API token (by hash); its id.
    pub fn create_org(&self, name: &str, token_hash: &str, now: i64) -> Result<String, StoreError> {
        self.tx(|tx| {
            let id = new_id("org_");
            let taken = tx
                .query_one("SELECT id FROM orgs WHERE name = ?", &[name.into()])?
                .is_some();
            if taken {
                return Err(StoreError::Conflict(format!("org {name:?}")));
            }
            tx.execute(
                "INSERT INTO orgs (id, name, created_ms) VALUES (?, ?, ?)",
                &[id.as_str().into(), name.into(), now.into()],
            )?;
            tx.execute(
                "INSERT INTO tokens (hash, org_id, kind, expires_ms) VALUES (?, ?, 'api', 0)",
                &[token_hash.into(), id.as_str().into()],
            )?;
            Ok(id)
        })
    }

    /// Adds a token of `kind` to `org`; `expires_ms` 0 means never.
    pub fn add_token(
        &self,
        org: &str,
        token_hash: &str,
        kind: TokenKind,
        expires_ms: i64,
    ) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO tokens (hash, org_id, kind, expires_ms) VALUES (?, ?, ?, ?)",
                &[
                    token_hash.into(),
                    org.into(),
                    kind.as_str().into(),
                    expires_ms.into(),
                ],
            )?;
            Ok(())
        })
    }

    /// The org an API token belongs to (an admin's or an agent's).
    pub fn org_of_api_token(&self, token_hash: &str) -> Result<Option<String>, StoreError> {
        Ok(self.org_of_token(token_hash)?.map(|(org, _)| org))
    }

    /// [`Store::org_of_token`]'s answer if it is in this process's memory:
    /// no database, so a caller on an async thread may ask it in place
    /// (`None`: ask `org_of_token`).
    pub fn known_org_of_token(&self, token_hash: &str) -> Option<(String, TokenKind)> {
        self.known_tokens.get(token_hash, std::time::Instant::now())
    }

    /// The org and kind of an admin or agent token. A token found is
    /// answered from this process's memory for a few seconds after (such a
    /// token's row never changes: see `known_tokens`); an unknown one is
    /// looked up every time.
    pub fn org_of_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<(String, TokenKind)>, StoreError> {
        let now = std::time::Instant::now();
        if let Some(known) = self.known_tokens.get(token_hash, now) {
            return Ok(Some(known));
        }
        let found = self.read(|tx| {
            let Some(row) = tx.query_one(
                "SELECT org_id, kind FROM tokens WHERE hash = ? AND kind IN ('api', 'agent')",
                &[token_hash.into()],
            )?
            else {
                return Ok(None);
            };
            let kind = if row.text("kind")? == "agent" {
                TokenKind::Agent
            } else {
                TokenKind::Api
            };
            Ok(Some((row.text("org_id")?, kind)))
        })?;
        if let Some((org, kind)) = &found {
            self.known_tokens.keep(token_hash, org, *kind, now);
        }
        Ok(found)
    }

    /// Spends a bootstrap token: its org if it was unused and unexpired
    /// (and from now on it is used, whatever the registration's outcome).
    pub fn spend_bootstrap_token(
        &self,
        token_hash: &str,
        now: i64,
    ) -> Result<Option<String>, StoreError> {
        self.tx(|tx| {
            tx.query_one(
                "UPDATE tokens SET used = 1
                 WHERE hash = ? AND kind = 'bootstrap' AND used = 0 AND expires_ms > ?
                 RETURNING org_id",
                &[token_hash.into(), now.into()],
            )?
            .map(|r| r.text("org_id"))
            .transpose()
        })
    }
}
