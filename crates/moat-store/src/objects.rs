//! Content-addressed blobs and the artifacts that name them; runner builds
//! (the hash allowlist); published manifests and revoked signing keys.

use crate::{Row, Store, StoreError, Tx};

/// An artifact to record, with its bytes.
#[derive(Debug, Clone)]
pub struct NewArtifact {
    pub sha256: String,
    pub kind: String,
    pub label: String,
    pub data: Vec<u8>,
    /// Where its bytes are kept.
    pub kept: Kept,
}

/// Where an artifact's bytes are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// In the database's `blobs`.
    Database,
    /// In the trusted output store (`crate::Outputs`), which the caller
    /// wrote them to before this transaction: only an `outputs` row here.
    Outputs,
}

/// An artifact as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRow {
    pub run_id: String,
    pub op_id: String,
    pub sha256: String,
    pub size: i64,
    pub kind: String,
    pub label: String,
    pub created_ms: i64,
}

/// A published manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestRow {
    pub hash: String,
    pub environment: String,
    /// The signed manifest, as JSON text.
    pub signed: String,
    pub signed_by: String,
    pub expires_ms: i64,
    pub published_ms: i64,
    pub revoked: bool,
}

/// Stores `artifact`'s bytes (once per hash) and records it for the op.
/// The hash is recomputed: a record never names bytes it does not hold.
pub(crate) fn insert_artifact(
    tx: &mut dyn Tx,
    org: &str,
    run: &str,
    op: &str,
    artifact: &NewArtifact,
    now: i64,
) -> Result<(), StoreError> {
    let sha = moat_core::hash::sha256_hex(&artifact.data);
    if sha != artifact.sha256 {
        return Err(StoreError::Corrupt(format!(
            "artifact {} does not hash to its name",
            artifact.label
        )));
    }
    let size = i64::try_from(artifact.data.len()).unwrap_or(i64::MAX);
    match artifact.kept {
        Kept::Database => {
            tx.execute(
                "INSERT INTO blobs (sha256, size, data) VALUES (?, ?, ?) ON CONFLICT (sha256) DO NOTHING",
                &[
                    sha.as_str().into(),
                    size.into(),
                    artifact.data.clone().into(),
                ],
            )?;
        }
        Kept::Outputs => insert_output(tx, &sha, size, now)?,
    }
    tx.execute(
        "INSERT INTO artifacts (org_id, run_id, op_id, sha256, size, kind, label, created_ms)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        &[
            org.into(),
            run.into(),
            op.into(),
            sha.into(),
            size.into(),
            artifact.kind.as_str().into(),
            artifact.label.as_str().into(),
            now.into(),
        ],
    )?;
    Ok(())
}

/// Records that the output store holds `sha256`'s bytes.
pub(super) fn insert_output(
    tx: &mut dyn Tx,
    sha256: &str,
    size: i64,
    now: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO outputs (sha256, size, created_ms) VALUES (?, ?, ?) ON CONFLICT (sha256) DO NOTHING",
        &[sha256.into(), size.into(), now.into()],
    )?;
    Ok(())
}

fn decode_artifact(row: &Row) -> Result<ArtifactRow, StoreError> {
    Ok(ArtifactRow {
        run_id: row.text("run_id")?,
        op_id: row.text("op_id")?,
        sha256: row.text("sha256")?,
        size: row.int("size")?,
        kind: row.text("kind")?,
        label: row.text("label")?,
        created_ms: row.int("created_ms")?,
    })
}

fn decode_manifest(row: &Row) -> Result<ManifestRow, StoreError> {
    decode_manifest_as(row, "")
}

/// A manifest from columns named `{prefix}hash` and so on (a row that
/// joins the manifest to another table's columns).
pub(super) fn decode_manifest_as(row: &Row, prefix: &str) -> Result<ManifestRow, StoreError> {
    let column = |name: &str| format!("{prefix}{name}");
    Ok(ManifestRow {
        hash: row.text(&column("hash"))?,
        environment: row.text(&column("environment"))?,
        signed: row.text(&column("signed"))?,
        signed_by: row.text(&column("signed_by"))?,
        expires_ms: row.int(&column("expires_ms"))?,
        published_ms: row.int(&column("published_ms"))?,
        revoked: row.int(&column("revoked"))? != 0,
    })
}

/// The newest unrevoked manifest of the org's environment, in `tx`.
pub(super) fn current_manifest(
    tx: &mut dyn Tx,
    org: &str,
    environment: &str,
) -> Result<Option<ManifestRow>, StoreError> {
    tx.query_one(
        &format!(
            "SELECT {MANIFEST_COLUMNS} FROM manifests m WHERE org_id = ? AND environment = ?
             AND {CURRENT} LIMIT 1"
        ),
        &[org.into(), environment.into()],
    )?
    .as_ref()
    .map(decode_manifest)
    .transpose()
}

/// A published manifest by hash, in `tx`.
pub(super) fn manifest(
    tx: &mut dyn Tx,
    org: &str,
    hash: &str,
) -> Result<Option<ManifestRow>, StoreError> {
    tx.query_one(
        &format!("SELECT {MANIFEST_COLUMNS} FROM manifests WHERE org_id = ? AND hash = ?"),
        &[org.into(), hash.into()],
    )?
    .as_ref()
    .map(decode_manifest)
    .transpose()
}

/// What makes manifest `m` its environment's current one, newest first:
/// unrevoked, signed by a key that is not revoked (an `ORDER BY` ends it).
pub(super) const CURRENT: &str = "m.revoked = 0 AND NOT EXISTS
       (SELECT 1 FROM revoked_keys k WHERE k.org_id = m.org_id AND k.public_key = m.signed_by)
     ORDER BY m.published_ms DESC, m.expires_ms DESC";

/// A manifest's columns from table alias `table`, each named
/// `{prefix}column` (see [`decode_manifest_as`]).
pub(super) fn manifest_columns_as(table: &str, prefix: &str) -> String {
    MANIFEST_COLUMNS
        .split(',')
        .map(|c| format!("{table}.{c} AS {prefix}{c}", c = c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

const MANIFEST_COLUMNS: &str =
    "hash, environment, signed, signed_by, expires_ms, published_ms, revoked";

impl Store {
    /// The run's artifacts, oldest first.
    pub fn artifacts(&self, org: &str, run: &str) -> Result<Vec<ArtifactRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                "SELECT run_id, op_id, sha256, size, kind, label, created_ms FROM artifacts
                 WHERE org_id = ? AND run_id = ? ORDER BY created_ms, op_id, label",
                &[org.into(), run.into()],
            )?
            .iter()
            .map(decode_artifact)
            .collect()
        })
    }

    /// The bytes of `sha256`, if one of the org's artifacts names them.
    pub fn artifact_bytes(&self, org: &str, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                "SELECT b.data FROM blobs b WHERE b.sha256 = ? AND EXISTS
                 (SELECT 1 FROM artifacts a WHERE a.org_id = ? AND a.sha256 = b.sha256)",
                &[sha256.into(), org.into()],
            )?
            .map(|r| r.blob("data"))
            .transpose()
        })
    }

    /// The size of `sha256`'s bytes if the output store holds them for one
    /// of the org's promoted files (`None`: ask [`Store::artifact_bytes`]).
    pub fn promoted_output(&self, org: &str, sha256: &str) -> Result<Option<i64>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                "SELECT o.size FROM outputs o WHERE o.sha256 = ? AND EXISTS
                 (SELECT 1 FROM artifacts a WHERE a.org_id = ? AND a.sha256 = o.sha256 AND a.kind = 'export')",
                &[sha256.into(), org.into()],
            )?
            .map(|r| r.int("size"))
            .transpose()
        })
    }

    /// Adds a runner build (SHA-256 of a sealed runner) to the org's allowlist.
    pub fn allow_runner_build(
        &self,
        org: &str,
        sha256: &str,
        label: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO runner_builds (org_id, sha256, label, created_ms) VALUES (?, ?, ?, ?)
                 ON CONFLICT (org_id, sha256) DO UPDATE SET label = excluded.label, revoked = 0",
                &[org.into(), sha256.into(), label.into(), now.into()],
            )?;
            Ok(())
        })
    }

    /// Revokes a runner build: its runners are refused from the next request on.
    pub fn revoke_runner_build(&self, org: &str, sha256: &str) -> Result<bool, StoreError> {
        self.tx(|tx| {
            Ok(tx.execute(
                "UPDATE runner_builds SET revoked = 1 WHERE org_id = ? AND sha256 = ?",
                &[org.into(), sha256.into()],
            )? > 0)
        })
    }

    /// `(sha256, label, revoked)` of the org's runner builds.
    pub fn runner_builds(&self, org: &str) -> Result<Vec<(String, String, bool)>, StoreError> {
        self.read(|tx| {
            tx.query(
                "SELECT sha256, label, revoked FROM runner_builds WHERE org_id = ? ORDER BY created_ms",
                &[org.into()],
            )?
            .iter()
            .map(|r| Ok((r.text("sha256")?, r.text("label")?, r.int("revoked")? != 0)))
            .collect()
        })
    }

    /// Whether `sha256` is an allowed, unrevoked build of the org.
    pub fn runner_build_allowed(&self, org: &str, sha256: &str) -> Result<bool, StoreError> {
        self.read(|tx| {
            Ok(tx
                .query_one(
                    "SELECT 1 FROM runner_builds WHERE org_id = ? AND sha256 = ? AND revoked = 0",
                    &[org.into(), sha256.into()],
                )?
                .is_some())
        })
    }

    /// Publishes a verified signed manifest (idempotent by hash).
    pub fn publish_manifest(&self, org: &str, row: &ManifestRow) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO manifests (org_id, hash, environment, signed, signed_by, expires_ms, published_ms)
                 VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (org_id, hash) DO NOTHING",
                &[
                    org.into(),
                    row.hash.as_str().into(),
                    row.environment.as_str().into(),
                    row.signed.as_str().into(),
                    row.signed_by.as_str().into(),
                    row.expires_ms.into(),
                    row.published_ms.into(),
                ],
            )?;
            Ok(())
        })
    }

    /// The newest unrevoked manifest of the org's environment.
    pub fn current_manifest(
        &self,
        org: &str,
        environment: &str,
    ) -> Result<Option<ManifestRow>, StoreError> {
        self.read(|tx| current_manifest(tx, org, environment))
    }

    /// A published manifest by hash.
    pub fn manifest(&self, org: &str, hash: &str) -> Result<Option<ManifestRow>, StoreError> {
        self.read(|tx| manifest(tx, org, hash))
    }

    /// Revokes a manifest; `false` if the org has none with that hash.
    pub fn revoke_manifest(&self, org: &str, hash: &str) -> Result<bool, StoreError> {
        self.tx(|tx| {
            Ok(tx.execute(
                "UPDATE manifests SET revoked = 1 WHERE org_id = ? AND hash = ?",
                &[org.into(), hash.into()],
            )? > 0)
        })
    }

    /// Revokes a manifest-signing key: every manifest it signed stops counting.
    pub fn revoke_signing_key(&self, org: &str, public_key: &str) -> Result<(), StoreError> {
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO revoked_keys (org_id, public_key) VALUES (?, ?) ON CONFLICT DO NOTHING",
                &[org.into(), public_key.into()],
            )?;
            Ok(())
        })
    }

    pub fn signing_key_revoked(&self, org: &str, public_key: &str) -> Result<bool, StoreError> {
        self.read(|tx| {
            Ok(tx
                .query_one(
                    "SELECT 1 FROM revoked_keys WHERE org_id = ? AND public_key = ?",
                    &[org.into(), public_key.into()],
                )?
                .is_some())
        })
    }
}
