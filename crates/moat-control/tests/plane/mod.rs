//! An in-process control plane on a real socket, over SQLite or
//! PostgreSQL, with a manual clock and a secrets key: what the API tests
//! (`server.rs`, `api_bodies.rs`, `inspector_guard.rs`, `run_inputs.rs`)
//! share.
#![allow(dead_code)]

mod contract;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use moat_control::PolicyEngine;
use moat_control::clock::{Clock, ManualClock};
use moat_control::server::{self, AppState, Config};
use moat_core::sign::PrivateKey;
use moat_core::{Manifest, SignedManifest, request_sig};
use moat_store::{Store, TempPostgres};
use serde_json::{Value, json};

pub const POLICY: &str = r#"
permit(principal, action == Moat::Action::"artifact_read", resource);
@id("sensitive") @approval("required") @risk("high")
permit(principal, action == Moat::Action::"artifact_read", resource)
when { context.path like "sensitive/*" };
"#;
pub const ADMIN: &str = "admin-token-0123456789abcdef";
pub const T0: i64 = 1_900_000_000_000;
pub const DAY: i64 = 86_400_000;
pub const HASH: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

// Fields drop in order: the runtime (and the server's hold on the store)
// before the store itself, which PostgreSQL's client drops by blocking.
pub struct Plane {
    pub url: String,
    pub clock: ManualClock,
    _rt: tokio::runtime::Runtime,
    pub store: Arc<Store>,
    pub key: PrivateKey,
    pub pg: Option<TempPostgres>,
    pub dir: tempfile::TempDir,
    /// Where promoted files are kept.
    pub outputs: moat_store::Outputs,
    /// The hash of the policy it decides by (manifests name it).
    pub policy_hash: String,
}

impl Plane {
    /// Over SQLite, promoted files in the directory `moat serve` would
    /// choose (`c.db-outputs` beside the database).
    pub fn sqlite() -> Plane {
        Plane::sqlite_with(POLICY, |dir| {
            moat_store::Outputs::directory(&dir.join("c.db-outputs")).unwrap()
        })
    }

    /// Over SQLite, with this policy and output store (made in the
    /// plane's directory).
    pub fn sqlite_with(
        policy: &str,
        outputs: impl FnOnce(&std::path::Path) -> moat_store::Outputs,
    ) -> Plane {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite:{}", dir.path().join("c.db").display())).unwrap();
        let outputs = outputs(dir.path());
        start(store, None, dir, policy, outputs)
    }

    /// Over PostgreSQL, promoted files in the database (`moat serve`'s
    /// default there).
    pub fn postgres() -> Plane {
        let pg = TempPostgres::create().expect("PostgreSQL (see .ci/run)");
        let store = Store::open(&pg.url).unwrap();
        let outputs = moat_store::Outputs::database();
        start(
            store,
            Some(pg),
            tempfile::tempdir().unwrap(),
            POLICY,
            outputs,
        )
    }

    /// Both backends, SQLite first.
    pub fn both() -> Vec<Plane> {
        vec![Plane::sqlite(), Plane::postgres()]
    }

    /// Every byte the database holds: the SQLite file with its WAL and
    /// shared memory, or a `pg_dump` of the PostgreSQL database.
    pub fn database_bytes(&self) -> Vec<u8> {
        match &self.pg {
            None => {
                let mut all = Vec::new();
                for entry in std::fs::read_dir(self.dir.path()).unwrap() {
                    let path = entry.unwrap().path();
                    // The output store's directory is not the database.
                    if path.is_file() {
                        all.extend(std::fs::read(path).unwrap());
                    }
                }
                assert!(all.len() > 4096, "an empty database proves nothing");
                all
            }
            Some(pg) => {
                let dump = std::process::Command::new("pg_dump")
                    .arg(&pg.url)
                    .output()
                    .expect("pg_dump (Debian's postgresql-client)");
                assert!(
                    dump.status.success(),
                    "{}",
                    String::from_utf8_lossy(&dump.stderr)
                );
                assert!(dump.stdout.len() > 1000, "an empty dump proves nothing");
                dump.stdout
            }
        }
    }

    /// Every recorded event of `kind` (by name: it may not exist yet).
    pub fn events_named(&self, kind: &str) -> Vec<moat_core::Event> {
        self.store
            .all_events(0, 100_000)
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .filter(|e| e.event_type.as_str() == kind)
            .collect()
    }
}

fn start(
    store: Store,
    pg: Option<TempPostgres>,
    dir: tempfile::TempDir,
    policy: &str,
    outputs: moat_store::Outputs,
) -> Plane {
    let clock = ManualClock::new(T0);
    let key = PrivateKey::from_seed([9; 32]);
    let store = Arc::new(store);
    let secrets_key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let engine = PolicyEngine::new(policy).unwrap();
    let policy_hash = engine.hash().to_owned();
    let state = AppState::new(Config {
        store: Arc::clone(&store),
        key: PrivateKey::from_seed([9; 32]),
        policy: engine,
        admin_token_hash: moat_core::hash::sha256_hex(ADMIN.as_bytes()),
        environment: "prod".into(),
        clock: Arc::new(clock.clone()),
        lease: Duration::from_secs(3600),
        capability_ttl: Duration::from_secs(30),
        approval_ttl: Duration::from_secs(600),
        vault: Some(moat_control::vault::Vault::from_base64(&secrets_key).unwrap()),
        tools_allow_private: false,
        run_idle_timeout: Duration::from_secs(900),
        outputs: outputs.clone(),
        host_minimum: Default::default(),
        advertise_url: None,
        placement: moat_control::placement::PlacementEngine::new(
            moat_control::placement::DEFAULT_PLACEMENT,
        )
        .expect("placement"),
        max_attempts: 1,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, server::router(state)).await });
    Plane {
        url,
        clock,
        store,
        key,
        _rt: rt,
        pg,
        dir,
        outputs,
        policy_hash,
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into()
}

/// Status, headers and body of one request (`body` with `None`: no body).
pub fn raw(
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    body: Option<&[u8]>,
) -> (u16, ureq::http::HeaderMap, Vec<u8>) {
    let mut request = ureq::http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, v);
    }
    let mut response = match body {
        Some(body) => agent().run(request.body(body.to_vec()).unwrap()),
        None => agent().run(request.body(()).unwrap()),
    }
    .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.body_mut().read_to_vec().unwrap_or_default();
    (status, headers, bytes)
}

/// Status and headers of a GET whose body does not end (an event stream).
pub fn head_of(url: &str, headers: &[(&str, String)]) -> (u16, ureq::http::HeaderMap) {
    let mut request = agent().get(url);
    for (k, v) in headers {
        request = request.header(*k, v);
    }
    let response = request.call().unwrap();
    (response.status().as_u16(), response.headers().clone())
}

pub fn call(method: &str, url: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
    let mut all = headers.to_vec();
    all.push(("content-type", "application/json".to_owned()));
    let (status, _, bytes) = raw(method, url, &all, Some(body));
    let answer = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    contract::exchange(method, url, body, status, &answer);
    (status, answer)
}

pub fn bearer(token: &str) -> Vec<(&'static str, String)> {
    vec![("authorization", format!("Bearer {token}"))]
}

pub struct Org {
    pub token: String,
}

pub fn org(plane: &Plane, name: &str) -> Org {
    let (s, b) = call(
        "POST",
        &format!("{}/v1/orgs", plane.url),
        &bearer(ADMIN),
        json!({"name": name}).to_string().as_bytes(),
    );
    assert_eq!(s, 201, "{b}");
    Org {
        token: b["token"].as_str().unwrap().to_owned(),
    }
}

pub fn post(plane: &Plane, org: &Org, path: &str, body: Value) -> (u16, Value) {
    call(
        "POST",
        &format!("{}{path}", plane.url),
        &bearer(&org.token),
        body.to_string().as_bytes(),
    )
}

pub fn manifest(plane: &Plane) -> SignedManifest {
    manifest_with(plane, |_| {}, &plane.key)
}

/// A manifest for this plane, edited by `edit`, signed with `key`.
pub fn manifest_with(
    plane: &Plane,
    edit: impl FnOnce(&mut Value),
    key: &PrivateKey,
) -> SignedManifest {
    let stamp = moat_store::stamp;
    let mut m = json!({
        "runnerVersion": "1.0.0", "environment": "prod",
        "policyHash": plane.policy_hash,
        "allowedOps": ["artifact_read"], "allowedExecutables": [], "sandboxModes": ["workspace-write"],
        "networkPolicy": {"mode": "off", "allowDomains": []},
        "filesystem": {"readRoots": ["."], "writeRoots": ["output"]},
        "limits": {"timeoutMs": 60000, "memoryBytes": 1, "pids": 1, "maxOutputBytes": 1, "tmpSizeBytes": 1,
                   "openFiles": 1, "fileSizeBytes": 1},
        "createdAt": stamp(T0), "expiresAt": stamp(T0 + 10 * DAY),
        "controlPlanePublicKey": plane.key.public().to_base64(),
    });
    edit(&mut m);
    let m: Manifest = serde_json::from_value(m).unwrap();
    m.sign(key).unwrap()
}

/// A runner identity: its per-boot key and, once registered, its id.
pub struct Runner {
    pub key: PrivateKey,
    pub id: String,
}

pub fn registration(signed: &SignedManifest, runner_key: &PrivateKey, ops: Value) -> Value {
    json!({
        "runnerHash": HASH, "signedManifest": signed, "version": signed.manifest.runner_version,
        "environment": signed.manifest.environment, "ops": ops, "sandboxMode": "workspace-write",
        "bootTime": "2030-03-17T17:46:40Z", "publicKey": runner_key.public().to_base64(),
    })
}

pub fn bootstrap_token(plane: &Plane, org: &Org) -> String {
    let (s, t) = post(plane, org, "/v1/bootstrap-tokens", json!({}));
    assert_eq!(s, 201, "{t}");
    t["token"].as_str().unwrap().to_owned()
}

pub fn registered(plane: &Plane, org: &Org, seed: u8) -> Runner {
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
    let key = PrivateKey::from_seed([seed; 32]);
    let (s, b) = call(
        "POST",
        &format!("{}/v1/runner/register", plane.url),
        &bearer(&bootstrap_token(plane, org)),
        registration(&current, &key, json!(["artifact_read"]))
            .to_string()
            .as_bytes(),
    );
    assert_eq!(s, 201, "{b}");
    Runner {
        key,
        id: b["runnerId"].as_str().unwrap().to_owned(),
    }
}

pub fn signed_headers(
    runner: &Runner,
    method: &str,
    path: &str,
    body: &[u8],
    at: i64,
) -> Vec<(&'static str, String)> {
    let nonce = moat_core::random::new_id("");
    vec![
        (request_sig::RUNNER, runner.id.clone()),
        (request_sig::TIMESTAMP, at.to_string()),
        (request_sig::NONCE, nonce.clone()),
        (
            request_sig::SIGNATURE,
            request_sig::Signed {
                runner: &runner.id,
                method,
                path_and_query: path,
                timestamp_ms: at,
                nonce: &nonce,
                body,
            }
            .sign(&runner.key),
        ),
    ]
}

/// A signed runner request with `body`.
pub fn runner_post(plane: &Plane, runner: &Runner, path: &str, body: &[u8]) -> (u16, Value) {
    let headers = signed_headers(runner, "POST", path, body, plane.clock.now_ms());
    call("POST", &format!("{}{path}", plane.url), &headers, body)
}
