//! Persistent volumes: an org's named work areas, their snapshots and the
//! chunks those name, and the runs that attach them.
//!
//! Everything is answered within one org: a chunk is "held" only if the
//! org itself stored it (its bytes may be shared with another org's equal
//! chunk, but no answer says so), and a snapshot belongs to one volume.

use serde::{Deserialize, Serialize};

use crate::{Row, Store, StoreError, Tx, events, typed_event};
use moat_core::EventData;
use moat_core::event_data::VolumeSnapshotted;

/// A volume as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeRow {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub head: Option<String>,
    pub files: i64,
    pub bytes: i64,
    /// The live run that attached it read-write, if any.
    pub writer: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// A volume as a run has it (kept with the run, as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunVolume {
    pub volume_id: String,
    pub volume: String,
    pub path: String,
    pub read_only: bool,
    /// The volume's head when the run was created.
    pub start_snapshot: Option<String>,
    /// The newest snapshot the run recorded (its start until it records one).
    pub snapshot: Option<String>,
}

/// A volume a new run asks for.
#[derive(Debug, Clone, Copy)]
pub struct Attach<'a> {
    pub volume: &'a str,
    pub path: &'a str,
    pub read_only: bool,
}

/// A volume's new head, reported with an operation's result.
#[derive(Debug, Clone)]
pub struct NewHead {
    pub volume: String,
    pub snapshot: String,
}

/// Where a volume's bytes (chunks and snapshot documents) are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bytes<'a> {
    /// In `volume_blobs`.
    Database(&'a [u8]),
    /// In the output store's objects, written by the caller first.
    Objects,
}

const COLUMNS: &str =
    "v.id, v.org_id, v.name, v.head, v.files, v.bytes, v.created_ms, v.updated_ms,
    (SELECT r.id FROM runs r WHERE r.id = v.writer_run_id
        AND r.state IN ('queued', 'claimed', 'running', 'paused')) AS writer";

fn decode(row: &Row) -> Result<VolumeRow, StoreError> {
    Ok(VolumeRow {
        id: row.text("id")?,
        org_id: row.text("org_id")?,
        name: row.text("name")?,
        head: row.opt_text("head")?,
        files: row.int("files")?,
        bytes: row.int("bytes")?,
        writer: row.opt_text("writer")?,
        created_ms: row.int("created_ms")?,
        updated_ms: row.int("updated_ms")?,
    })
}

fn by_name(tx: &mut dyn Tx, org: &str, name: &str) -> Result<Option<VolumeRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM volumes v WHERE v.org_id = ? AND v.name = ?");
    tx.query_one(&sql, &[org.into(), name.into()])?
        .as_ref()
        .map(decode)
        .transpose()
}

/// Attaches `wanted` to the new run `run`, in its creating transaction:
/// each volume must be the org's, and one attached read-write must have
/// no other live writer (the run becomes it).
pub(crate) fn attach(
    tx: &mut dyn Tx,
    org: &str,
    run: &str,
    wanted: &[Attach<'_>],
) -> Result<Vec<RunVolume>, StoreError> {
    let mut attached = Vec::with_capacity(wanted.len());
    for want in wanted {
        let lock = format!(
            "SELECT id FROM volumes WHERE org_id = ? AND name = ?{}",
            tx.for_update()
        );
        if tx
            .query_one(&lock, &[org.into(), want.volume.into()])?
            .is_none()
        {
            return Err(StoreError::NoSuch(format!("volume {}", want.volume)));
        }
        let volume = by_name(tx, org, want.volume)?
            .ok_or_else(|| StoreError::NoSuch(format!("volume {}", want.volume)))?;
        if !want.read_only {
            if let Some(writer) = &volume.writer {
                return Err(StoreError::InUse(format!(
                    "volume {} is attached read-write by run {writer}, which is still live: \
                     attach it read-only, or wait for that run to end",
                    want.volume
                )));
            }
            tx.execute(
                "UPDATE volumes SET writer_run_id = ? WHERE id = ?",
                &[run.into(), volume.id.as_str().into()],
            )?;
        }
        attached.push(RunVolume {
            volume_id: volume.id,
            volume: volume.name,
            path: want.path.to_owned(),
            read_only: want.read_only,
            start_snapshot: volume.head.clone(),
            snapshot: volume.head,
        });
    }
    Ok(attached)
}

/// Makes each of `heads` its volume's head, in the transaction that
/// records the operation's result: the run must hold the volume
/// read-write, and the snapshot must have been stored for that volume.
/// Returns the `volume.snapshotted` events.
pub(crate) fn move_heads(
    tx: &mut dyn Tx,
    org: &str,
    run: &crate::RunRow,
    heads: &[NewHead],
    now: i64,
) -> Result<Vec<moat_core::Event>, StoreError> {
    if heads.is_empty() {
        return Ok(Vec::new());
    }
    let mut volumes = run.volumes.clone();
    let mut moved = Vec::with_capacity(heads.len());
    for head in heads {
        let Some(attached) = volumes
            .iter_mut()
            .find(|v| v.volume == head.volume && !v.read_only)
        else {
            return Err(StoreError::NoSuch(format!(
                "volume {} attached read-write to run {}",
                head.volume, run.id
            )));
        };
        let Some(stored) = tx.query_one(
            "SELECT files, bytes FROM volume_snapshots WHERE volume_id = ? AND id = ? AND org_id = ?",
            &[
                attached.volume_id.as_str().into(),
                head.snapshot.as_str().into(),
                org.into(),
            ],
        )?
        else {
            return Err(StoreError::NoSuch(format!(
                "snapshot {} of volume {}",
                head.snapshot, head.volume
            )));
        };
        let (files, bytes) = (stored.int("files")?, stored.int("bytes")?);
        let parent = attached.snapshot.replace(head.snapshot.clone());
        // Only the writer moves the head (one live writer at a time makes
        // this hold already; checked all the same).
        let moved_rows = tx.execute(
            "UPDATE volumes SET head = ?, files = ?, bytes = ?, updated_ms = ?
             WHERE id = ? AND org_id = ? AND writer_run_id = ?",
            &[
                head.snapshot.as_str().into(),
                files.into(),
                bytes.into(),
                now.into(),
                attached.volume_id.as_str().into(),
                org.into(),
                run.id.as_str().into(),
            ],
        )?;
        if moved_rows != 1 {
            return Err(StoreError::InUse(format!(
                "volume {} is not written by run {}",
                head.volume, run.id
            )));
        }
        let data = EventData::VolumeSnapshotted(VolumeSnapshotted {
            volume: head.volume.clone(),
            path: attached.path.clone(),
            snapshot: head.snapshot.clone(),
            parent,
            files: u64::try_from(files).unwrap_or(0),
            bytes: u64::try_from(bytes).unwrap_or(0),
        });
        moved.push(typed_event(data, &run.id, now));
    }
    tx.execute(
        "UPDATE runs SET volumes = ? WHERE id = ? AND org_id IS NOT DISTINCT FROM ?",
        &[encode(&volumes)?.into(), run.id.as_str().into(), org.into()],
    )?;
    events::append(tx, org, &moved)?;
    Ok(moved)
}

/// A run's volumes as the `runs.volumes` column keeps them.
pub(crate) fn encode(volumes: &[RunVolume]) -> Result<Option<String>, StoreError> {
    if volumes.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(volumes)
        .map(Some)
        .map_err(|e| StoreError::Encode(e.to_string()))
}

pub(crate) fn decode_run_volumes(text: Option<String>) -> Result<Vec<RunVolume>, StoreError> {
    match text {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("run volumes: {e}"))),
    }
}

fn keep_bytes(tx: &mut dyn Tx, sha256: &str, bytes: Bytes<'_>) -> Result<(), StoreError> {
    if let Bytes::Database(data) = bytes {
        tx.execute(
            "INSERT INTO volume_blobs (sha256, data) VALUES (?, ?) ON CONFLICT (sha256) DO NOTHING",
            &[sha256.into(), data.to_vec().into()],
        )?;
    }
    Ok(())
}

/// Chunk names asked about in one statement.
const MISSING_BATCH: usize = 500;

/// What a read of stored bytes found: nothing the org holds, or the bytes
/// (`None` when they are in the output store's objects).
pub type Found = Option<Option<Vec<u8>>>;

impl Store {
    /// A new, empty volume of `org`.
    pub fn create_volume(&self, org: &str, name: &str, now: i64) -> Result<VolumeRow, StoreError> {
        self.tx(|tx| {
            let id = moat_core::random::new_id("vol_");
            let inserted = tx.execute(
                "INSERT INTO volumes (id, org_id, name, created_ms, updated_ms)
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (org_id, name) DO NOTHING",
                &[
                    id.as_str().into(),
                    org.into(),
                    name.into(),
                    now.into(),
                    now.into(),
                ],
            )?;
            if inserted == 0 {
                return Err(StoreError::Conflict(format!("volume {name}")));
            }
            by_name(tx, org, name)?.ok_or_else(|| StoreError::Corrupt("volume vanished".into()))
        })
    }

    pub fn volumes(&self, org: &str) -> Result<Vec<VolumeRow>, StoreError> {
        self.read(|tx| {
            let sql = format!("SELECT {COLUMNS} FROM volumes v WHERE v.org_id = ? ORDER BY v.name");
            tx.query(&sql, &[org.into()])?.iter().map(decode).collect()
        })
    }

    pub fn volume(&self, org: &str, name: &str) -> Result<Option<VolumeRow>, StoreError> {
        self.read(|tx| by_name(tx, org, name))
    }

    /// Those of `chunks` (SHA-256s) that `org` has not stored.
    pub fn missing_chunks(&self, org: &str, chunks: &[String]) -> Result<Vec<String>, StoreError> {
        self.read(|tx| {
            let mut held = std::collections::HashSet::new();
            // A few hundred names a statement: one round trip each, not
            // one per chunk.
            for batch in chunks.chunks(MISSING_BATCH) {
                let marks = vec!["?"; batch.len()].join(", ");
                let sql = format!(
                    "SELECT sha256 FROM volume_chunks WHERE org_id = ? AND sha256 IN ({marks})"
                );
                let mut params: Vec<crate::Value> = Vec::with_capacity(batch.len() + 1);
                params.push(org.into());
                params.extend(batch.iter().map(|sha| sha.as_str().into()));
                for row in tx.query(&sql, &params)? {
                    held.insert(row.text("sha256")?);
                }
            }
            Ok(chunks
                .iter()
                .filter(|sha| !held.contains(sha.as_str()))
                .cloned()
                .collect())
        })
    }

    /// Records that `org` stored the chunk `sha256` (whose bytes the
    /// caller checked against the name).
    pub fn record_chunk(
        &self,
        org: &str,
        sha256: &str,
        size: i64,
        bytes: Bytes<'_>,
        now: i64,
    ) -> Result<(), StoreError> {
        self.tx(|tx| {
            keep_bytes(tx, sha256, bytes)?;
            tx.execute(
                "INSERT INTO volume_chunks (org_id, sha256, size, created_ms) VALUES (?, ?, ?, ?)
                 ON CONFLICT (org_id, sha256) DO NOTHING",
                &[org.into(), sha256.into(), size.into(), now.into()],
            )?;
            Ok(())
        })
    }

    /// The chunk `sha256`, if `org` stored it.
    pub fn chunk(&self, org: &str, sha256: &str) -> Result<Found, StoreError> {
        self.read(|tx| {
            let Some(_) = tx.query_one(
                "SELECT 1 AS held FROM volume_chunks WHERE org_id = ? AND sha256 = ?",
                &[org.into(), sha256.into()],
            )?
            else {
                return Ok(None);
            };
            blob(tx, sha256).map(Some)
        })
    }

    /// Records a snapshot of `volume_id` (whose document the caller checked:
    /// it hashes to `id`, and `org` holds every chunk it names).
    #[allow(clippy::too_many_arguments)]
    pub fn record_snapshot(
        &self,
        org: &str,
        volume_id: &str,
        id: &str,
        files: i64,
        bytes_total: i64,
        document: Bytes<'_>,
        size: i64,
        run: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.tx(|tx| {
            keep_bytes(tx, id, document)?;
            tx.execute(
                "INSERT INTO volume_snapshots (volume_id, id, org_id, files, bytes, size, run_id, created_ms)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (volume_id, id) DO NOTHING",
                &[
                    volume_id.into(),
                    id.into(),
                    org.into(),
                    files.into(),
                    bytes_total.into(),
                    size.into(),
                    run.into(),
                    now.into(),
                ],
            )?;
            Ok(())
        })
    }

    /// Whether the snapshot `id` of `volume_id` was stored.
    pub fn has_snapshot(&self, org: &str, volume_id: &str, id: &str) -> Result<bool, StoreError> {
        self.read(|tx| {
            Ok(tx
                .query_one(
                    "SELECT 1 AS held FROM volume_snapshots WHERE volume_id = ? AND id = ? AND org_id = ?",
                    &[volume_id.into(), id.into(), org.into()],
                )?
                .is_some())
        })
    }

    /// The snapshot document `id` of `volume_id`, if it was stored for it.
    pub fn snapshot(&self, org: &str, volume_id: &str, id: &str) -> Result<Found, StoreError> {
        self.read(|tx| {
            let Some(_) = tx.query_one(
                "SELECT 1 AS held FROM volume_snapshots WHERE volume_id = ? AND id = ? AND org_id = ?",
                &[volume_id.into(), id.into(), org.into()],
            )?
            else {
                return Ok(None);
            };
            blob(tx, id).map(Some)
        })
    }
}

fn blob(tx: &mut dyn Tx, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
    tx.query_one(
        "SELECT data FROM volume_blobs WHERE sha256 = ?",
        &[sha256.into()],
    )?
    .map(|row| row.blob("data"))
    .transpose()
}
