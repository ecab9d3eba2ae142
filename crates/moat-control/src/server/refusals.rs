//! Refusals of what a runner asked that are kept on record: a runner
//! asking for what its org does not hold is an anomaly to look at.

use std::sync::Arc;

use moat_core::EventData;
use moat_core::event_data::{RefusalReason, RequestRefused};
use moat_store::{RunnerRow, typed_event};

use super::AppState;
use super::error::ApiError;

/// Records `refusal` of a runner's volume request in its org's ledger
/// (`request.refused`, `volume_not_held`, by the runner's id) and returns
/// it (or the store's error, if the record could not be written).
pub async fn volume_not_held(
    state: &Arc<AppState>,
    runner: &RunnerRow,
    method: &str,
    path: String,
    refusal: ApiError,
) -> ApiError {
    let data = EventData::RequestRefused(RequestRefused {
        reason: RefusalReason::VolumeNotHeld,
        message: refusal.message.clone(),
        path,
        method: Some(method.to_owned()),
        by: Some(runner.id.clone()),
        origin: None,
        referer: None,
        secret: None,
        field: None,
    });
    let (org, now) = (runner.org_id.clone(), state.now());
    match state
        .db(move |s| s.append_events(&org, &[typed_event(data, "", now)]))
        .await
    {
        Ok(_) => refusal,
        Err(e) => e,
    }
}
