//! Who is calling: the admin, an org (API token) or a registered runner
//! (signed request), as extractors a handler names in its signature
//! ([`Admin`], [`Agent`], [`OrgAdmin`], [`SignedRunner`]). Tokens are compared by their SHA-256; the store holds
//! nothing else of them.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Uri};
use moat_core::EventData;
use moat_core::event_data::{RunnerRejected, RunnerRejection};
use moat_core::hash::sha256_hex;
use moat_core::request_sig;
use moat_core::sign::PublicKey;
use moat_store::{RunnerRequest, RunnerRow, Standing, TokenKind, typed_event};

use super::AppState;
use super::error::{ApiError, ApiResult};

/// The admin (the `moat serve --admin-token-file` token), as an extractor:
/// checked before anything of the request's body is read.
pub struct Admin;

/// The org whose token (its admin's or an agent's) the request carries.
pub struct Agent(pub String);

/// The org whose admin token the request carries (an agent's is refused).
pub struct OrgAdmin(pub String);

impl FromRequestParts<Arc<AppState>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> ApiResult<Admin> {
        admin(state, &parts.headers).map(|()| Admin)
    }
}

impl FromRequestParts<Arc<AppState>> for Agent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> ApiResult<Agent> {
        agent(state, &parts.headers).await.map(Agent)
    }
}

impl FromRequestParts<Arc<AppState>> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> ApiResult<Operator> {
        operator(state, &parts.headers).await
    }
}

impl FromRequestParts<Arc<AppState>> for OrgAdmin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> ApiResult<OrgAdmin> {
        org_admin(state, &parts.headers).await.map(OrgAdmin)
    }
}

/// A fresh secret token: `moat_` and 32 random bytes in hex.
pub fn new_token() -> String {
    moat_core::random::new_id("moat_")
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Equal without telling by timing how much of it matched (both sides
/// are SHA-256 hex, so their lengths tell nothing).
fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

pub fn admin(state: &AppState, headers: &HeaderMap) -> ApiResult<()> {
    let token =
        bearer(headers).ok_or_else(|| ApiError::unauthorized("the admin token is required"))?;
    if same(
        &sha256_hex(token.as_bytes()),
        &state.config.admin_token_hash,
    ) {
        Ok(())
    } else {
        Err(ApiError::unauthorized("not the admin token"))
    }
}

/// The org whose token (its admin's or an agent's) the request carries:
/// for runs, operations, events and artifacts.
pub async fn agent(state: &Arc<AppState>, headers: &HeaderMap) -> ApiResult<String> {
    Ok(token_org(state, headers).await?.0)
}

/// The org whose admin token the request carries: for what shapes the
/// org's trust (runner builds, bootstrap and agent tokens, manifests,
/// revocations). An agent's token is refused here.
pub async fn org_admin(state: &Arc<AppState>, headers: &HeaderMap) -> ApiResult<String> {
    match token_org(state, headers).await? {
        (org, TokenKind::Api) => Ok(org),
        _ => Err(ApiError::forbidden(
            "admin_token_required",
            "this takes the org's admin token, not an agent token",
        )),
    }
}

async fn token_org(state: &Arc<AppState>, headers: &HeaderMap) -> ApiResult<(String, TokenKind)> {
    let token = bearer(headers).ok_or_else(|| {
        ApiError::unauthorized("an API token is required (Authorization: Bearer ...)")
    })?;
    let hash = sha256_hex(token.as_bytes());
    found_token(state, hash)
        .await?
        .ok_or_else(|| ApiError::unauthorized("unknown API token"))
}

/// The org and kind of the token whose hash is `hash`: from memory when
/// this replica found it lately (no store call, so no hand-off of the
/// worker), else from the store.
async fn found_token(
    state: &Arc<AppState>,
    hash: String,
) -> ApiResult<Option<(String, TokenKind)>> {
    if let Some(known) = state.config.store.known_org_of_token(&hash) {
        return Ok(Some(known));
    }
    state.db(move |s| s.org_of_token(&hash)).await
}

/// An org's admin, as approvals record them: the org and the token's
/// fingerprint (never the token).
#[derive(Debug, Clone)]
pub struct Operator {
    pub org: String,
    pub who: String,
}

/// The operator behind an org admin token given as-is (the Inspector's
/// cookie, or a bearer token).
pub async fn operator_of(state: &Arc<AppState>, token: &str) -> ApiResult<Operator> {
    let hash = sha256_hex(token.as_bytes());
    let who = format!("token:{}", &hash[..16]);
    match found_token(state, hash).await? {
        Some((org, TokenKind::Api)) => Ok(Operator { org, who }),
        Some(_) => Err(ApiError::forbidden(
            "admin_token_required",
            "this takes the org's admin token, not an agent token",
        )),
        None => Err(ApiError::unauthorized("unknown API token")),
    }
}

/// The operator whose admin token the request carries (approvals).
pub async fn operator(state: &Arc<AppState>, headers: &HeaderMap) -> ApiResult<Operator> {
    let token = bearer(headers).ok_or_else(|| {
        ApiError::unauthorized("an API token is required (Authorization: Bearer ...)")
    })?;
    operator_of(state, token).await
}

/// What a registration carries: a bootstrap token (by its hash, as the
/// store holds it) or an enrolment's token (a JWT, verified by signature).
pub enum RegistrationToken {
    Bootstrap(String),
    Enrolment(String),
}

pub fn registration_token(headers: &HeaderMap) -> ApiResult<RegistrationToken> {
    let token = bearer(headers).ok_or_else(|| {
        ApiError::unauthorized("a bootstrap token or an enrolment token is required")
    })?;
    Ok(if crate::enrolment::looks_like_jwt(token) {
        RegistrationToken::Enrolment(token.to_owned())
    } else {
        RegistrationToken::Bootstrap(sha256_hex(token.as_bytes()))
    })
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> ApiResult<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ApiError::unauthorized(format!("signed runner request: {name} missing")))
}

/// The cheap checks of a signed runner request, before its body is read:
/// the headers are there and well formed, and its time is near ours.
pub fn precheck(headers: &HeaderMap, now: i64) -> ApiResult<()> {
    header(headers, request_sig::RUNNER)?;
    header(headers, request_sig::SIGNATURE)?;
    let timestamp: i64 = header(headers, request_sig::TIMESTAMP)?
        .parse()
        .map_err(|_| ApiError::unauthorized("signed runner request: bad timestamp"))?;
    let nonce = header(headers, request_sig::NONCE)?;
    if nonce.len() < 32 || nonce.len() > 128 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::unauthorized(
            "signed runner request: the nonce must be 16 to 64 bytes of hex",
        ));
    }
    // Well outside the window: refused unread (near it, the full check
    // records the refusal against the runner).
    if now.abs_diff(timestamp) > 10 * request_sig::MAX_SKEW_MS.unsigned_abs() {
        return Err(ApiError::unauthorized(
            "signed runner request: timestamp far off",
        ));
    }
    Ok(())
}

/// Who a refusal is about: what the runner is, or (at registration) what it
/// claimed to be.
pub struct Rejected {
    pub runner_id: Option<String>,
    pub runner_hash: String,
    pub manifest_hash: String,
    pub policy_hash: Option<String>,
    pub environment: Option<String>,
    pub version: Option<String>,
}

impl Rejected {
    /// A runner that is registering: what it claims to be.
    pub fn registration(reg: &moat_api::runner::Registration) -> Rejected {
        Rejected {
            runner_id: None,
            runner_hash: reg.runner_hash.clone(),
            manifest_hash: reg.signed_manifest.manifest_hash.clone(),
            policy_hash: Some(reg.signed_manifest.manifest.policy_hash.clone()),
            environment: Some(reg.environment.clone()),
            version: Some(reg.version.clone()),
        }
    }

    /// A registered runner.
    pub fn runner(runner: &RunnerRow) -> Rejected {
        Rejected {
            runner_id: Some(runner.id.clone()),
            runner_hash: runner.runner_hash.clone(),
            manifest_hash: runner.manifest_hash.clone(),
            policy_hash: None,
            environment: None,
            version: None,
        }
    }
}

/// Records `runner.rejected` for `org` with `reason` and answers 403.
pub async fn reject(
    state: &Arc<AppState>,
    org: &str,
    reason: RunnerRejection,
    message: String,
    who: Rejected,
) -> ApiError {
    let now = state.now();
    let data = EventData::RunnerRejected(RunnerRejected {
        reason,
        message: message.clone(),
        runner_hash: who.runner_hash,
        manifest_hash: who.manifest_hash,
        runner_id: who.runner_id,
        policy_hash: who.policy_hash,
        environment: who.environment,
        version: who.version,
    });
    let org = org.to_owned();
    let recorded = state
        .db(move |s| s.append_events(&org, &[typed_event(data, "", now)]))
        .await;
    if let Err(e) = recorded {
        return e;
    }
    ApiError::forbidden(reason.as_str(), message)
}

/// A signed runner request, as received.
struct SignedRequest {
    runner: String,
    method: String,
    path: String,
    timestamp: i64,
    nonce: String,
    body: Vec<u8>,
    signature: String,
}

impl SignedRequest {
    /// Its signature checks out with `key` (base64).
    fn verifies(&self, key: &str) -> bool {
        let signed = request_sig::Signed {
            runner: &self.runner,
            method: &self.method,
            path_and_query: &self.path,
            timestamp_ms: self.timestamp,
            nonce: &self.nonce,
            body: &self.body,
        };
        PublicKey::from_base64(key).is_ok_and(|key| signed.verify(&key, &self.signature).is_ok())
    }
}

/// The public key each runner last signed a request with (a hint the
/// store checks against the runner's current key, never trusted alone).
#[derive(Default)]
pub(crate) struct RunnerKeys(std::sync::Mutex<std::collections::HashMap<String, String>>);

impl RunnerKeys {
    /// More runners than any deployment has: past it the hints start over.
    const MOST: usize = 100_000;

    fn get(&self, runner: &str) -> Option<String> {
        self.lock().get(runner).cloned()
    }

    fn put(&self, runner: &str, key: &str) {
        let mut keys = self.lock();
        if keys.get(runner).map(String::as_str) != Some(key) {
            if keys.len() >= Self::MOST {
                keys.clear();
            }
            keys.insert(runner.to_owned(), key.to_owned());
        }
    }

    fn forget(&self, runner: &str) {
        self.lock().remove(runner);
    }

    /// Keeps the key the store last gave for `runner`. A request refused
    /// for its signature leaves the hint as it was (a forger cannot cost
    /// the runner its next request's one-trip check); the store confirms a
    /// hint before anything relies on it.
    fn learn(&self, runner: &str, checked: &RunnerRequest) {
        match checked {
            RunnerRequest::Checked(Standing { runner: row, .. }) | RunnerRequest::Refused(row) => {
                self.put(runner, &row.public_key);
            }
            RunnerRequest::UnknownRunner => self.forget(runner),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The runner that signed this request, once its signature, timestamp and
/// nonce check out and its build, manifest and signing key still stand.
pub async fn runner(
    state: &Arc<AppState>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<RunnerRow> {
    let id = header(headers, request_sig::RUNNER)?.to_owned();
    let timestamp: i64 = header(headers, request_sig::TIMESTAMP)?
        .parse()
        .map_err(|_| ApiError::unauthorized("signed runner request: bad timestamp"))?;
    let nonce = header(headers, request_sig::NONCE)?.to_owned();
    let signature = header(headers, request_sig::SIGNATURE)?;
    if nonce.len() < 32 || nonce.len() > 128 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::unauthorized(
            "signed runner request: the nonce must be 16 to 64 bytes of hex",
        ));
    }
    let path = uri
        .path_and_query()
        .map_or(uri.path(), |p| p.as_str())
        .to_owned();
    let request = SignedRequest {
        runner: id.clone(),
        method: method.as_str().to_owned(),
        path,
        timestamp,
        nonce: nonce.clone(),
        body: body.to_vec(),
        signature: signature.to_owned(),
    };
    // With the key this runner signed with last time, when it still
    // verifies: the store then reads the runner and spends the nonce in
    // one trip, if that is still the runner's key.
    let known = state
        .runner_keys
        .get(&id)
        .filter(|key| request.verifies(key));
    let now = state.now();
    let expires = timestamp.saturating_add(2 * request_sig::MAX_SKEW_MS);
    let asked = id.clone();
    let checked = state
        .db(move |s| {
            s.runner_request(&asked, &nonce, now, expires, known.as_deref(), |runner| {
                request.verifies(&runner.public_key)
            })
        })
        .await?;
    state.runner_keys.learn(&id, &checked);
    let standing = match checked {
        RunnerRequest::UnknownRunner => return Err(ApiError::unauthorized("unknown runner")),
        RunnerRequest::Refused(runner) => {
            return Err(reject(
                state,
                &runner.org_id,
                RunnerRejection::BadRequestSignature,
                "the request signature does not verify".into(),
                Rejected::runner(&runner),
            )
            .await);
        }
        RunnerRequest::Checked(standing) => standing,
    };
    let runner = standing.runner;
    // A stale request spends its nonce too: harmless, and it is refused.
    let skew = now.abs_diff(timestamp);
    let refusal = if skew > request_sig::MAX_SKEW_MS.unsigned_abs() {
        Some((
            RunnerRejection::StaleRequest,
            format!("request time is {skew} ms from the control plane's"),
        ))
    } else if !standing.fresh_nonce {
        Some((
            RunnerRejection::ReplayedRequest,
            "this request nonce was already used".to_owned(),
        ))
    } else if !standing.build_allowed {
        Some((
            RunnerRejection::Revoked,
            "the runner build is not (or no longer) allowed".to_owned(),
        ))
    } else if !standing.manifest_standing {
        Some((
            RunnerRejection::Revoked,
            "the runner's manifest or its signing key was revoked".to_owned(),
        ))
    } else if !standing.enrolment_standing {
        Some((
            RunnerRejection::EnrolmentRefused,
            "the enrolment the runner registered through was revoked".to_owned(),
        ))
    } else {
        None
    };
    if let Some((reason, message)) = refusal {
        return Err(reject(
            state,
            &runner.org_id,
            reason,
            message,
            Rejected::runner(&runner),
        )
        .await);
    }
    Ok(runner)
}

/// A request signed by a registered runner, with its body (extracted last).
pub struct SignedRunner {
    pub runner: RunnerRow,
    pub body: Bytes,
}

impl axum::extract::FromRequest<Arc<AppState>> for SignedRunner {
    type Rejection = ApiError;

    async fn from_request(
        request: axum::extract::Request,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        // Nothing is buffered for a request that cannot be a runner's.
        precheck(&parts.headers, state.now())?;
        // A result carries its artifacts inline; a volume's chunks and
        // snapshot documents travel as they are.
        let limit = if parts.uri.path().ends_with("/result")
            || (parts.method == axum::http::Method::PUT && parts.uri.path().contains("/volumes/"))
        {
            super::MAX_BODY
        } else {
            super::SMALL_BODY
        };
        let body = axum::body::to_bytes(body, limit)
            .await
            .map_err(|_| ApiError::bad_request("request body unreadable or too large"))?;
        let runner = runner(state, &parts.method, &parts.uri, &parts.headers, &body).await?;
        Ok(SignedRunner { runner, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str) -> RunnerRow {
        RunnerRow {
            public_key: key.into(),
            ..moat_store::runner_row("o", "w")
        }
    }

    fn checked(key: &str) -> RunnerRequest {
        RunnerRequest::Checked(Standing {
            runner: row(key),
            fresh_nonce: true,
            build_allowed: true,
            manifest_standing: true,
            enrolment_standing: true,
        })
    }

    #[test]
    fn the_key_hint_follows_the_store_and_outlives_a_forged_request() {
        let keys = RunnerKeys::default();
        keys.learn("w", &checked("k1"));
        assert_eq!(keys.get("w").as_deref(), Some("k1"));
        // A forged request: refused, the runner's key as the store has it.
        keys.learn("w", &RunnerRequest::Refused(row("k1")));
        assert_eq!(keys.get("w").as_deref(), Some("k1"));
        // A new key (the runner restarted): the store's word replaces it.
        keys.learn("w", &RunnerRequest::Refused(row("k2")));
        assert_eq!(keys.get("w").as_deref(), Some("k2"));
        keys.learn("w", &checked("k3"));
        assert_eq!(keys.get("w").as_deref(), Some("k3"));
        // No such runner any more: nothing kept.
        keys.learn("w", &RunnerRequest::UnknownRunner);
        assert_eq!(keys.get("w"), None);
    }
}
