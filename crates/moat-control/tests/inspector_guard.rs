#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The Inspector's guards: security headers on every `/ui` answer,
//! state-changing forms only from the Inspector's own pages, and the
//! ledger's full re-hash at most once every 10 s.

mod plane;

use std::time::Duration;

use plane::*;
use serde_json::json;

fn cookie(org: &Org) -> (&'static str, String) {
    ("cookie", format!("moat_inspector={}", org.token))
}

fn assert_guarded(headers: &ureq::http::HeaderMap, what: &str) {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("{what}: no {name} in {headers:?}"))
            .to_owned()
    };
    let csp = get("content-security-policy");
    for directive in [
        "default-src 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
        "base-uri 'none'",
    ] {
        assert!(csp.contains(directive), "{what}: {csp}");
    }
    assert_eq!(get("x-frame-options"), "DENY", "{what}");
    assert_eq!(get("x-content-type-options"), "nosniff", "{what}");
}

#[test]
fn every_inspector_answer_carries_the_security_headers() {
    let plane = Plane::sqlite();
    let acme = org(&plane, "acme");
    let (s, run) = post(
        &plane,
        &acme,
        "/v1/runs",
        json!({"id": "r1", "inputs": [{"path": "input/a.txt", "content": "hello"}]}),
    );
    assert_eq!(s, 201, "{run}");
    let sha = run["inputs"][0]["sha256"].as_str().unwrap().to_owned();
    let signed_in = vec![cookie(&acme)];
    let pages = [
        ("/ui", vec![]),
        ("/ui/login", vec![]),
        ("/ui/runs", vec![]),
        ("/ui/runs", signed_in.clone()),
        ("/ui/runs?state=bogus", signed_in.clone()),
        ("/ui/runs/r1", signed_in.clone()),
        ("/ui/runs/nope", signed_in.clone()),
        ("/ui/approvals", signed_in.clone()),
        ("/ui/runners", signed_in.clone()),
        ("/ui/ledger", signed_in.clone()),
        ("/ui/assets/style.css", vec![]),
        ("/ui/assets/live.js", vec![]),
        ("/ui/no-such-page", signed_in.clone()),
    ];
    for (path, headers) in &pages {
        let (status, got, _) = raw("GET", &format!("{}{path}", plane.url), headers, None);
        assert!(status < 500, "{path}: {status}");
        assert_guarded(&got, path);
    }
    let download = format!("/ui/artifacts/{sha}");
    let (status, got, body) = raw("GET", &format!("{}{download}", plane.url), &signed_in, None);
    assert_eq!((status, body.as_slice()), (200, b"hello".as_slice()));
    assert_guarded(&got, &download);
    let (status, got) = head_of(&format!("{}/ui/runs/r1/events", plane.url), &signed_in);
    assert_eq!(status, 200);
    assert_guarded(&got, "the event stream");
    let (status, got, _) = raw(
        "POST",
        &format!("{}/ui/logout", plane.url),
        &[("origin", plane.url.clone())],
        Some(b""),
    );
    assert_eq!(status, 303);
    assert_guarded(&got, "logout");
}

#[test]
fn forms_without_a_same_origin_origin_or_referer_are_refused_and_recorded() {
    let plane = Plane::sqlite();
    let acme = org(&plane, "acme");
    let form = (
        "content-type",
        "application/x-www-form-urlencoded".to_owned(),
    );
    let deny = format!("{}/ui/approvals/apr_missing/deny", plane.url);
    let foreign = [
        vec![],
        vec![("referer", "http://evil.example/ui/approvals".to_owned())],
        vec![("origin", "http://evil.example".to_owned())],
        vec![("origin", "null".to_owned())],
        vec![
            ("origin", "http://evil.example".to_owned()),
            ("referer", format!("{}/ui/approvals", plane.url)),
        ],
    ];
    for (i, extra) in foreign.iter().enumerate() {
        let mut headers = vec![cookie(&acme), form.clone()];
        headers.extend(extra.iter().cloned());
        let (status, got, body) = raw("POST", &deny, &headers, Some(b"reason=no"));
        assert_eq!(
            status,
            403,
            "attempt {i}: {}",
            String::from_utf8_lossy(&body)
        );
        assert_guarded(&got, "a refused form");
    }
    let refused = plane.events_named("request.refused");
    assert_eq!(refused.len(), foreign.len(), "{refused:?}");
    for e in &refused {
        assert_eq!(e.data["reason"], "cross_site_request", "{e:?}");
        assert_eq!(e.data["path"], "/ui/approvals/apr_missing/deny", "{e:?}");
    }
    // Logging in and out are forms too.
    let (status, _, _) = raw(
        "POST",
        &format!("{}/ui/login", plane.url),
        std::slice::from_ref(&form),
        Some(format!("token={}", acme.token).as_bytes()),
    );
    assert_eq!(status, 403);
    let (status, _, _) = raw(
        "POST",
        &format!("{}/ui/logout", plane.url),
        &[cookie(&acme)],
        Some(b""),
    );
    assert_eq!(status, 403);

    // From the Inspector's own pages, by Origin or (without one) by Referer,
    // the form goes through to its handler (no such approval here).
    for extra in [
        ("origin", plane.url.clone()),
        ("referer", format!("{}/ui/approvals", plane.url)),
    ] {
        let headers = vec![cookie(&acme), form.clone(), extra];
        let (status, _, body) = raw("POST", &deny, &headers, Some(b"reason=no"));
        assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    }
    let (status, got, _) = raw(
        "POST",
        &format!("{}/ui/login", plane.url),
        &[form, ("origin", plane.url.clone())],
        Some(format!("token={}", acme.token).as_bytes()),
    );
    assert_eq!(status, 303);
    assert!(got.get("set-cookie").is_some());
}

fn ledger_status(plane: &Plane, org: &Org) -> String {
    let (status, _, body) = raw(
        "GET",
        &format!("{}/ui/ledger?verify=1", plane.url),
        &[cookie(org)],
        None,
    );
    assert_eq!(status, 200);
    let page = String::from_utf8(body).unwrap();
    let start = page.find("id=\"ledger-status\"").expect("the status");
    let end = page[start..].find("</span>").unwrap();
    page[start..start + end].to_owned()
}

#[test]
fn the_ledger_is_re_hashed_at_most_once_every_ten_seconds() {
    let plane = Plane::sqlite();
    let acme = org(&plane, "acme");
    let (s, _) = post(&plane, &acme, "/v1/runs", json!({"id": "r1"}));
    assert_eq!(s, 201);
    let first = ledger_status(&plane, &acme);
    let events = |status: &str| -> u64 {
        let count = status.split("intact: ").nth(1).expect(status);
        count.split(' ').next().unwrap().parse().unwrap()
    };
    let counted = events(&first);
    // New events within 10 s: the answer is the last verification's, and
    // says when the next one may run.
    let (s, _) = post(&plane, &acme, "/v1/runs", json!({"id": "r2"}));
    assert_eq!(s, 201);
    plane.clock.advance(Duration::from_secs(9));
    let again = ledger_status(&plane, &acme);
    assert_eq!(events(&again), counted, "{again}");
    assert!(again.contains("next verification"), "{again}");
    // After 10 s, the chain is re-hashed again.
    plane.clock.advance(Duration::from_secs(1));
    let later = ledger_status(&plane, &acme);
    assert!(events(&later) > counted, "{later}");
    assert!(!later.contains("next verification"), "{later}");
}
