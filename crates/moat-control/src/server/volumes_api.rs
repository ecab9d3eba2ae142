//! Persistent volumes. An org's agents create and list them; a runner
//! stores and reads the chunks and snapshots of the volumes attached to a
//! run it holds, and nothing else: every runner route checks that the run
//! is the runner's (same org, held now) and that the volume is attached to
//! it (read-write to store anything), and a chunk is served only if the
//! org itself stored it. Bytes are checked against their names on the way
//! in; a snapshot is taken only if it parses, passes the restore checks and
//! names only chunks the org holds.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use moat_api::org::{NewVolume, VolumeList, VolumeView};
use moat_api::runner::{ChunkName, ChunkNames, Recorded};
use moat_core::EventData;
use moat_core::event_data::RunResumed;
use moat_store::{RunRow, RunVolume, VolumeBytes, VolumeRow, stamp, typed_event};

use super::AppState;
use super::auth;
use super::auth::SignedRunner;
use super::body::{JsonObject, parse};
use super::error::{ApiError, ApiResult};

/// The most chunks asked about at once.
const MAX_ASKED: usize = 4096;

fn view(v: &VolumeRow) -> VolumeView {
    VolumeView {
        name: v.name.clone(),
        head: v.head.clone(),
        files: u64::try_from(v.files).unwrap_or(0),
        bytes: u64::try_from(v.bytes).unwrap_or(0),
        writer: v.writer.clone(),
        created_at: stamp(v.created_ms),
        updated_at: stamp(v.updated_ms),
    }
}

/// `POST /v1/volumes`.
pub async fn create(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    JsonObject(body): JsonObject<NewVolume>,
) -> ApiResult<(StatusCode, Json<VolumeView>)> {
    let now = state.now();
    let name = body.name.into_string();
    let row = state.db(move |s| s.create_volume(&org, &name, now)).await?;
    Ok((StatusCode::CREATED, Json(view(&row))))
}

/// `GET /v1/volumes`.
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
) -> ApiResult<Json<VolumeList>> {
    let rows = state.db(move |s| s.volumes(&org)).await?;
    Ok(Json(VolumeList {
        volumes: rows.iter().map(view).collect(),
    }))
}

/// `GET /v1/volumes/{volume}`: 404 for another org's.
pub async fn show(
    State(state): State<Arc<AppState>>,
    auth::Agent(org): auth::Agent,
    Path(name): Path<String>,
) -> ApiResult<Json<VolumeView>> {
    let shown = name.clone();
    let row = state.db(move |s| s.volume(&org, &name)).await?;
    row.map(|r| Json(view(&r)))
        .ok_or_else(|| no_such_volume(&shown))
}

fn no_such_volume(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no volume {name:?} in this org"),
    )
}

/// The run `run_id` held by the signing runner, and its volume `name`
/// (attached read-write when `write`).
async fn attached(
    state: &Arc<AppState>,
    runner: &moat_store::RunnerRow,
    run_id: &str,
    name: &str,
    write: bool,
) -> ApiResult<(RunRow, RunVolume)> {
    let (org, id) = (runner.org_id.clone(), run_id.to_owned());
    let run = state
        .db(move |s| s.run(&org, &id))
        .await?
        .filter(|r| r.runner_id.as_deref() == Some(runner.id.as_str()) && !r.state.is_final())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "lease_lost",
                format!("this runner does not hold run {run_id}"),
            )
        })?;
    let volume = run
        .volumes
        .iter()
        .find(|v| v.volume == name && (!write || !v.read_only))
        .cloned()
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "run {run_id} has no volume {name:?} attached{}",
                    if write { " read-write" } else { "" }
                ),
            )
        })?;
    Ok((run, volume))
}

/// A refusal of a runner's ask, recorded (see `refusals`).
async fn recorded<T>(
    state: &Arc<AppState>,
    runner: &moat_store::RunnerRow,
    method: &str,
    path: String,
    result: ApiResult<T>,
) -> ApiResult<T> {
    match result {
        Err(e) if matches!(e.status, StatusCode::NOT_FOUND | StatusCode::CONFLICT) => {
            Err(super::refusals::volume_not_held(state, runner, method, path, e).await)
        }
        other => other,
    }
}

fn sha256_of(text: &str) -> ApiResult<moat_core::ids::Sha256> {
    text.parse()
        .map_err(|e: moat_core::ids::InvalidValue| ApiError::bad_request(e.to_string()))
}

/// `POST /v1/runner/runs/{run}/volumes/{volume}/missing`.
pub async fn missing(
    State(state): State<Arc<AppState>>,
    Path((run_id, name)): Path<(String, String)>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<ChunkNames>> {
    let ChunkNames { chunks } = parse(&body)?;
    if chunks.len() > MAX_ASKED {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_ASKED} chunks at once"
        )));
    }
    let path = format!("/v1/runner/runs/{run_id}/volumes/{name}/missing");
    let held = attached(&state, &runner, &run_id, &name, false).await;
    recorded(&state, &runner, "POST", path, held).await?;
    let asked: Vec<String> = chunks.iter().map(|c| c.sha256.to_string()).collect();
    let org = runner.org_id.clone();
    let missing = state.db(move |s| s.missing_chunks(&org, &asked)).await?;
    let missing: std::collections::HashSet<String> = missing.into_iter().collect();
    Ok(Json(ChunkNames {
        chunks: chunks
            .into_iter()
            .filter(|c| missing.contains(c.sha256.as_str()))
            .collect::<Vec<ChunkName>>(),
    }))
}

/// Keeps volume bytes (already checked against `sha`) where the output
/// store keeps them: as an object written now, or (`Some`) in the
/// database, with the transaction that records them.
async fn keep(state: &AppState, sha: &str, bytes: &[u8]) -> ApiResult<Option<Vec<u8>>> {
    let outputs = &state.config.outputs;
    if outputs.in_database() {
        return Ok(Some(bytes.to_vec()));
    }
    outputs.put_volume_bytes(sha, bytes).await.map_err(|e| {
        eprintln!("moat serve: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the output store did not take the volume's bytes; retry",
        )
    })?;
    Ok(None)
}

/// Bytes read back for `sha`, from the database row or the object store,
/// checked against the name.
async fn bytes_of(
    state: &AppState,
    sha: &str,
    found: moat_store::Found,
    what: &str,
) -> ApiResult<Response> {
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} {sha} is not stored for this volume"),
        )
    };
    let bytes = match found.ok_or_else(not_found)? {
        Some(bytes) => bytes,
        None => state
            .config
            .outputs
            .get_volume_bytes(sha)
            .await
            .map_err(|e| {
                eprintln!("moat serve: {e}");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the output store could not be read; retry",
                )
            })?
            .ok_or_else(not_found)?,
    };
    if moat_core::hash::sha256_hex(&bytes) != sha {
        eprintln!("moat serve: volume bytes {sha}: the store returned other bytes");
        return Err(ApiError::internal(format!(
            "{what} {sha}: the stored bytes do not match their name"
        )));
    }
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// `PUT /v1/runner/runs/{run}/volumes/{volume}/chunks/{sha256}`: raw bytes.
pub async fn put_chunk(
    State(state): State<Arc<AppState>>,
    Path((run_id, name, sha)): Path<(String, String, String)>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<Recorded>> {
    let sha = sha256_of(&sha)?.into_string();
    if body.is_empty() || body.len() > moat_volume::chunking::MAX_CHUNK as usize {
        return Err(ApiError::bad_request(format!(
            "a chunk is 1 to {} bytes",
            moat_volume::chunking::MAX_CHUNK
        )));
    }
    if moat_core::hash::sha256_hex(&body) != sha {
        return Err(ApiError::bad_request(format!(
            "the body does not hash to {sha}"
        )));
    }
    let path = format!("/v1/runner/runs/{run_id}/volumes/{name}/chunks/{sha}");
    let held = attached(&state, &runner, &run_id, &name, true).await;
    recorded(&state, &runner, "PUT", path, held).await?;
    let data = keep(&state, &sha, &body).await?;
    let size = i64::try_from(body.len()).unwrap_or(i64::MAX);
    let now = state.now();
    let org = runner.org_id.clone();
    state
        .db(move |s| {
            let bytes = data
                .as_deref()
                .map_or(VolumeBytes::Objects, VolumeBytes::Database);
            s.record_chunk(&org, &sha, size, bytes, now)
        })
        .await?;
    Ok(Json(Recorded { recorded: true }))
}

/// `GET /v1/runner/runs/{run}/volumes/{volume}/chunks/{sha256}`.
pub async fn get_chunk(
    State(state): State<Arc<AppState>>,
    Path((run_id, name, sha)): Path<(String, String, String)>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Response> {
    get_bytes(&state, &runner, &run_id, &name, Space::Chunks, &sha).await
}

/// Which of a volume's bytes: its chunks or its snapshot documents.
#[derive(Clone, Copy)]
enum Space {
    Chunks,
    Snapshots,
}

/// A chunk the org stored, or a snapshot stored for this volume, checked
/// against its name; a refusal is recorded.
async fn get_bytes(
    state: &Arc<AppState>,
    runner: &moat_store::RunnerRow,
    run_id: &str,
    name: &str,
    space: Space,
    sha: &str,
) -> ApiResult<Response> {
    let sha = sha256_of(sha)?.into_string();
    let (segment, noun) = match space {
        Space::Chunks => ("chunks", "chunk"),
        Space::Snapshots => ("snapshots", "snapshot"),
    };
    let path = format!("/v1/runner/runs/{run_id}/volumes/{name}/{segment}/{sha}");
    let held = attached(state, runner, run_id, name, false).await;
    let (_, volume) = recorded(state, runner, "GET", path.clone(), held).await?;
    let (org, wanted) = (runner.org_id.clone(), sha.clone());
    let found = state
        .db(move |s| match space {
            Space::Chunks => s.chunk(&org, &wanted),
            Space::Snapshots => s.snapshot(&org, &volume.volume_id, &wanted),
        })
        .await?;
    let answer = bytes_of(state, &sha, found, noun).await;
    recorded(state, runner, "GET", path, answer).await
}

/// `PUT /v1/runner/runs/{run}/volumes/{volume}/snapshots/{id}`: the
/// snapshot's canonical JSON.
pub async fn put_snapshot(
    State(state): State<Arc<AppState>>,
    Path((run_id, name, id)): Path<(String, String, String)>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<Recorded>> {
    let id = sha256_of(&id)?.into_string();
    if moat_core::hash::sha256_hex(&body) != id {
        return Err(ApiError::bad_request(format!(
            "the body does not hash to {id}"
        )));
    }
    let path = format!("/v1/runner/runs/{run_id}/volumes/{name}/snapshots/{id}");
    let held = attached(&state, &runner, &run_id, &name, true).await;
    let (run, volume) = recorded(&state, &runner, "PUT", path.clone(), held).await?;
    let (org, vid, known) = (runner.org_id.clone(), volume.volume_id.clone(), id.clone());
    if state
        .db(move |s| s.has_snapshot(&org, &vid, &known))
        .await?
    {
        // Stored already: the same bytes (they hash to its id).
        return Ok(Json(Recorded { recorded: true }));
    }
    let snapshot = moat_volume::Snapshot::parse(&body)
        .map_err(|e| ApiError::bad_request(format!("snapshot {id}: {e}")))?;
    // Only the canonical form: one content, one id.
    if snapshot
        .id()
        .ok()
        .is_none_or(|canonical| canonical.as_str() != id)
    {
        return Err(ApiError::bad_request(format!(
            "snapshot {id}: not in its canonical form"
        )));
    }
    let named: Vec<String> = snapshot
        .chunks()
        .iter()
        .map(|c| c.sha256.to_string())
        .collect();
    let org = runner.org_id.clone();
    let absent = state.db(move |s| s.missing_chunks(&org, &named)).await?;
    if let Some(first) = absent.first() {
        let refusal = ApiError::new(
            StatusCode::CONFLICT,
            "chunks_missing",
            format!(
                "snapshot {id} names {} chunk(s) not stored for this org, such as {first}: \
                 store them first",
                absent.len()
            ),
        );
        return recorded(&state, &runner, "PUT", path, Err(refusal)).await;
    }
    let files = snapshot
        .entries
        .iter()
        .filter(|e| matches!(e.kind, moat_volume::EntryKind::File { .. }))
        .count();
    let total = snapshot.bytes();
    let data = keep(&state, &id, &body).await?;
    let size = i64::try_from(body.len()).unwrap_or(i64::MAX);
    let now = state.now();
    let org = runner.org_id.clone();
    state
        .db(move |s| {
            let bytes = data
                .as_deref()
                .map_or(VolumeBytes::Objects, VolumeBytes::Database);
            s.record_snapshot(
                &org,
                &volume.volume_id,
                &id,
                i64::try_from(files).unwrap_or(i64::MAX),
                i64::try_from(total).unwrap_or(i64::MAX),
                bytes,
                size,
                &run.id,
                now,
            )
        })
        .await?;
    Ok(Json(Recorded { recorded: true }))
}

/// `GET /v1/runner/runs/{run}/volumes/{volume}/snapshots/{id}`.
pub async fn get_snapshot(
    State(state): State<Arc<AppState>>,
    Path((run_id, name, id)): Path<(String, String, String)>,
    SignedRunner { runner, .. }: SignedRunner,
) -> ApiResult<Response> {
    get_bytes(&state, &runner, &run_id, &name, Space::Snapshots, &id).await
}

/// `POST /v1/runner/runs/{run}/resumed`: the runner that took over a lost
/// run restored its volumes. Recorded as `run.resumed` only if what it
/// says it restored is each volume's snapshot as the run stands.
pub async fn resumed(
    State(state): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    SignedRunner { runner, body }: SignedRunner,
) -> ApiResult<Json<Recorded>> {
    let said: RunResumed = parse(&body)?;
    let (org, id) = (runner.org_id.clone(), run_id.clone());
    let run = state
        .db(move |s| s.run(&org, &id))
        .await?
        .filter(|r| r.runner_id.as_deref() == Some(runner.id.as_str()) && !r.state.is_final())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "lease_lost",
                format!("this runner does not hold run {run_id}"),
            )
        })?;
    let agrees = said.volumes.len() == run.volumes.len()
        && said.volumes.iter().all(|restored| {
            run.volumes.iter().any(|v| {
                v.volume == restored.volume
                    && v.path == restored.path
                    && v.read_only == restored.read_only
                    && v.snapshot == restored.snapshot
            })
        });
    if !agrees || said.attempt != run.attempts {
        return Err(ApiError::bad_request(
            "what was restored is not the run's volumes as they stand",
        ));
    }
    let mut event = typed_event(EventData::RunResumed(said), &run.id, state.now());
    if let Some(map) = event.data.as_object_mut() {
        map.insert("runnerId".into(), runner.id.clone().into());
        map.insert("runnerHash".into(), runner.runner_hash.clone().into());
        map.insert("manifestHash".into(), runner.manifest_hash.clone().into());
    }
    let org = runner.org_id.clone();
    state.db(move |s| s.append_events(&org, &[event])).await?;
    Ok(Json(Recorded { recorded: true }))
}
