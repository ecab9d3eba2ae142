#![allow(clippy::expect_used, clippy::unwrap_used)]
//! What the API takes in: every JSON body is an object of its documented
//! shape (serde would build a struct from an array).

mod plane;

use plane::*;
use serde_json::{Value, json};

type Headers = [(&'static str, String)];

/// The bodies that are not objects, at the top.
const NOT_OBJECTS: [&str; 5] = [r#"["arr-1"]"#, r#""arr-1""#, "17", "null", "[]"];

fn assert_refused(status: u16, body: &Value, what: &str) {
    assert_eq!(status, 400, "{what}: {body}");
    assert_eq!(body["error"]["reason"], "bad_request", "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("object"), "{what}: {body}");
}

#[test]
fn every_body_must_be_an_object_of_its_shape() {
    let plane = Plane::sqlite();
    let acme = org(&plane, "acme");
    let runner = registered(&plane, &acme, 3);
    let (s, b) = post(&plane, &acme, "/v1/runs", json!({"id": "r1"}));
    assert_eq!(s, 201, "{b}");
    let admin = bearer(ADMIN);
    let org_token = bearer(&acme.token);
    let routes: [(&str, &str, &Headers); 12] = [
        ("POST", "/v1/orgs", &admin),
        ("POST", "/v1/bootstrap-tokens", &org_token),
        ("POST", "/v1/runner-builds", &org_token),
        ("POST", "/v1/manifests", &org_token),
        ("POST", "/v1/signing-keys/revoke", &org_token),
        ("POST", "/v1/runs", &org_token),
        ("POST", "/v1/runs/r1/ops", &org_token),
        ("POST", "/v1/approvals/apr_x/approve", &org_token),
        ("POST", "/v1/approvals/apr_x/deny", &org_token),
        ("PUT", "/v1/secrets/crm_key", &org_token),
        ("POST", "/v1/tools", &org_token),
        ("POST", "/v1/tool-tokens/call", &org_token),
    ];
    for body in NOT_OBJECTS {
        for (method, path, headers) in &routes {
            let (s, b) = call(
                method,
                &format!("{}{path}", plane.url),
                headers,
                body.as_bytes(),
            );
            assert_refused(s, &b, &format!("{method} {path} {body}"));
        }
        let token = bootstrap_token(&plane, &acme);
        let (s, b) = call(
            "POST",
            &format!("{}/v1/runner/register", plane.url),
            &bearer(&token),
            body.as_bytes(),
        );
        assert_refused(s, &b, &format!("register {body}"));
        for path in [
            "/v1/runner/events",
            "/v1/runner/manifest",
            "/v1/runner/runs/r1/finish",
            "/v1/runner/runs/r1/ops/1/result",
        ] {
            let (s, b) = runner_post(&plane, &runner, path, body.as_bytes());
            assert_refused(s, &b, &format!("{path} {body}"));
        }
    }
    // Nested too: an input given as an array is not an input.
    let (s, b) = post(
        &plane,
        &acme,
        "/v1/runs",
        json!({"id": "arr-2", "inputs": [["a.txt", "hello", null]]}),
    );
    assert_refused(s, &b, "an input as an array");
    let (s, b) = post(
        &plane,
        &acme,
        "/v1/runner-builds",
        json!({"sha256": [HASH, "label"]}),
    );
    assert_eq!(s, 400, "{b}");

    // Nothing was made of any of it.
    let (s, runs) = call("GET", &format!("{}/v1/runs", plane.url), &org_token, b"");
    assert_eq!(s, 200);
    let ids: Vec<&str> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(ids, ["r1"], "{runs}");
    let (_, builds) = call(
        "GET",
        &format!("{}/v1/runner-builds", plane.url),
        &org_token,
        b"",
    );
    assert_eq!(
        builds["runnerBuilds"].as_array().unwrap().len(),
        1,
        "{builds}"
    );
    let (_, secrets) = call("GET", &format!("{}/v1/secrets", plane.url), &org_token, b"");
    assert_eq!(secrets["secrets"], json!([]), "{secrets}");
    // Optional bodies stay optional; an object of the wrong shape is still 400.
    let (s, b) = call(
        "POST",
        &format!("{}/v1/approvals/apr_x/approve", plane.url),
        &org_token,
        b"",
    );
    assert_eq!(s, 404, "{b}");
    let (s, b) = post(&plane, &acme, "/v1/runs", json!({"id": "r2", "extra": 1}));
    assert_eq!(s, 400, "{b}");
}

#[test]
fn operation_arguments_given_as_an_array_are_refused_not_read_field_by_field() {
    let plane = Plane::sqlite();
    let acme = org(&plane, "acme");
    let (s, b) = post(&plane, &acme, "/v1/runs", json!({"id": "r1"}));
    assert_eq!(s, 201, "{b}");
    // serde would read these as {path, content, ...}: a policy rule on
    // `export/*` must never see them as "no path" and let them through.
    let cases = [
        (
            "artifact_write",
            json!(["./export/leak.csv", "data", null, 100]),
        ),
        ("artifact_read", json!(["./sensitive/key", 4096])),
        ("artifact_list", json!(["."])),
        ("exec_argv", json!([["/usr/bin/wc", "-c", "input/a.txt"]])),
    ];
    for (n, (op, args)) in cases.into_iter().enumerate() {
        let id = format!("op{n}");
        let (s, b) = post(
            &plane,
            &acme,
            "/v1/runs/r1/ops",
            json!({"id": id, "op": op, "args": args}),
        );
        assert!(s < 500, "{op}: {s} {b}");
        assert_eq!(b["error"]["reason"], "invalid_args", "{op}: {b}");
        assert_eq!(b["op"]["state"], "denied", "{op}: {b}");
        assert_eq!(b["op"]["result"]["reason"], "invalid_args", "{op}: {b}");
        let (_, events) = call(
            "GET",
            &format!("{}/v1/runs/r1/events", plane.url),
            &bearer(&acme.token),
            b"",
        );
        let denied = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "capability.denied" && e["opId"] == id.as_str());
        assert!(denied, "{op}: no capability.denied for {id}: {events}");
    }
}
