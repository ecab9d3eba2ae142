//! Settling approval requests (approve, deny, expire), with their events:
//! shared by the API, the Inspector and the sweep.

use std::sync::Arc;

use axum::http::StatusCode;
use moat_core::event_data::{
    ApprovalDenied, ApprovalExpired, ApprovalGranted, ArtifactPromoted, ArtifactRejected,
    CapabilityDenied, CapabilityGranted, PolicyDecision,
};
use moat_core::exports::{RejectRule, Rejection};
use moat_core::{DenialReason, EventData};
use moat_store::{
    ApprovalRow, ApprovalState, HeldOutcome, Kept, Settled, Settlement, Store, StoreError, stamp,
    typed_event,
};

use super::AppState;
use super::auth::Operator;
use super::error::{ApiError, ApiResult};
use crate::decide::{DecisionRecord, denied_result};

/// The longest reason an approver may give.
const MAX_REASON: usize = 2000;

/// Approves or denies a pending request as `operator`, through `via`
/// (`api`, `inspector`). A request past its time is expired instead, and
/// answers 409 like one settled before.
pub async fn resolve(
    state: &Arc<AppState>,
    operator: &Operator,
    id: &str,
    approve: bool,
    reason: Option<String>,
    via: &'static str,
) -> ApiResult<ApprovalRow> {
    let reason = reason
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    if reason.as_ref().is_some_and(|r| r.len() > MAX_REASON) {
        return Err(ApiError::bad_request(format!(
            "reason: at most {MAX_REASON} bytes"
        )));
    }
    if !approve && reason.is_none() {
        return Err(ApiError::bad_request(
            "a denial needs a reason (the agent and the ledger get it)",
        ));
    }
    // An export's file goes into the output store before the approval
    // that promotes it is recorded (a store that cannot take it leaves the
    // request pending, to approve again). A staged file is never removed:
    // another promotion of the same bytes may be writing it too, and an
    // object no `outputs` row names is never served.
    let now = state.now();
    let staged = match approve {
        true => stage_held_export(state, &operator.org, id, now).await?,
        false => None,
    };
    let kept = match staged {
        Some(_) => Kept::Outputs,
        None => Kept::Database,
    };
    let (org, who, lookup) = (operator.org.clone(), operator.who.clone(), id.to_owned());
    let settled = state
        .db(move |s| {
            let Some(current) = s.approval(&org, &lookup)? else {
                return Ok(Settled::Missing);
            };
            let verdict = if approve {
                Verdict::Approved(kept)
            } else {
                Verdict::Denied
            };
            match settle(
                s,
                &current,
                verdict,
                Some(&who),
                reason.as_deref(),
                via,
                now,
            )? {
                Settled::Late(late) => {
                    settle(s, &late, Verdict::Expired, None, None, via, now)?;
                    Ok(Settled::Late(late))
                }
                other => Ok(other),
            }
        })
        .await?;
    match settled {
        Settled::Done(row) => {
            state.notify_run(&row.run_id);
            Ok(row)
        }
        Settled::Missing => Err(ApiError::not_found(format_args!("approval {id}"))),
        Settled::Already(row) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "approval_settled",
            format!("approval {id} is already {}", row.state.as_str()),
        )),
        Settled::Late(late) => {
            state.notify_run(&late.run_id);
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "approval_expired",
                format!("approval {id} expired before it was resolved; the operation failed"),
            ))
        }
    }
}

/// Writes the file an export approval holds into the output store; its
/// hash, if it did (`None`: not an export, no longer pending, past its
/// time, or promoted files stay in the database). A request past its time
/// is expired by the settling that follows, so nothing is staged for it.
async fn stage_held_export(
    state: &Arc<AppState>,
    org: &str,
    approval: &str,
    now: i64,
) -> ApiResult<Option<String>> {
    if state.config.outputs.in_database() {
        return Ok(None);
    }
    let (org, approval) = (org.to_owned(), approval.to_owned());
    let held = state
        .db(move |s| {
            let pending = s
                .approval(&org, &approval)?
                .is_some_and(|a| a.state == ApprovalState::Pending && a.expires_ms > now);
            if !pending {
                return Ok(None);
            }
            Ok(match s.held_for(&org, &approval)? {
                Some(row) => s.held_bytes(&org, &approval)?.map(|b| (row.sha256, b)),
                None => None,
            })
        })
        .await?;
    let Some((sha256, bytes)) = held else {
        return Ok(None);
    };
    if moat_core::hash::sha256_hex(&bytes) != sha256 {
        return Err(
            StoreError::Corrupt(format!("held file {sha256} does not hash to its name")).into(),
        );
    }
    state
        .config
        .outputs
        .put(&sha256, &bytes)
        .await
        .map_err(super::error::outputs_unavailable)?;
    Ok(Some(sha256))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Approved; an export's held file is then kept there (already written
    /// to the output store with `Kept::Outputs`).
    Approved(Kept),
    Denied,
    Expired,
}

/// Settles one request with its events: `approval.granted` and
/// `capability.granted`; or `approval.denied`/`.expired` and
/// `capability.denied` with the operation's denial.
fn settle(
    store: &Store,
    approval: &ApprovalRow,
    verdict: Verdict,
    by: Option<&str>,
    reason: Option<&str>,
    via: &str,
    now: i64,
) -> Result<Settled, StoreError> {
    let run = approval.run_id.as_str();
    let op = store.op(&approval.org_id, run, &approval.op_id)?;
    let correlation = op
        .as_ref()
        .and_then(|o| o.envelope["correlationId"].as_str().map(str::to_owned))
        .unwrap_or_else(|| approval.op_id.clone());
    let with_op = |mut e: moat_core::Event| {
        e.op_id = Some(approval.op_id.clone());
        e.correlation_id = Some(correlation.clone());
        e
    };
    if approval.summary["op"] == crate::policy::EXPORT_ACTION {
        return settle_export(store, approval, verdict, by, reason, via, now);
    }
    let (state, events, op_result) = match verdict {
        Verdict::Approved(_) => {
            // The grant reads like any other: the decision it completes
            // (policy, manifest, resource, sandbox), then the approval.
            let decided = op
                .and_then(|o| serde_json::from_value::<DecisionRecord>(o.decision).ok())
                .map(|record| record.granted())
                .unwrap_or_default();
            let granted = CapabilityGranted {
                decision: Some(PolicyDecision::Allow),
                policies: Some(vec![approval.rule.clone()]),
                rule: Some(approval.rule.clone()),
                risk: Some(approval.risk.clone()),
                approval_id: Some(approval.id.clone()),
                by: by.map(str::to_owned),
                via: Some(via.to_owned()),
                reason: reason.map(str::to_owned),
                ..decided
            };
            (
                ApprovalState::Approved,
                vec![
                    with_op(typed_event(
                        settled_event(approval, verdict, by, reason, via),
                        run,
                        now,
                    )),
                    with_op(typed_event(EventData::CapabilityGranted(granted), run, now)),
                ],
                None,
            )
        }
        Verdict::Denied | Verdict::Expired => {
            let settled = settled_event(approval, verdict, by, reason, via);
            let (denial, message, state) = if verdict == Verdict::Denied {
                (
                    DenialReason::ApprovalDenied,
                    format!(
                        "denied by the approver: {}",
                        reason.unwrap_or("no reason given")
                    ),
                    ApprovalState::Denied,
                )
            } else {
                (
                    DenialReason::ApprovalExpired,
                    format!(
                        "nobody approved it by {}: failed closed",
                        stamp(approval.expires_ms)
                    ),
                    ApprovalState::Expired,
                )
            };
            let denied = CapabilityDenied {
                decision: Some(PolicyDecision::Deny),
                reason: Some(denial),
                message: Some(message.clone()),
                rule: Some(approval.rule.clone()),
                risk: Some(approval.risk.clone()),
                approval_id: Some(approval.id.clone()),
                by: by.map(str::to_owned),
                via: Some(via.to_owned()),
                ..CapabilityDenied::default()
            };
            (
                state,
                vec![
                    with_op(typed_event(settled, run, now)),
                    with_op(typed_event(EventData::CapabilityDenied(denied), run, now)),
                ],
                Some(denied_result(&approval.op_id, denial, message)),
            )
        }
    };
    store.settle_approval(
        &approval.org_id,
        &approval.id,
        &Settlement {
            state,
            by,
            reason,
            op_result: op_result.as_ref(),
            events: &events,
            export: None,
        },
        now,
    )
}

/// The approval event a verdict records.
fn settled_event(
    approval: &ApprovalRow,
    verdict: Verdict,
    by: Option<&str>,
    reason: Option<&str>,
    via: &str,
) -> EventData {
    match verdict {
        Verdict::Approved(_) => EventData::ApprovalGranted(ApprovalGranted {
            approval_id: approval.id.clone(),
            rule: approval.rule.clone(),
            risk: approval.risk.clone(),
            via: via.to_owned(),
            by: by.unwrap_or_default().to_owned(),
            reason: reason.map(str::to_owned),
        }),
        Verdict::Denied => EventData::ApprovalDenied(ApprovalDenied {
            approval_id: approval.id.clone(),
            rule: approval.rule.clone(),
            risk: approval.risk.clone(),
            via: via.to_owned(),
            by: by.unwrap_or_default().to_owned(),
            reason: reason.map(str::to_owned),
        }),
        Verdict::Expired => EventData::ApprovalExpired(ApprovalExpired {
            approval_id: approval.id.clone(),
            rule: Some(approval.rule.clone()),
            risk: Some(approval.risk.clone()),
            via: Some(via.to_owned()),
            by: by.map(str::to_owned),
            reason: reason.map(str::to_owned),
        }),
    }
}

/// Settles an export's approval: the held file is promoted (an artifact,
/// `artifact.promoted`) or rejected (quarantined, `artifact.rejected` with
/// rule `not_approved`); the operation, long finished, is left as it is.
fn settle_export(
    store: &Store,
    approval: &ApprovalRow,
    verdict: Verdict,
    by: Option<&str>,
    reason: Option<&str>,
    via: &str,
    now: i64,
) -> Result<Settled, StoreError> {
    let run = approval.run_id.as_str();
    // What is promoted or rejected is the held file, as stored.
    let Some(held) = store.held_for(&approval.org_id, &approval.id)? else {
        return Err(StoreError::Corrupt(format!(
            "export approval {} holds no file",
            approval.id
        )));
    };
    let path = held.path.clone();
    let sha256 = held.sha256.clone();
    let size = u64::try_from(held.size).unwrap_or(0);
    let with_op = |mut e: moat_core::Event| {
        e.op_id = Some(approval.op_id.clone());
        e
    };
    let mut events = vec![with_op(typed_event(
        settled_event(approval, verdict, by, reason, via),
        run,
        now,
    ))];
    let reasons;
    let (state, outcome) = match verdict {
        Verdict::Approved(kept) => {
            let exported_as =
                serde_json::from_value(serde_json::Value::String(held.exported_as.clone()))
                    .map_err(|e| {
                        StoreError::Corrupt(format!("export approval {}: {e}", approval.id))
                    })?;
            events.push(with_op(typed_event(
                EventData::ArtifactPromoted(ArtifactPromoted {
                    path,
                    sha256,
                    size,
                    exported_as,
                    approval_id: Some(approval.id.clone()),
                    runner_id: None,
                    runner_hash: None,
                    manifest_hash: None,
                }),
                run,
                now,
            )));
            (ApprovalState::Approved, HeldOutcome::Promote(kept))
        }
        Verdict::Denied | Verdict::Expired => {
            let (detail, state) = if verdict == Verdict::Denied {
                (
                    format!(
                        "denied by the approver: {}",
                        reason.unwrap_or("no reason given")
                    ),
                    ApprovalState::Denied,
                )
            } else {
                (
                    format!(
                        "nobody approved it by {}: failed closed",
                        stamp(approval.expires_ms)
                    ),
                    ApprovalState::Expired,
                )
            };
            reasons = vec![Rejection {
                rule: RejectRule::NotApproved,
                detail,
            }];
            events.push(with_op(typed_event(
                EventData::ArtifactRejected(ArtifactRejected {
                    path,
                    size,
                    sha256: Some(sha256),
                    reasons: reasons.clone(),
                    runner_id: None,
                    runner_hash: None,
                    manifest_hash: None,
                }),
                run,
                now,
            )));
            (state, HeldOutcome::Reject(&reasons))
        }
    };
    store.settle_approval(
        &approval.org_id,
        &approval.id,
        &Settlement {
            state,
            by,
            reason,
            op_result: None,
            events: &events,
            export: Some(outcome),
        },
        now,
    )
}

/// Expires the requests whose time is up (the sweep); how many.
pub fn expire_due(store: &Store, now: i64) -> Result<usize, StoreError> {
    let mut expired = 0;
    for approval in store.due_approvals(now, 100)? {
        if let Settled::Done(_) = settle(
            store,
            &approval,
            Verdict::Expired,
            None,
            None,
            "expiry",
            now,
        )? {
            expired += 1;
        }
    }
    Ok(expired)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used)]

    use moat_core::{EventData, OpStatus};
    use moat_store::{NewApproval, NewOp, NewRun, OpState};
    use serde_json::{Value, json};

    use super::*;

    const EXPIRES: i64 = 10_000;

    /// A store with one op waiting for approval `apr` (expiring at
    /// [`EXPIRES`]); the org's id.
    fn waiting(dir: &std::path::Path) -> (Store, String) {
        let store = Store::open(&format!("sqlite:{}", dir.join("c.db").display())).unwrap();
        let org = store.create_org("acme", "token-hash", 1).unwrap();
        store
            .create_run(
                &NewRun {
                    org: &org,
                    id: "r",
                    environment: "test",
                    inputs: &[],
                    blobs: &[],
                    max_attempts: 1,
                    manifest_hash: None,
                    needs_classes: &[],
                    volumes: &[],
                },
                1,
            )
            .unwrap();
        let (envelope, decision, summary) = (
            json!({"id": "o", "correlationId": "c-o"}),
            json!({"decision": "require_approval", "policyHash": "p", "rule": "sensitive"}),
            json!({"op": "artifact_read", "args": {}}),
        );
        store
            .insert_op(
                &NewOp {
                    org: &org,
                    run: "r",
                    id: "o",
                    op: "artifact_read",
                    state: OpState::PendingApproval,
                    envelope: &envelope,
                    decision: &decision,
                    result: None,
                    events: &[],
                    approval: Some(NewApproval {
                        id: "apr",
                        rule: "sensitive",
                        risk: "high",
                        summary: &summary,
                        expires_ms: EXPIRES,
                    }),
                },
                2,
            )
            .unwrap()
            .expect("op");
        (store, org)
    }

    struct Case {
        name: &'static str,
        /// Settled once before (approved), or not.
        settled_before: bool,
        verdict: Verdict,
        now: i64,
        /// `Done`, `Already` or `Late`.
        outcome: &'static str,
        approval: ApprovalState,
        op: OpState,
        /// The events of the run, in order, after the settlement.
        events: &'static [&'static str],
        denial: Option<DenialReason>,
    }

    #[test]
    fn settling_a_request() {
        let cases = [
            Case {
                name: "approved in time",
                settled_before: false,
                verdict: Verdict::Approved(Kept::Database),
                now: 5_000,
                outcome: "Done",
                approval: ApprovalState::Approved,
                op: OpState::Queued,
                events: &["approval.granted", "capability.granted"],
                denial: None,
            },
            Case {
                name: "denied in time",
                settled_before: false,
                verdict: Verdict::Denied,
                now: 5_000,
                outcome: "Done",
                approval: ApprovalState::Denied,
                op: OpState::Denied,
                events: &["approval.denied", "capability.denied"],
                denial: Some(DenialReason::ApprovalDenied),
            },
            Case {
                name: "expired by the sweep",
                settled_before: false,
                verdict: Verdict::Expired,
                now: EXPIRES,
                outcome: "Done",
                approval: ApprovalState::Expired,
                op: OpState::Denied,
                events: &["approval.expired", "capability.denied"],
                denial: Some(DenialReason::ApprovalExpired),
            },
            Case {
                name: "approved too late: nothing changes here",
                settled_before: false,
                verdict: Verdict::Approved(Kept::Database),
                now: EXPIRES,
                outcome: "Late",
                approval: ApprovalState::Pending,
                op: OpState::PendingApproval,
                events: &[],
                denial: None,
            },
            Case {
                name: "denied after an approval: the first answer stands",
                settled_before: true,
                verdict: Verdict::Denied,
                now: 6_000,
                outcome: "Already",
                approval: ApprovalState::Approved,
                op: OpState::Queued,
                events: &["approval.granted", "capability.granted"],
                denial: None,
            },
        ];
        for case in cases {
            let dir = tempfile::tempdir().unwrap();
            let (store, org) = waiting(dir.path());
            let current = |store: &Store| store.approval(&org, "apr").unwrap().expect("approval");
            if case.settled_before {
                let first = settle(
                    &store,
                    &current(&store),
                    Verdict::Approved(Kept::Database),
                    Some("alice"),
                    None,
                    "api",
                    4_000,
                )
                .unwrap();
                assert!(matches!(first, Settled::Done(_)), "{}", case.name);
            }
            let reason = (case.verdict == Verdict::Denied).then_some("not today");
            let by = (case.verdict != Verdict::Expired).then_some("bob");
            let outcome = settle(
                &store,
                &current(&store),
                case.verdict,
                by,
                reason,
                "api",
                case.now,
            )
            .unwrap();
            let outcome = match outcome {
                Settled::Done(_) => "Done",
                Settled::Already(_) => "Already",
                Settled::Late(_) => "Late",
                Settled::Missing => "Missing",
            };
            assert_eq!(outcome, case.outcome, "{}", case.name);
            assert_eq!(current(&store).state, case.approval, "{}", case.name);
            let op = store.op(&org, "r", "o").unwrap().expect("op");
            assert_eq!(op.state, case.op, "{}", case.name);
            let result: Option<moat_core::OpResult> = op
                .result
                .map(|r| serde_json::from_value(r).expect("an op result"));
            assert_eq!(
                result.as_ref().and_then(|r| r.reason),
                case.denial,
                "{}",
                case.name
            );
            if case.denial.is_some() {
                assert_eq!(result.map(|r| r.status), Some(OpStatus::Denied));
            }
            let events = store.events_of_run("r").unwrap();
            let kinds: Vec<&str> = events
                .iter()
                .map(|e| e.event.event_type.as_str())
                .filter(|t| *t != "run.created")
                .collect();
            assert_eq!(kinds, case.events, "{}", case.name);
            for e in &events {
                EventData::parse(e.event.event_type, &e.event.data)
                    .unwrap_or_else(|err| panic!("{}: {err}: {:?}", case.name, e.event));
                if e.event.event_type != moat_core::EventType::RunCreated {
                    assert_eq!(e.event.op_id.as_deref(), Some("o"), "{}", case.name);
                    assert_eq!(
                        e.event.correlation_id.as_deref(),
                        Some("c-o"),
                        "{}",
                        case.name
                    );
                    let by_seen = e.event.data.get("by").and_then(Value::as_str);
                    if case.verdict != Verdict::Expired && !case.settled_before {
                        assert_eq!(by_seen, Some("bob"), "{}", case.name);
                    }
                }
            }
        }
    }
}
