//! Objects as the API shows them.

use moat_core::SignedManifest;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One input file of a run: a workspace-relative path and the bytes'
/// hash; the bytes themselves only where a runner needs them (a claim).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunInput {
    pub path: String,
    pub sha256: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
}

/// A run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub id: String,
    /// `queued`, `claimed`, `running`, `paused`, `succeeded`, `failed`,
    /// `dead_lettered`, `cancelled`.
    pub state: String,
    pub environment: String,
    pub runner_id: Option<String>,
    pub manifest_hash: Option<String>,
    pub attempts: i64,
    pub max_attempts: i64,
    /// The agent asked to finish; the runner ends the run once its
    /// operations are done.
    pub finish_requested: bool,
    pub inputs: Vec<RunInput>,
    pub error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// Until when its runner's claim holds (`null`: not claimed).
    pub lease_until: Option<String>,
    /// The workload classes a runner must offer to claim it (empty: any
    /// runner of its environment).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_classes: Vec<moat_core::WorkloadClass>,
    /// Why a queued run is not claimed: no runner of its environment was
    /// seen lately, or none offers every class it needs (absent: one does;
    /// it may still wait for a free slot, or for a runner under the
    /// manifest it is pinned to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Its persistent areas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<AttachedVolume>,
}

/// A volume as a run has it: where, how, the snapshot the run started from
/// and the one it stands at (where another runner resumes it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttachedVolume {
    pub volume: String,
    pub path: String,
    pub read_only: bool,
    pub start_snapshot: Option<String>,
    pub snapshot: Option<String>,
}

/// A published manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManifestView {
    pub manifest_hash: String,
    pub environment: String,
    pub expires_at: String,
    pub published_at: String,
    pub revoked: bool,
    pub signed: SignedManifest,
}
