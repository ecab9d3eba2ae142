//! What every `/ui` answer gets, whatever its handler: security headers
//! (the pages load only their own stylesheet and script, and are framed
//! by nobody), and, for a request that changes something, proof that it
//! came from the Inspector's own pages. The session cookie is SameSite,
//! but a browser without SameSite, or a site sharing our registrable
//! domain, would still send it; a same-origin `Origin` (or, without one,
//! `Referer`) is required, and a form with neither is refused (403) and
//! recorded.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use moat_core::EventData;
use moat_core::event_data::{RefusalReason, RequestRefused};
use moat_store::typed_event;

use super::{cookie_token, pages};
use crate::server::AppState;
use crate::server::auth;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub async fn guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    let refused = if safe {
        None
    } else {
        same_origin(&request).err()
    };
    let mut response = match refused {
        // The parts only: a body is not shared across the await.
        Some(why) => refuse(&state, &request.into_parts().0, why).await,
        None => next.run(request).await,
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Our own forms keep sending a Referer, which the check above accepts.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// `scheme://authority` of an `Origin` or `Referer`: its authority.
fn authority(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(&rest[..end]).filter(|a| !a.is_empty())
}

fn same_origin(request: &Request) -> Result<(), &'static str> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .ok_or("the request names no host")?;
    let from = |name: header::HeaderName| {
        headers
            .get(name)
            .map(|v| v.to_str().ok().and_then(authority))
    };
    // An Origin decides when there is one; a Referer only without it.
    let (sent, problem) = match (from(header::ORIGIN), from(header::REFERER)) {
        (Some(origin), _) => (origin, "the form's Origin is another site"),
        (None, Some(referer)) => (referer, "the form's Referer is another site"),
        (None, None) => return Err("the form carries neither Origin nor Referer"),
    };
    match sent {
        Some(authority) if authority.eq_ignore_ascii_case(host) => Ok(()),
        _ => Err(problem),
    }
}

/// 403, recorded in the ledger of the org whose session cookie the request
/// carries (without one there is no org to record it for: the server's log).
async fn refuse(state: &Arc<AppState>, request: &Parts, why: &'static str) -> Response {
    let path = request.uri.path().to_owned();
    let message = format!("cross-site request refused: {why}");
    let operator = match cookie_token(&request.headers) {
        Some(token) => auth::operator_of(state, token).await.ok(),
        None => None,
    };
    match operator {
        Some(op) => {
            let data = EventData::RequestRefused(RequestRefused {
                reason: RefusalReason::CrossSiteRequest,
                message: message.clone(),
                path: path.clone(),
                method: Some(request.method.as_str().to_owned()),
                by: Some(op.who.clone()),
                origin: header_text(&request.headers, header::ORIGIN),
                referer: header_text(&request.headers, header::REFERER),
                secret: None,
                field: None,
            });
            let now = state.now();
            let recorded = state
                .db(move |s| s.append_events(&op.org, &[typed_event(data, "", now)]))
                .await;
            if let Err(e) = recorded {
                return (e.status, Html(pages::error(&e.message))).into_response();
            }
        }
        None => eprintln!("moat serve: inspector: {message} ({path}, no session)"),
    }
    (StatusCode::FORBIDDEN, Html(pages::error(&message))).into_response()
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<String> {
    let text = headers.get(name)?.to_str().ok()?;
    Some(text.chars().take(200).collect())
}
