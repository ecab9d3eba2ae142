#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The control plane's HTTP API in process, on a real socket, over both
//! store backends, with a manual clock: runner registration and its
//! rejections, signed-request replay protection, revocation, the manifest
//! lifecycle's claim gate and grace, and the OpenAPI document's coverage.

mod plane;

use std::time::Duration;

use moat_control::clock::Clock;
use moat_control::server::{self, ROUTES};
use moat_core::EventType;
use moat_core::sign::PrivateKey;
use plane::*;
use serde_json::{Value, json};

fn register(plane: &Plane, org: &Org, body: Value) -> (u16, Value) {
    let (_, t) = post(plane, org, "/v1/bootstrap-tokens", json!({}));
    let token = t["token"].as_str().unwrap();
    call(
        "POST",
        &format!("{}/v1/runner/register", plane.url),
        &bearer(token),
        body.to_string().as_bytes(),
    )
}

fn runner_call(plane: &Plane, runner: &Runner, path: &str) -> (u16, Value) {
    let headers = signed_headers(runner, "POST", path, b"", plane.clock.now_ms());
    call("POST", &format!("{}{path}", plane.url), &headers, b"")
}

fn rejections(plane: &Plane) -> Vec<String> {
    plane
        .store
        .all_events(0, 100_000)
        .unwrap()
        .into_iter()
        .filter(|e| e.event.event_type == EventType::RunnerRejected)
        .map(|e| {
            e.event.data["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[test]
fn registration_refuses_each_bad_runner_with_its_reason() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let current = manifest_with(&plane, |_| {}, &plane.key);
        assert_eq!(
            post(
                &plane,
                &acme,
                "/v1/manifests",
                serde_json::to_value(&current).unwrap()
            )
            .0,
            201
        );
        let rk = PrivateKey::from_seed([1; 32]);
        // Not allowlisted yet.
        let (s, b) = register(
            &plane,
            &acme,
            registration(&current, &rk, json!(["artifact_read"])),
        );
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("unknown_runner_hash")),
            "{b}"
        );
        assert_eq!(
            post(&plane, &acme, "/v1/runner-builds", json!({"sha256": HASH})).0,
            201
        );

        let stranger = PrivateKey::from_seed([2; 32]);
        let older = manifest_with(
            &plane,
            |m| m["createdAt"] = json!(moat_store::stamp(T0 - 1000)),
            &plane.key,
        );
        let cases = [
            (
                registration(
                    &manifest_with(&plane, |_| {}, &stranger),
                    &rk,
                    json!(["artifact_read"]),
                ),
                "bad_signature",
            ),
            (
                registration(
                    &manifest_with(&plane, |m| m["environment"] = json!("staging"), &plane.key),
                    &rk,
                    json!(["artifact_read"]),
                ),
                "wrong_environment",
            ),
            (
                registration(
                    &manifest_with(&plane, |m| m["policyHash"] = json!(HASH), &plane.key),
                    &rk,
                    json!(["artifact_read"]),
                ),
                "stale_policy",
            ),
            (
                registration(&older, &rk, json!(["artifact_read"])),
                "stale_manifest",
            ),
            (
                registration(&current, &rk, json!(["artifact_read", "exec_argv"])),
                "ops_beyond_manifest",
            ),
        ];
        for (body, reason) in cases {
            let (s, b) = register(&plane, &acme, body);
            assert_eq!(
                (s, b["error"]["reason"].as_str()),
                (403, Some(reason)),
                "{b}"
            );
        }
        // A bootstrap token is good once.
        let (_, t) = post(&plane, &acme, "/v1/bootstrap-tokens", json!({}));
        let token = t["token"].as_str().unwrap();
        let body = registration(&current, &rk, json!(["artifact_read"])).to_string();
        let url = format!("{}/v1/runner/register", plane.url);
        assert_eq!(call("POST", &url, &bearer(token), body.as_bytes()).0, 201);
        assert_eq!(call("POST", &url, &bearer(token), body.as_bytes()).0, 401);
        // An expired manifest.
        plane.clock.set(T0 + 11 * DAY);
        let (s, b) = register(
            &plane,
            &acme,
            registration(&current, &rk, json!(["artifact_read"])),
        );
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("manifest_expired")),
            "{b}"
        );
        assert_eq!(
            rejections(&plane),
            [
                "unknown_runner_hash",
                "bad_signature",
                "wrong_environment",
                "stale_policy",
                "stale_manifest",
                "ops_beyond_manifest",
                "manifest_expired"
            ],
            "{}",
            plane.store.backend()
        );
    }
}

#[test]
fn signed_requests_cannot_be_replayed_altered_or_outlive_revocation() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let runner = registered(&plane, &acme, 3);
        let path = "/v1/runner/claim";
        let headers = signed_headers(&runner, "POST", path, b"", T0);
        let url = format!("{}{path}", plane.url);
        assert_eq!(call("POST", &url, &headers, b"").0, 204, "a fresh request");
        let (s, b) = call("POST", &url, &headers, b"");
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("replayed_request")),
            "{b}"
        );
        let mut altered = signed_headers(&runner, "POST", path, b"", T0);
        altered[1].1 = (T0 + 1).to_string();
        assert_eq!(
            call("POST", &url, &altered, b"").1["error"]["reason"],
            "bad_request_signature"
        );
        let old = signed_headers(&runner, "POST", path, b"", T0 - 60_000);
        assert_eq!(
            call("POST", &url, &old, b"").1["error"]["reason"],
            "stale_request"
        );
        // Revoking the build takes effect on the very next request.
        assert_eq!(
            post(
                &plane,
                &acme,
                &format!("/v1/runner-builds/{HASH}/revoke"),
                json!({})
            )
            .0,
            200
        );
        let (s, b) = runner_call(&plane, &runner, path);
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("revoked")),
            "{b}"
        );
        assert_eq!(
            rejections(&plane),
            [
                "replayed_request",
                "bad_request_signature",
                "stale_request",
                "revoked"
            ]
        );
    }
}

#[test]
fn the_manifest_lifecycle_gates_claims_and_bounds_runs_by_grace() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let runner = registered(&plane, &acme, 4);
        for id in ["early", "late"] {
            assert_eq!(post(&plane, &acme, "/v1/runs", json!({"id": id})).0, 201);
        }
        // Claimed 1 s before expiry: it still gets the full grace (timeoutMs, 60 s).
        plane.clock.set(T0 + 10 * DAY - 1000);
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/claim");
        assert_eq!((s, b["run"]["id"].as_str()), (200, Some("early")), "{b}");
        assert_eq!(b["finishBy"], moat_store::stamp(T0 + 10 * DAY + 60_000));
        // After expiry no new claim.
        plane.clock.set(T0 + 10 * DAY);
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/claim");
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("manifest_expired")),
            "{b}"
        );
        // In flight until expiresAt + grace...
        plane.clock.set(T0 + 10 * DAY + 59_000);
        assert_eq!(
            runner_call(&plane, &runner, "/v1/runner/runs/early/next").0,
            204
        );
        // ...then force-failed into the dead-letter queue.
        plane.clock.set(T0 + 10 * DAY + 61_000);
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/runs/early/next");
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (409, Some("manifest_expired_with_grace_exceeded")),
            "{b}"
        );
        let run = plane
            .store
            .runs(
                &plane
                    .store
                    .org_of_api_token(&moat_core::hash::sha256_hex(acme.token.as_bytes()))
                    .unwrap()
                    .unwrap(),
                None,
                10,
            )
            .unwrap();
        let early = run.iter().find(|r| r.id == "early").unwrap();
        assert_eq!(
            (early.state.as_str(), early.error.as_deref()),
            (
                "dead_lettered",
                Some("manifest_expired_with_grace_exceeded")
            )
        );
        let late = run.iter().find(|r| r.id == "late").unwrap();
        assert_eq!(late.state.as_str(), "queued", "claimed after expiry");
        assert_eq!(rejections(&plane), ["manifest_expired"]);
    }
}

fn collect_refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r.clone()),
                    _ => collect_refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

#[test]
fn every_documented_route_is_served() {
    let plane = Plane::sqlite();
    let mut seen = std::collections::BTreeSet::new();
    for (method, path, _, _) in ROUTES {
        assert!(seen.insert((method, path)), "{method} {path} listed twice");
        let concrete = path.replace(['{', '}'], "");
        let url = format!("{}{concrete}", plane.url);
        let mut response = match *method {
            "get" => agent().get(&url).call(),
            "put" => agent().put(&url).send_empty(),
            "delete" => agent().delete(&url).call(),
            _ => agent().post(&url).send_empty(),
        }
        .unwrap();
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_vec().unwrap();
        // The router's own 404/405 have no body; ours always explain.
        assert!(
            !(status == 405 || (status == 404 && body.is_empty())),
            "{method} {path}: {status}"
        );
    }
    // Both ways: what the router serves is documented, and the reverse.
    let served: std::collections::BTreeSet<(&str, &str)> =
        server::routes().served().iter().copied().collect();
    let listed: std::collections::BTreeSet<(&str, &str)> =
        ROUTES.iter().map(|(m, p, _, _)| (*m, *p)).collect();
    assert_eq!(
        served.difference(&listed).collect::<Vec<_>>(),
        Vec::<&(&str, &str)>::new(),
        "served but not documented"
    );
    assert_eq!(
        listed.difference(&served).collect::<Vec<_>>(),
        Vec::<&(&str, &str)>::new(),
        "documented but not served"
    );
    let (s, doc) = call("GET", &format!("{}/openapi.json", plane.url), &[], b"");
    assert_eq!(s, 200);
    assert_eq!(doc, server::openapi_document());
    // Every schema reference points at a schema the document holds.
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() > 20, "{refs:?}");
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r}"));
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "dangling {r}"
        );
    }
    let paths = doc["paths"].as_object().unwrap();
    let documented: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
    // A route for any method (a run's ports) is documented once per method.
    let expected: usize = ROUTES
        .iter()
        .map(|(method, ..)| if *method == "any" { 7 } else { 1 })
        .sum();
    assert_eq!(documented, expected);
    // A schema for every body: each route's success says what it carries
    // (`plane::contract` then holds every answer of these tests to it).
    assert_eq!(
        server::openapi_undocumented(),
        Vec::<(&str, &str)>::new(),
        "routes the document has no bodies for"
    );
    for (path, operations) in paths {
        for (method, operation) in operations.as_object().unwrap() {
            let success = operation["responses"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(status, _)| status.starts_with('2'))
                .all(|(status, r)| status == "204" || r["content"].is_object());
            let any = operation["responses"]
                .as_object()
                .unwrap()
                .keys()
                // A tunnel's answer is a switch of protocols.
                .any(|s| s.starts_with('2') || s == "101");
            assert!(success && any, "{method} {path}: no schema for its answer");
            if method != "get" && operation.get("requestBody").is_none() {
                // Bodiless by design: the path and the token say it all.
                assert!(
                    path.ends_with("/revoke")
                        || path.ends_with("/finish")
                        || path.ends_with("/cancel")
                        || path.ends_with("/next")
                        || path.ends_with("/heartbeat")
                        || path.ends_with("/release")
                        || path.ends_with("/redrive")
                        || method == "delete"
                        || path.ends_with("/drain")
                        || path.ends_with("/claim")
                        || path.ends_with("/tool")
                        || path.contains("/ingress/")
                        || path == "/v1/agent-tokens",
                    "{method} {path}: no request schema"
                );
            }
        }
    }
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    if std::env::var_os("MOAT_BLESS").is_some() {
        std::fs::write(file, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
    }
    let checked_in: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(
        checked_in, doc,
        "docs/openapi.json is stale: MOAT_BLESS=1 cargo test -p moat-control --test server"
    );
}

#[test]
fn agents_and_runners_stay_in_their_lane() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let runner = registered(&plane, &acme, 5);
        let (s, b) = post(&plane, &acme, "/v1/agent-tokens", json!({}));
        assert_eq!(s, 201, "{b}");
        let agent = Org {
            token: b["token"].as_str().unwrap().to_owned(),
        };
        // An agent token drives runs, not the org's trust.
        for (path, body) in [
            ("/v1/runner-builds", json!({"sha256": HASH})),
            ("/v1/bootstrap-tokens", json!({})),
            ("/v1/agent-tokens", json!({})),
            ("/v1/signing-keys/revoke", json!({"publicKey": "x"})),
        ] {
            let (s, b) = post(&plane, &agent, path, body);
            assert_eq!(
                (s, b["error"]["reason"].as_str()),
                (403, Some("admin_token_required")),
                "{path}: {b}"
            );
        }
        // Ids name directories and URL segments on runners: plain ones only.
        for bad in ["..", ".", "-x", "a/b", "a b"] {
            assert_eq!(
                post(&plane, &agent, "/v1/runs", json!({"id": bad})).0,
                400,
                "run id {bad:?}"
            );
        }
        assert_eq!(post(&plane, &agent, "/v1/runs", json!({"id": "r"})).0, 201);
        let op = json!({"id": "../x", "op": "artifact_read", "args": {"path": "a", "maxBytes": 1}});
        assert_eq!(post(&plane, &agent, "/v1/runs/r/ops", op).0, 400);
        let op = json!({"id": "o1", "op": "artifact_read", "args": {"path": "a", "maxBytes": 1}});
        assert_eq!(post(&plane, &agent, "/v1/runs/r/ops", op).0, 201);

        // A runner reports what its shell records about the op, nothing else.
        assert_eq!(runner_call(&plane, &runner, "/v1/runner/claim").0, 200);
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/runs/r/next");
        assert_eq!((s, b["action"].as_str()), (200, Some("op")), "{b}");
        let result = |kind: &str| {
            json!({
                "result": {"id": "o1", "status": "ok"},
                "events": [{"type": kind, "at": "2030-01-01T00:00:00Z", "runId": "other", "data": {}}],
            })
            .to_string()
        };
        let path = "/v1/runner/runs/r/ops/o1/result";
        let send = |body: String| {
            let headers =
                signed_headers(&runner, "POST", path, body.as_bytes(), plane.clock.now_ms());
            call(
                "POST",
                &format!("{}{path}", plane.url),
                &headers,
                body.as_bytes(),
            )
        };
        for forged in [
            "run.finished",
            "approval.granted",
            "manifest.published",
            "runner.registered",
        ] {
            let (s, b) = send(result(forged));
            assert_eq!(s, 400, "{forged} accepted: {b}");
        }
        // Nor anything but its type's shape: no free-form data reaches the
        // org's chain, and a refused report leaves no trace of itself.
        let before = plane.store.all_events(0, 100_000).unwrap().len();
        let shaped = |kind: &str, data: Value| {
            json!({
                "result": {"id": "o1", "status": "ok"},
                "events": [{"type": kind, "at": "2030-01-01T00:00:00Z", "runId": "r", "data": data}],
            })
            .to_string()
        };
        for (kind, data) in [
            ("capability.granted", json!("a string")),
            (
                "capability.granted",
                json!({"op": "artifact_read", "note": "free text"}),
            ),
            ("sandbox.exec.started", json!({"program": "/bin/sh"})),
            (
                "network.request",
                json!({"host": "x", "port": 443, "method": "GET", "decision": "allow"}),
            ),
            (
                "path.denied",
                json!({"reason": "no_such_reason", "message": "m"}),
            ),
        ] {
            let (s, b) = send(shaped(kind, data.clone()));
            assert_eq!(
                (s, b["error"]["reason"].as_str()),
                (400, Some("bad_request")),
                "{kind} {data} accepted: {b}"
            );
            assert!(
                b["error"]["message"].as_str().unwrap().contains(kind),
                "{b}"
            );
        }
        let provenance = json!({"events": [{"type": "runner.started", "at": "2030-01-01T00:00:00Z",
            "runId": "", "data": {"bootTime": "t", "version": "v", "sandboxMode": "root"}}]})
        .to_string();
        let headers = signed_headers(
            &runner,
            "POST",
            "/v1/runner/events",
            provenance.as_bytes(),
            plane.clock.now_ms(),
        );
        let (s, b) = call(
            "POST",
            &format!("{}/v1/runner/events", plane.url),
            &headers,
            provenance.as_bytes(),
        );
        assert_eq!(s, 400, "{b}");
        assert_eq!(
            plane.store.all_events(0, 100_000).unwrap().len(),
            before,
            "a refused report was recorded"
        );
        let (s, b) = send(result("capability.granted"));
        assert_eq!((s, b["recorded"].as_bool()), (200, Some(true)), "{b}");
        let events = plane.store.all_events(0, 100_000).unwrap();
        let reported = events
            .iter()
            .find(|e| {
                e.event.data["runnerId"] == json!(runner.id)
                    && e.event.event_type == EventType::CapabilityGranted
            })
            .expect("the reported event");
        assert_eq!(
            reported.event.run_id, "r",
            "a runner wrote into another run"
        );
    }
}

#[test]
fn revoking_a_manifest_or_its_signing_key_stops_its_runners_at_once() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let runner = registered(&plane, &acme, 6);
        assert_eq!(runner_call(&plane, &runner, "/v1/runner/claim").0, 204);
        let key = plane.key.public().to_base64();
        assert_eq!(
            post(
                &plane,
                &acme,
                "/v1/signing-keys/revoke",
                json!({"publicKey": key})
            )
            .0,
            200
        );
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/claim");
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("revoked")),
            "{b}"
        );

        let other = org(&plane, "other");
        let runner = registered(&plane, &other, 7);
        assert_eq!(runner_call(&plane, &runner, "/v1/runner/claim").0, 204);
        let hash = manifest_with(&plane, |_| {}, &plane.key).manifest_hash;
        assert_eq!(
            post(
                &plane,
                &other,
                &format!("/v1/manifests/{hash}/revoke"),
                json!({})
            )
            .0,
            200
        );
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/claim");
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("revoked")),
            "{b}"
        );
        assert_eq!(rejections(&plane), ["revoked", "revoked"]);
    }
}

#[test]
fn a_run_pinned_to_a_manifest_goes_only_to_its_runners() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let runner = registered(&plane, &acme, 8);
        let older = manifest_with(
            &plane,
            |m| m["createdAt"] = json!(moat_store::stamp(T0 - 1000)),
            &plane.key,
        );
        assert_eq!(
            post(
                &plane,
                &acme,
                "/v1/manifests",
                serde_json::to_value(&older).unwrap()
            )
            .0,
            201
        );
        let current = manifest_with(&plane, |_| {}, &plane.key);
        assert_eq!(
            post(
                &plane,
                &acme,
                "/v1/runs",
                json!({"id": "x", "manifestHash": HASH})
            )
            .0,
            400
        );
        let (s, b) = post(
            &plane,
            &acme,
            "/v1/runs",
            json!({"id": "old", "manifestHash": older.manifest_hash}),
        );
        assert_eq!(s, 201, "{b}");
        assert_eq!(
            runner_call(&plane, &runner, "/v1/runner/claim").0,
            204,
            "claimed under another manifest"
        );
        let (s, b) = post(
            &plane,
            &acme,
            "/v1/runs",
            json!({"id": "mine", "manifestHash": current.manifest_hash}),
        );
        assert_eq!(s, 201, "{b}");
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/claim");
        assert_eq!((s, b["run"]["id"].as_str()), (200, Some("mine")), "{b}");
        assert_eq!(b["run"]["manifestHash"], json!(current.manifest_hash));
    }
}

fn events_of(plane: &Plane, kind: EventType) -> Vec<moat_core::Event> {
    plane
        .store
        .all_events(0, 100_000)
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .filter(|e| e.event_type == kind)
        .collect()
}

#[test]
fn approvals_pause_an_operation_until_an_admin_decides_or_it_expires() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let globex = org(&plane, "globex");
        let runner = registered(&plane, &acme, 7);
        let (_, b) = post(&plane, &acme, "/v1/agent-tokens", json!({}));
        let agent = Org {
            token: b["token"].as_str().unwrap().to_owned(),
        };
        assert_eq!(post(&plane, &agent, "/v1/runs", json!({"id": "r"})).0, 201);
        assert_eq!(runner_call(&plane, &runner, "/v1/runner/claim").0, 200);
        let read = |id: &str, path: &str| json!({"id": id, "op": "artifact_read", "args": {"path": path, "maxBytes": 10}});

        // The rule asks for a person: the op waits, the runner gets nothing.
        let (s, b) = post(&plane, &agent, "/v1/runs/r/ops", read("o1", "sensitive/a"));
        assert_eq!(
            (s, b["state"].as_str()),
            (202, Some("pending_approval")),
            "{b}"
        );
        let approval = b["approval"]["id"].as_str().unwrap().to_owned();
        assert_eq!(
            runner_call(&plane, &runner, "/v1/runner/runs/r/next").0,
            204
        );
        let (s, b) = call(
            "GET",
            &format!("{}/v1/approvals", plane.url),
            &bearer(&agent.token),
            b"",
        );
        assert_eq!(s, 200, "{b}");
        let listed = &b["approvals"][0];
        assert_eq!(
            (
                listed["id"].as_str(),
                listed["rule"].as_str(),
                listed["risk"].as_str()
            ),
            (Some(approval.as_str()), Some("sensitive"), Some("high"))
        );
        assert_eq!(
            listed["summary"]["resource"],
            json!("Moat::Path::\"sensitive/a\"")
        );

        // Not the agent, not another org: only the org's admin decides.
        let approve = format!("/v1/approvals/{approval}/approve");
        let (s, b) = post(&plane, &agent, &approve, json!({}));
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("admin_token_required"))
        );
        assert_eq!(post(&plane, &globex, &approve, json!({})).0, 404);
        assert!(events_of(&plane, EventType::ApprovalGranted).is_empty());

        let (s, b) = post(&plane, &acme, &approve, json!({"reason": "ticket 7"}));
        assert_eq!((s, b["state"].as_str()), (200, Some("approved")), "{b}");
        assert!(b["resolvedBy"].as_str().unwrap().starts_with("token:"));
        let (s, b) = post(&plane, &acme, &approve, json!({}));
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (409, Some("approval_settled"))
        );
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/runs/r/next");
        assert_eq!((s, b["envelope"]["id"].as_str()), (200, Some("o1")), "{b}");
        assert!(b["envelope"]["capability"].is_string());
        // Answered, as a runner does before it asks for more (an op still
        // dispatched when its holder asks again is handed over again).
        let answer = json!({"result": {"id": "o1", "status": "ok"}, "events": []}).to_string();
        let (s, b) = runner_post(
            &plane,
            &runner,
            "/v1/runner/runs/r/ops/o1/result",
            answer.as_bytes(),
        );
        assert_eq!(s, 200, "{b}");
        let granted = events_of(&plane, EventType::ApprovalGranted);
        assert_eq!(granted.len(), 1);
        assert_eq!(granted[0].op_id.as_deref(), Some("o1"));
        assert_eq!(granted[0].data["reason"], json!("ticket 7"));
        assert!(
            granted[0].data["by"]
                .as_str()
                .unwrap()
                .starts_with("token:")
        );
        assert_eq!(events_of(&plane, EventType::ApprovalRequested).len(), 1);

        // Denied: the op is refused with the approver's reason.
        let (_, b) = post(&plane, &agent, "/v1/runs/r/ops", read("o2", "sensitive/b"));
        let deny = format!(
            "/v1/approvals/{}/deny",
            b["approval"]["id"].as_str().unwrap()
        );
        assert_eq!(
            post(&plane, &acme, &deny, json!({})).0,
            400,
            "a denial needs a reason"
        );
        let (s, b) = post(&plane, &acme, &deny, json!({"reason": "not this data"}));
        assert_eq!((s, b["state"].as_str()), (200, Some("denied")), "{b}");
        let (_, op) = call(
            "GET",
            &format!("{}/v1/runs/r/ops/o2", plane.url),
            &bearer(&agent.token),
            b"",
        );
        assert_eq!(
            (op["state"].as_str(), op["result"]["reason"].as_str()),
            (Some("denied"), Some("approval_denied")),
            "{op}"
        );
        assert!(
            events_of(&plane, EventType::CapabilityDenied)
                .iter()
                .any(|e| e.op_id.as_deref() == Some("o2")
                    && e.data["reason"] == json!("approval_denied"))
        );

        // Nobody answers: the sweep expires it and the op fails closed.
        let (_, b) = post(&plane, &agent, "/v1/runs/r/ops", read("o3", "sensitive/c"));
        let late = b["approval"]["id"].as_str().unwrap().to_owned();
        let (_, b) = post(&plane, &agent, "/v1/runs/r/ops", read("o4", "sensitive/d"));
        let later = b["approval"]["id"].as_str().unwrap().to_owned();
        plane.clock.advance(Duration::from_secs(601));
        // Approving after the deadline expires it instead.
        let (s, b) = post(
            &plane,
            &acme,
            &format!("/v1/approvals/{later}/approve"),
            json!({}),
        );
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (409, Some("approval_expired")),
            "{b}"
        );
        assert!(server::sweep_once(&plane.store, plane.clock.now_ms(), i64::MAX).unwrap() >= 1);
        for (op, id) in [("o3", &late), ("o4", &later)] {
            let (_, o) = call(
                "GET",
                &format!("{}/v1/runs/r/ops/{op}", plane.url),
                &bearer(&agent.token),
                b"",
            );
            assert_eq!(
                (o["state"].as_str(), o["result"]["reason"].as_str()),
                (Some("denied"), Some("approval_expired")),
                "{o}"
            );
            let (_, a) = call(
                "GET",
                &format!("{}/v1/approvals/{id}", plane.url),
                &bearer(&agent.token),
                b"",
            );
            assert_eq!(a["state"], json!("expired"));
        }
        assert_eq!(events_of(&plane, EventType::ApprovalExpired).len(), 2);
        assert_eq!(
            runner_call(&plane, &runner, "/v1/runner/runs/r/next").0,
            204,
            "nothing leaks to the runner"
        );
        let (_, v) = call(
            "GET",
            &format!("{}/v1/ledger/verify", plane.url),
            &bearer(ADMIN),
            b"",
        );
        assert_eq!(v["ok"], json!(true), "{v}");
    }
}

/// An operation marked dispatched that the control plane cannot hand over
/// (here: its record names a workload class this build does not know, as a
/// newer replica might write) fails at once, saying why, instead of being
/// handed over again at every ask until the run expires; the next one
/// comes after it.
#[test]
fn an_operation_that_cannot_be_handed_over_fails_and_the_next_one_follows() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let runner = registered(&plane, &acme, 7);
        assert_eq!(post(&plane, &acme, "/v1/runs", json!({"id": "r"})).0, 201);
        let org_id = plane.store.org_id("acme").unwrap().unwrap();
        let envelope = json!({"id": "o1", "runId": "r", "correlationId": "o1",
            "op": "artifact_read", "args": {"path": "input/a", "maxBytes": 1},
            "createdAt": "2030-01-01T00:00:00Z"});
        plane
            .store
            .insert_op(
                &moat_store::NewOp {
                    org: &org_id,
                    run: "r",
                    id: "o1",
                    op: "artifact_read",
                    state: moat_store::OpState::Queued,
                    envelope: &envelope,
                    decision: &json!({"decision": "allow", "class": "quantum"}),
                    result: None,
                    events: &[],
                    approval: None,
                },
                plane.clock.now_ms(),
            )
            .unwrap();
        let op =
            json!({"id": "o2", "op": "artifact_read", "args": {"path": "input/a", "maxBytes": 1}});
        assert_eq!(post(&plane, &acme, "/v1/runs/r/ops", op).0, 201);
        assert_eq!(runner_call(&plane, &runner, "/v1/runner/claim").0, 200);
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/runs/r/next");
        assert_eq!(s, 500, "{b}");
        let (_, o1) = call(
            "GET",
            &format!("{}/v1/runs/r/ops/o1", plane.url),
            &bearer(&acme.token),
            b"",
        );
        assert_eq!(o1["state"], "failed", "{o1}");
        assert!(
            o1["result"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("could not hand the operation over")),
            "{o1}"
        );
        assert!(
            plane
                .events_named("op.finished")
                .iter()
                .any(|e| e.op_id.as_deref() == Some("o1") && e.data["status"] == "error"),
            "the failure is not on record"
        );
        let (s, b) = runner_call(&plane, &runner, "/v1/runner/runs/r/next");
        assert_eq!((s, b["envelope"]["id"].as_str()), (200, Some("o2")), "{b}");
    }
}
