//! A run's persistent areas on this runner: restored from their volumes'
//! snapshots before the run's first operation here, and snapshotted after
//! each operation (only changed files are read, only chunks the org's
//! store lacks travel). The control plane is the store: every chunk and
//! snapshot goes through the signed runner API, for a run this runner
//! holds.

use std::path::{Path, PathBuf};

use moat_api::RunView;
use moat_api::runner::{ChunkName, ChunkNames, VolumeHead};
use moat_client::{RunnerClient, VolumeSpace};
use moat_core::event_data::VolumeRestored;
use moat_core::ids::Sha256;
use moat_core::manifest::FilesystemPolicy;
use moat_volume::{ChunkRef, ChunkStore, EntryKind, Tracker, VolumeError};

use crate::error::{IoContext as _, RunnerError};

/// The most chunks asked about in one request (the control plane's limit).
const ASK_BATCH: usize = 4096;

/// The chunks and snapshots of one volume of one run, through the
/// control plane. A chunk is durable once its `PUT` is answered.
pub struct RemoteStore<'a> {
    pub client: &'a RunnerClient,
    pub run: &'a str,
    pub volume: &'a str,
}

fn remote(e: moat_client::ClientError) -> VolumeError {
    VolumeError::Store(e.to_string())
}

impl ChunkStore for RemoteStore<'_> {
    fn missing(&self, chunks: &[&ChunkRef]) -> Result<Vec<ChunkRef>, VolumeError> {
        let mut missing = Vec::new();
        for batch in chunks.chunks(ASK_BATCH) {
            let asked = ChunkNames {
                chunks: batch
                    .iter()
                    .map(|c| ChunkName {
                        sha256: c.sha256.clone(),
                        len: c.len,
                    })
                    .collect(),
            };
            let answer = self
                .client
                .volume_missing(self.run, self.volume, &asked)
                .map_err(remote)?;
            missing.extend(answer.chunks.into_iter().map(|c| ChunkRef {
                sha256: c.sha256,
                len: c.len,
            }));
        }
        Ok(missing)
    }

    fn put(&self, chunk: &ChunkRef, bytes: &[u8]) -> Result<(), VolumeError> {
        self.client
            .put_volume_bytes(
                self.run,
                self.volume,
                VolumeSpace::Chunks,
                chunk.sha256.as_str(),
                bytes,
            )
            .map_err(remote)
    }

    fn sync(&self) -> Result<(), VolumeError> {
        // Each put was committed by the control plane before it answered.
        Ok(())
    }

    fn get(&self, chunk: &ChunkRef) -> Result<Vec<u8>, VolumeError> {
        self.client
            .get_volume_bytes(
                self.run,
                self.volume,
                VolumeSpace::Chunks,
                chunk.sha256.as_str(),
            )
            .map_err(remote)
    }

    fn put_snapshot(&self, id: &Sha256, bytes: &[u8]) -> Result<(), VolumeError> {
        self.client
            .put_volume_bytes(
                self.run,
                self.volume,
                VolumeSpace::Snapshots,
                id.as_str(),
                bytes,
            )
            .map_err(remote)
    }

    fn get_snapshot(&self, id: &Sha256) -> Result<Vec<u8>, VolumeError> {
        self.client
            .get_volume_bytes(self.run, self.volume, VolumeSpace::Snapshots, id.as_str())
            .map_err(remote)
    }
}

/// One attached volume, as this runner holds it.
pub struct Area {
    pub volume: String,
    pub dir: PathBuf,
    pub read_only: bool,
    /// The snapshot the area stands at (the run's, as last recorded).
    pub head: Option<String>,
    tracker: Tracker,
}

/// Restores each of the run's volumes into the (new, empty) workspace:
/// each at a persistent root of the manifest it runs under, each snapshot
/// checked against its name and every chunk against its own.
pub fn restore(
    client: &RunnerClient,
    run: &RunView,
    workspace: &Path,
    filesystem: &FilesystemPolicy,
) -> Result<(Vec<Area>, Vec<VolumeRestored>), RunnerError> {
    let mut areas = Vec::with_capacity(run.volumes.len());
    let mut restored = Vec::with_capacity(run.volumes.len());
    for attached in &run.volumes {
        let rel: moat_core::ids::RelPath = attached
            .path
            .parse()
            .map_err(|e| RunnerError::Protocol(format!("volume {}: {e}", attached.volume)))?;
        if !filesystem.is_persistent(Path::new(rel.as_str())) {
            return Err(RunnerError::Setup(format!(
                "volume {} is attached at {rel}, which is not a persistent root of this \
                 runner's manifest (filesystem.persistentRoots: {:?})",
                attached.volume, filesystem.persistent_roots
            )));
        }
        let dir = workspace.join(rel.as_str());
        std::fs::create_dir_all(&dir).io(|| format!("volume {} at {rel}", attached.volume))?;
        let mut tracker = Tracker::new();
        let (files, bytes) = match &attached.snapshot {
            None => (0, 0),
            Some(id) => {
                let id: Sha256 = id.parse().map_err(|e| {
                    RunnerError::Protocol(format!("volume {}: {e}", attached.volume))
                })?;
                let store = RemoteStore {
                    client,
                    run: &run.id,
                    volume: &attached.volume,
                };
                let done = tracker
                    .restore(&store, &id, &dir)
                    .map_err(|e| volume_error(&attached.volume, e))?;
                (done.files as u64, done.bytes)
            }
        };
        restored.push(VolumeRestored {
            volume: attached.volume.clone(),
            path: attached.path.clone(),
            snapshot: attached.snapshot.clone(),
            read_only: attached.read_only,
            files,
            bytes,
        });
        areas.push(Area {
            volume: attached.volume.clone(),
            dir,
            read_only: attached.read_only,
            head: attached.snapshot.clone(),
            tracker,
        });
    }
    Ok((areas, restored))
}

fn volume_error(volume: &str, e: VolumeError) -> RunnerError {
    RunnerError::Volume(format!("volume {volume}: {e}"))
}

/// Snapshots each read-write area after an operation; the new heads of
/// those that changed, every chunk and snapshot already stored.
pub fn snapshot(
    client: &RunnerClient,
    run: &str,
    areas: &mut [Area],
) -> Result<Vec<VolumeHead>, RunnerError> {
    let mut heads = Vec::new();
    for area in areas.iter_mut().filter(|a| !a.read_only) {
        let store = RemoteStore {
            client,
            run,
            volume: &area.volume,
        };
        let taken = area
            .tracker
            .take(&area.dir, &store)
            .map_err(|e| volume_error(&area.volume, e))?;
        // Unchanged, or still empty: nothing to record.
        let empty = area.head.is_none() && taken.snapshot.entries.is_empty();
        if empty || area.head.as_deref() == Some(taken.id.as_str()) {
            continue;
        }
        let files = taken
            .snapshot
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::File { .. }))
            .count();
        heads.push(VolumeHead {
            volume: area
                .volume
                .parse()
                .map_err(|e| RunnerError::Protocol(format!("volume {}: {e}", area.volume)))?,
            snapshot: taken.id.clone(),
            files: files as u64,
            bytes: taken.snapshot.bytes(),
        });
        area.head = Some(taken.id.into_string());
    }
    Ok(heads)
}
