#![allow(clippy::expect_used, clippy::unwrap_used)]
//! A run's inputs never carry one of the org's secrets into the database
//! or a runner: refused, recorded, stored nowhere.

mod plane;

use base64::Engine as _;
use plane::*;
use serde_json::json;

/// The forms a secret is looked for in (as op arguments are scrubbed).
fn forms(secret: &str) -> Vec<Vec<u8>> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
    vec![
        secret.as_bytes().to_vec(),
        moat_core::url::encode_component(secret).into_bytes(),
        b64.trim_end_matches('=').as_bytes().to_vec(),
    ]
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn run_inputs_carrying_a_secret_are_refused_and_the_secret_is_stored_nowhere() {
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let name = moat_core::random::new_id("canary_")[..24].to_owned();
        // A value that percent-encodes differently, so each form is its own.
        let secret = format!("sk/live {}", &moat_core::random::new_id("")[..20]);
        let (s, b) = call(
            "PUT",
            &format!("{}/v1/secrets/{name}", plane.url),
            &bearer(&acme.token),
            json!({"value": secret}).to_string().as_bytes(),
        );
        assert_eq!(s, 201, "{b}");
        let b64 = |data: &[u8]| base64::engine::general_purpose::STANDARD.encode(data);
        let [plain, encoded, based] = <[Vec<u8>; 3]>::try_from(forms(&secret)).unwrap();
        let text = |data: &[u8]| String::from_utf8(data.to_vec()).unwrap();
        let attempts = [
            json!({"path": "input/key.txt", "content": secret}),
            json!({"path": "input/cfg.txt", "content": format!("token = {secret}\n")}),
            json!({"path": "input/url.txt", "content": format!("https://x.example/?k={}", text(&encoded))}),
            json!({"path": "input/hdr.txt", "content": format!("Authorization: Basic {}", text(&based))}),
            json!({"path": "input/raw.bin", "contentBase64": b64(&plain)}),
            json!({"path": "input/wrapped.bin", "contentBase64": b64(format!("\0\x01{secret}\x02").as_bytes())}),
            json!({"path": format!("input/{}", text(&encoded)), "content": "x"}),
        ];
        for (i, input) in attempts.iter().enumerate() {
            let run = json!({"id": format!("leak-{i}"), "inputs": [
                {"path": "input/ok.txt", "content": "fine"}, input,
            ]});
            let (s, b) = post(&plane, &acme, "/v1/runs", run);
            assert_eq!(s, 422, "attempt {i}: {b}");
            assert_eq!(b["error"]["reason"], "secret_in_input", "attempt {i}: {b}");
            let message = b["error"]["message"].as_str().unwrap();
            assert!(message.contains(&name), "attempt {i}: {b}");
            for form in forms(&secret) {
                assert!(
                    !contains(b.to_string().as_bytes(), &form),
                    "attempt {i}: {b}"
                );
            }
        }
        // A clean run still goes in.
        let (s, b) = post(
            &plane,
            &acme,
            "/v1/runs",
            json!({"id": "clean", "inputs": [{"path": "input/ok.txt", "content": "fine"}]}),
        );
        assert_eq!(s, 201, "{b}");

        // Each refusal is on the record, naming the secret, never its value.
        let refused = plane.events_named("request.refused");
        assert_eq!(refused.len(), attempts.len(), "{refused:?}");
        for e in &refused {
            assert_eq!(e.data["reason"], "secret_in_input", "{e:?}");
            assert_eq!(e.data["secret"], name.as_str(), "{e:?}");
        }
        let (_, runs) = call(
            "GET",
            &format!("{}/v1/runs", plane.url),
            &bearer(&acme.token),
            b"",
        );
        assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");
        let stored = plane.database_bytes();
        for form in forms(&secret) {
            assert!(
                !contains(&stored, &form),
                "{} holds a form of the secret",
                plane.store.backend()
            );
        }
    }
}
