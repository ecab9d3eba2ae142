#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Runner enrolment by workload identity, over both store backends: an org
//! enrols a cluster's service-account issuer once, and runners register
//! with tokens shaped as the kubelet projects them (RS256 with a key made
//! by openssl, ES256 with one made by ring), again and again; every token
//! that should not pass is refused, recorded where it was aimed, and leaves
//! no runner behind; revoking the enrolment stops its runners.

mod plane;

use base64::Engine as _;
use plane::*;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, RsaKeyPair};
use serde_json::{Value, json};

const B64URL: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const SUBJECT: &str = "system:serviceaccount:moat-runner:moat-runner";

enum Signer {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
}

impl Signer {
    /// An RSA key as a cluster's would be: 2048 bits, from openssl.
    fn rsa() -> Signer {
        let dir = tempfile::tempdir().unwrap();
        let (pem, der) = (dir.path().join("sa.pem"), dir.path().join("sa.der"));
        let openssl = |args: &[&str]| {
            let status = std::process::Command::new("openssl")
                .args(args)
                .status()
                .expect("openssl (Debian's openssl, installed with ca-certificates)");
            assert!(status.success(), "openssl {args:?}");
        };
        let (pem, der) = (pem.to_str().unwrap(), der.to_str().unwrap());
        openssl(&[
            "genpkey",
            "-quiet",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            pem,
        ]);
        // ring reads an RSA key pair as PKCS#1 DER.
        openssl(&[
            "rsa",
            "-in",
            pem,
            "-traditional",
            "-outform",
            "DER",
            "-out",
            der,
        ]);
        Signer::Rsa(RsaKeyPair::from_der(&std::fs::read(der).unwrap()).unwrap())
    }

    fn ec() -> Signer {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        Signer::Ec(EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap())
    }

    fn alg(&self) -> &'static str {
        match self {
            Signer::Rsa(_) => "RS256",
            Signer::Ec(_) => "ES256",
        }
    }

    fn jwk(&self, kid: &str) -> Value {
        match self {
            Signer::Rsa(pair) => {
                let public = signature::RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
                json!({"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
                       "n": B64URL.encode(&public.n), "e": B64URL.encode(&public.e)})
            }
            Signer::Ec(pair) => {
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
                       "x": B64URL.encode(&point[1..33]), "y": B64URL.encode(&point[33..])})
            }
        }
    }

    fn token(&self, kid: &str, claims: &Value) -> String {
        let header = json!({"alg": self.alg(), "kid": kid});
        let signed = format!(
            "{}.{}",
            B64URL.encode(header.to_string()),
            B64URL.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let signature = match self {
            Signer::Rsa(pair) => {
                let mut sig = vec![0; pair.public().modulus_len()];
                pair.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signed.as_bytes(),
                    &mut sig,
                )
                .unwrap();
                sig
            }
            Signer::Ec(pair) => pair
                .sign(&rng, signed.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
        };
        format!("{signed}.{}", B64URL.encode(signature))
    }
}

/// Claims as the kubelet projects them for the runner DaemonSet's pod on
/// `node`, for the enrolment's `audience`, issued now for ten minutes.
fn claims(plane: &Plane, audience: &str, node: &str) -> Value {
    let now = plane.clock_now() / 1000;
    json!({
        "aud": [audience], "iss": ISSUER, "sub": SUBJECT,
        "iat": now, "nbf": now, "exp": now + 600,
        "jti": format!("jti-{node}"),
        "kubernetes.io": {
            "namespace": "moat-runner",
            "node": {"name": node, "uid": "node-uid"},
            "pod": {"name": format!("moat-runner-{node}"), "uid": format!("pod-{node}")},
            "serviceaccount": {"name": "moat-runner", "uid": "sa-uid"}
        }
    })
}

trait Now {
    fn clock_now(&self) -> i64;
}

impl Now for Plane {
    fn clock_now(&self) -> i64 {
        use moat_control::clock::Clock as _;
        self.clock.now_ms()
    }
}

fn enrol(plane: &Plane, org: &Org, name: &str, keys: &[(&Signer, &str)]) -> (u16, Value) {
    let jwks: Vec<Value> = keys.iter().map(|(s, kid)| s.jwk(kid)).collect();
    post(
        plane,
        org,
        "/v1/runner-enrolments",
        json!({"name": name, "issuer": ISSUER, "subject": SUBJECT, "jwks": {"keys": jwks}}),
    )
}

/// The org's manifest and build, ready for runners to register under.
fn ready(plane: &Plane, org: &Org) -> moat_core::SignedManifest {
    let current = manifest(plane);
    let (s, b) = post(
        plane,
        org,
        "/v1/manifests",
        serde_json::to_value(&current).unwrap(),
    );
    assert_eq!(s, 201, "{b}");
    let (s, b) = post(plane, org, "/v1/runner-builds", json!({"sha256": HASH}));
    assert_eq!(s, 201, "{b}");
    current
}

fn register_with(
    plane: &Plane,
    token: &str,
    current: &moat_core::SignedManifest,
    seed: u8,
) -> (u16, Value, Runner) {
    let key = moat_core::sign::PrivateKey::from_seed([seed; 32]);
    let (s, b) = call(
        "POST",
        &format!("{}/v1/runner/register", plane.url),
        &bearer(token),
        registration(current, &key, json!(["artifact_read"]))
            .to_string()
            .as_bytes(),
    );
    let id = b["runnerId"].as_str().unwrap_or_default().to_owned();
    (s, b, Runner { key, id })
}

fn runners(plane: &Plane, org: &Org) -> usize {
    let (s, b) = call(
        "GET",
        &format!("{}/v1/runners", plane.url),
        &bearer(&org.token),
        b"",
    );
    assert_eq!(s, 200, "{b}");
    b["runners"].as_array().unwrap().len()
}

fn refusals(plane: &Plane) -> Vec<Value> {
    plane
        .events_named("runner.rejected")
        .into_iter()
        .map(|e| e.data)
        .filter(|d| d["reason"] == "enrolment_refused")
        .collect()
}

fn claim(plane: &Plane, runner: &Runner) -> (u16, Value) {
    runner_post(plane, runner, "/v1/runner/claim", b"")
}

#[test]
fn one_enrolment_registers_every_node_at_every_start_with_rs256_and_es256() {
    let (rsa, ec) = (Signer::rsa(), Signer::ec());
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let current = ready(&plane, &acme);
        let (s, b) = enrol(
            &plane,
            &acme,
            "cluster-a",
            &[(&rsa, "rsa-1"), (&ec, "ec-1")],
        );
        assert_eq!(s, 201, "{b}");
        assert_eq!(b["keyIds"], json!(["rsa-1", "ec-1"]));
        let audience = b["audience"].as_str().unwrap().to_owned();
        assert_eq!(
            audience,
            format!("moat-enrolment:{}", b["id"].as_str().unwrap())
        );
        let enrolment = b["id"].as_str().unwrap().to_owned();

        // Two nodes, each started three times (restarts, a rollout) with
        // the same projected token: every start registers.
        let mut seed = 1;
        for (signer, kid, node) in [(&rsa, "rsa-1", "node-a"), (&ec, "ec-1", "node-b")] {
            let token = signer.token(kid, &claims(&plane, &audience, node));
            for _ in 0..3 {
                let (s, b, runner) = register_with(&plane, &token, &current, seed);
                assert_eq!(s, 201, "{node}: {b}");
                seed += 1;
                // The registration is a runner like any other: its signed
                // requests are served.
                assert_eq!(post(&plane, &acme, "/v1/runs", json!({})).0, 201);
                let (s, b) = claim(&plane, &runner);
                assert_eq!(s, 200, "{b}");
            }
        }
        assert_eq!(runners(&plane, &acme), 6);
        let registered = plane.events_named("runner.registered");
        assert_eq!(registered.len(), 6);
        let identity = &registered[0].data["enrolment"];
        assert_eq!(identity["enrolmentId"], enrolment.as_str());
        assert_eq!(identity["subject"], SUBJECT);
        assert_eq!(identity["node"], "node-a");
        assert_eq!(identity["pod"], "moat-runner-node-a");
        assert_eq!(registered[5].data["enrolment"]["node"], "node-b");
        assert!(refusals(&plane).is_empty());
    }
}

#[test]
fn every_token_that_should_not_pass_is_refused_recorded_and_registers_nothing() {
    let (good, stranger) = (Signer::ec(), Signer::ec());
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let current = ready(&plane, &acme);
        let (s, b) = enrol(&plane, &acme, "cluster-a", &[(&good, "k1")]);
        assert_eq!(s, 201, "{b}");
        let audience = b["audience"].as_str().unwrap().to_owned();
        let now = plane.clock_now() / 1000;
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut c = claims(&plane, &audience, "node-a");
            f(&mut c);
            c
        };
        // For the enrolment (its audience) but wrong: refused, the reason
        // recorded in acme's ledger only.
        let sub = |v: &str| good.token("k1", &edit(&|c| c["sub"] = json!(v)));
        let aimed = [
            (
                "signed by another key",
                stranger.token("k1", &edit(&|_| {})),
            ),
            (
                "expired",
                good.token("k1", &edit(&|c| c["exp"] = json!(now - 120))),
            ),
            (
                "not yet valid",
                good.token("k1", &edit(&|c| c["nbf"] = json!(now + 600))),
            ),
            (
                "no expiry",
                good.token(
                    "k1",
                    &edit(&|c| {
                        c.as_object_mut().unwrap().remove("exp");
                    }),
                ),
            ),
            (
                "a year long",
                good.token("k1", &edit(&|c| c["exp"] = json!(now + 365 * 86_400))),
            ),
            ("unknown key id", good.token("k9", &edit(&|_| {}))),
            (
                "another service account",
                sub("system:serviceaccount:default:default"),
            ),
            (
                "another issuer",
                good.token("k1", &edit(&|c| c["iss"] = json!("https://other.example"))),
            ),
            (
                "times past 9999",
                good.token("k1", &edit(&|c| c["exp"] = json!(i64::MAX))),
            ),
            (
                "an issue time before 1970",
                good.token(
                    "k1",
                    &edit(&|c| c["iat"] = json!(-9_300_000_000_000_000_i64)),
                ),
            ),
        ];
        for (n, (what, token)) in aimed.iter().enumerate() {
            let (s, b, _) = register_with(&plane, token, &current, 40);
            assert_eq!(
                (s, b["error"]["reason"].as_str()),
                (403, Some("enrolment_refused")),
                "{what}: {b}"
            );
            assert_eq!(refusals(&plane).len(), n + 1, "{what} is recorded");
            assert!(
                !b.to_string().contains("cluster-a"),
                "the caller learns nothing of the enrolment: {b}"
            );
        }
        let recorded = refusals(&plane);
        assert!(
            recorded[0]["message"]
                .as_str()
                .unwrap()
                .contains("signature"),
            "{}",
            recorded[0]
        );
        assert_eq!(recorded[0]["runnerHash"], HASH);
        // For no enrolment (the API server's own audience, an enrolment
        // that does not exist, none at all): refused, with no org to record
        // it in.
        let stray = [
            good.token(
                "k1",
                &edit(&|c| c["aud"] = json!(["https://kubernetes.default.svc"])),
            ),
            good.token(
                "k1",
                &edit(&|c| c["aud"] = json!("moat-enrolment:enrol_0000")),
            ),
            "eyJhbGciOiJub25lIn0.e30.".to_owned(),
        ];
        for token in &stray {
            let (s, b, _) = register_with(&plane, token, &current, 41);
            assert_eq!(s, 401, "{b}");
        }
        assert_eq!(refusals(&plane).len(), aimed.len());
        assert_eq!(runners(&plane, &acme), 0, "no refused token left a runner");
        assert!(plane.events_named("runner.registered").is_empty());
    }
}

#[test]
fn a_revoked_enrolment_stops_its_runners_and_registers_no_more() {
    let key = Signer::ec();
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let current = ready(&plane, &acme);
        let (_, b) = enrol(&plane, &acme, "cluster-a", &[(&key, "k1")]);
        let id = b["id"].as_str().unwrap().to_owned();
        let token = key.token(
            "k1",
            &claims(&plane, b["audience"].as_str().unwrap(), "node-a"),
        );
        let (s, _, runner) = register_with(&plane, &token, &current, 50);
        assert_eq!(s, 201);
        // A runner registered with a bootstrap token is not touched.
        let other = registered(&plane, &acme, 51);

        // A claim already waiting when the enrolment is revoked takes
        // nothing afterwards: the run queued after it stays for others.
        let waited = std::thread::scope(|scope| {
            let waiting =
                scope.spawn(|| runner_post(&plane, &runner, "/v1/runner/claim?wait_ms=3000", b""));
            std::thread::sleep(std::time::Duration::from_millis(500));
            let (s, b) = post(
                &plane,
                &acme,
                &format!("/v1/runner-enrolments/{id}/revoke"),
                json!({}),
            );
            assert_eq!(s, 200, "{b}");
            assert!(b["revokedAt"].is_string());
            assert_eq!(
                post(&plane, &acme, "/v1/runs", json!({"id": "after"})).0,
                201
            );
            waiting.join().unwrap()
        });
        assert_eq!(waited.0, 204, "the waiting claim took a run: {}", waited.1);
        let (s, b) = claim(&plane, &runner);
        assert_eq!(
            (s, b["error"]["reason"].as_str()),
            (403, Some("enrolment_refused")),
            "{b}"
        );
        let (s, b) = claim(&plane, &other);
        assert_eq!(s, 200, "{b}");
        let (s, b, _) = register_with(&plane, &token, &current, 52);
        assert_eq!(s, 401, "a revoked enrolment registers nothing: {b}");
        let recorded = refusals(&plane);
        assert_eq!(recorded.len(), 1, "{recorded:?}");
        assert_eq!(recorded[0]["runnerId"], runner.id.as_str());
        // Unknown ids, and another org's, are not found.
        let beta = org(&plane, "beta");
        assert_eq!(
            post(
                &plane,
                &beta,
                &format!("/v1/runner-enrolments/{id}/revoke"),
                json!({})
            )
            .0,
            404
        );
        // A new enrolment of the same cluster has an audience of its own:
        // the old token does not register through it.
        assert_eq!(enrol(&plane, &acme, "cluster-a-2", &[(&key, "k1")]).0, 201);
        assert_eq!(register_with(&plane, &token, &current, 53).0, 401);
    }
}

#[test]
fn enrolments_are_checked_when_made_and_each_token_leads_to_its_own_org() {
    let key = Signer::ec();
    for plane in Plane::both() {
        let acme = org(&plane, "acme");
        let beta = org(&plane, "beta");
        let current = ready(&plane, &acme);
        let (s, mine) = enrol(&plane, &acme, "cluster-a", &[(&key, "k1")]);
        assert_eq!(s, 201, "{mine}");
        assert_eq!(
            enrol(&plane, &acme, "cluster-a", &[(&key, "k2")]).0,
            409,
            "a name once per org"
        );
        // Another org enrolling the very same cluster (issuer, subject and
        // keys copied) gets an audience of its own: acme's runners' tokens
        // still lead to acme, and beta's ledger learns nothing of them.
        let (s, theirs) = enrol(&plane, &beta, "copied", &[(&key, "k1")]);
        assert_eq!(s, 201, "{theirs}");
        assert_ne!(mine["audience"], theirs["audience"]);
        let token = key.token(
            "k1",
            &claims(&plane, mine["audience"].as_str().unwrap(), "node-a"),
        );
        let (s, b, _) = register_with(&plane, &token, &current, 60);
        assert_eq!(s, 201, "{b}");
        assert_eq!(runners(&plane, &acme), 1);
        assert_eq!(runners(&plane, &beta), 0);
        assert_eq!(
            plane.events_named("runner.registered")[0].data["enrolment"]["enrolmentId"],
            mine["id"]
        );
        // Rotation: a second enrolment of the same cluster stands beside the first.
        assert_eq!(
            enrol(&plane, &acme, "cluster-a-rotated", &[(&key, "k2")]).0,
            201
        );

        let bad = |body: Value| post(&plane, &beta, "/v1/runner-enrolments", body).0;
        let base = json!({"name": "x", "issuer": ISSUER, "subject": SUBJECT,
                          "jwks": {"keys": [key.jwk("k1")]}});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        assert_eq!(bad(with("jwks", json!({"keys": []}))), 400);
        assert_eq!(
            bad(with(
                "jwks",
                json!({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]})
            )),
            400
        );
        assert_eq!(
            bad(with(
                "jwks",
                json!({"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]})
            )),
            400
        );
        assert_eq!(bad(with("name", json!("a/b"))), 400);
        assert_eq!(bad(with("issuer", json!(""))), 400);
        assert_eq!(
            bad(with("audience", json!("mine"))),
            400,
            "the control plane makes the audience"
        );
        // An agent's token may not enrol.
        let (_, t) = post(&plane, &beta, "/v1/agent-tokens", json!({}));
        let agent = Org {
            token: t["token"].as_str().unwrap().to_owned(),
        };
        assert_eq!(
            post(&plane, &agent, "/v1/runner-enrolments", base.clone()).0,
            403
        );
        assert_eq!(post(&plane, &beta, "/v1/runner-enrolments", base).0, 201);
        let (s, b) = call(
            "GET",
            &format!("{}/v1/runner-enrolments", plane.url),
            &bearer(&beta.token),
            b"",
        );
        assert_eq!(s, 200);
        assert_eq!(b["runnerEnrolments"].as_array().unwrap().len(), 2, "{b}");
    }
}
