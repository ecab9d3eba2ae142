//! A run's inputs are held to the rule op arguments are: none may carry
//! one of the org's secrets. Arguments are scrubbed; an input is refused
//! instead (scrubbed bytes would be a different file than the agent meant),
//! before anything of it is stored, and the refusal is recorded naming the
//! secret, never its value.

use std::sync::Arc;

use axum::http::StatusCode;
use moat_core::EventData;
use moat_core::event_data::{RefusalReason, RequestRefused};
use moat_store::typed_event;

use super::AppState;
use super::error::ApiError;
use crate::tools::Scrubber;

/// Where a secret was found: the secret's name and the field's label.
pub(super) struct Found {
    pub secret: String,
    pub field: String,
}

/// The first of `secrets` (`(name, value)`) that one of `fields` (label,
/// bytes) holds, in any form the scrubber looks for (as is,
/// percent-encoded, base64).
pub(super) fn find_secret(
    secrets: &[(String, crate::vault::Secret)],
    fields: &[(String, &[u8])],
) -> Option<Found> {
    secrets.iter().find_map(|(name, value)| {
        let one = Scrubber::new(vec![(name.clone(), value.clone())]);
        fields
            .iter()
            .find(|(_, data)| one.bytes(data).is_some())
            .map(|(field, _)| Found {
                secret: name.clone(),
                field: field.clone(),
            })
    })
}

/// Records the refusal in the org's ledger and answers 422 `secret_in_input`.
pub(super) async fn refuse(state: &Arc<AppState>, org: &str, found: Found) -> ApiError {
    let message = format!(
        "{} holds the org's secret {}: a run's inputs may not carry secrets \
         (a program gets a credential through a tool)",
        found.field, found.secret
    );
    let data = EventData::RequestRefused(RequestRefused {
        reason: RefusalReason::SecretInInput,
        message: message.clone(),
        path: "/v1/runs".into(),
        secret: Some(found.secret.clone()),
        field: Some(found.field.clone()),
        method: None,
        by: None,
        origin: None,
        referer: None,
    });
    let (org, now) = (org.to_owned(), state.now());
    let recorded = state
        .db(move |s| s.append_events(&org, &[typed_event(data, "", now)]))
        .await;
    if let Err(e) = recorded {
        return e;
    }
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "secret_in_input", message)
}
