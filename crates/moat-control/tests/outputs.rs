//! The trusted output store behind the export boundary, through the API: a
//! file the boundary promotes is written to the output store (a directory,
//! or an S3-compatible bucket: moto's server, started here on loopback) and
//! not to the database; a download reads it back and hashes it; a held
//! file enters the store only when a person approves it in time; a store
//! that cannot take a file fails the runner's report with 503, and the
//! report sent again lands.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod plane;

use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use moat_store::Outputs;
use plane::*;
use serde_json::{Value, json};

const EXPORT_POLICY: &str = r#"
permit(principal, action == Moat::Action::"artifact_read", resource);
@id("results")
permit(principal, action == Moat::Action::"export", resource)
when { context.path like "output/*" && !(context.path like "output/client/*") };
@id("client-deliverable") @approval("required") @risk("high")
permit(principal, action == Moat::Action::"export", resource)
when { context.path like "output/client/*" };
"#;

fn runner_call(plane: &Plane, runner: &Runner, path: &str) -> (u16, Value) {
    runner_post(plane, runner, path, b"")
}

fn get(plane: &Plane, org: &Org, path: &str) -> (u16, Vec<u8>) {
    let (status, _, body) = raw(
        "GET",
        &format!("{}{path}", plane.url),
        &bearer(&org.token),
        None,
    );
    (status, body)
}

fn error_reason(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v["error"]["reason"].as_str().unwrap_or_default().to_owned()
}

/// A run with one operation, claimed, the operation handed to `runner`.
fn op_dispatched(plane: &Plane, org: &Org, runner: &Runner, run: &str) {
    assert_eq!(post(plane, org, "/v1/runs", json!({"id": run})).0, 201);
    let op = json!({"id": "clean", "op": "artifact_read", "args": {"path": "a", "maxBytes": 1}});
    let (s, b) = post(plane, org, &format!("/v1/runs/{run}/ops"), op);
    assert_eq!(s, 201, "{b}");
    assert_eq!(runner_call(plane, runner, "/v1/runner/claim").0, 200);
    let (s, b) = runner_call(plane, runner, &format!("/v1/runner/runs/{run}/next"));
    assert_eq!((s, b["action"].as_str()), (200, Some("op")), "{b}");
}

/// What a runner's shell reports for an op whose program wrote `files`,
/// every one of them promoted by its verifier as CSV.
fn report(run: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
    let typed: Vec<(&str, &[u8], &str)> = files.iter().map(|(p, d)| (*p, *d, "csv")).collect();
    report_typed(run, &typed)
}

/// `report`, each file promoted as the type given.
fn report_typed(run: &str, files: &[(&str, &[u8], &str)]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let sha = |data: &[u8]| moat_core::hash::sha256_hex(data);
    json!({
        "result": {
            "id": "clean", "status": "ok",
            "artifacts": files.iter().map(|(path, data, _)| json!({
                "kind": "export", "label": path, "sha256": sha(data), "size": data.len()}))
                .collect::<Vec<_>>(),
            "result": {"exports": {"promoted": files.iter().map(|(path, data, ty)| json!({
                "path": path, "sha256": sha(data), "type": ty})).collect::<Vec<_>>()}},
        },
        "events": files.iter().map(|(path, data, ty)| json!({
            "type": "artifact.promoted", "at": "2030-01-01T00:00:00Z", "runId": run,
            "data": {"path": path, "sha256": sha(data), "size": data.len(), "exportedAs": ty},
        })).collect::<Vec<_>>(),
        "artifacts": files.iter().map(|(path, data, _)| json!({
            "kind": "export", "label": path, "sha256": sha(data),
            "contentBase64": b64.encode(data)})).collect::<Vec<_>>(),
    })
    .to_string()
    .into_bytes()
}

fn pending_approval(plane: &Plane, org: &Org, path: &str) -> String {
    let (s, b) = call(
        "GET",
        &format!("{}/v1/approvals?state=pending", plane.url),
        &bearer(&org.token),
        b"",
    );
    assert_eq!(s, 200, "{b}");
    b["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["summary"]["args"]["path"] == path)
        .unwrap_or_else(|| panic!("no pending approval for {path}: {b}"))["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The whole story against one output store; `raw_object` reads an object
/// by its key without Moat's client (`None`: there is none).
fn promoted_files_live_in_the_output_store(
    plane: &Plane,
    raw_object: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Org {
    let sha = |data: &[u8]| moat_core::hash::sha256_hex(data);
    let key = |sha: &str| format!("sha256/{}/{sha}", &sha[..2]);
    let acme = org(plane, "acme");
    let runner = registered(plane, &acme, 3);
    let clean: &[u8] = b"id,total\n1,10\n2,20\n";
    let report_csv: &[u8] = b"client,total\nglobex,30\n";
    let late_csv: &[u8] = b"client,total\ninitech,40\n";

    // Promoted: in the output store under its hash, not in the database.
    op_dispatched(plane, &acme, &runner, "r1");
    let body = report(
        "r1",
        &[
            ("output/clean.csv", clean),
            ("output/client/report.csv", report_csv),
            ("output/client/late.csv", late_csv),
        ],
    );
    let (s, b) = runner_post(plane, &runner, "/v1/runner/runs/r1/ops/clean/result", &body);
    assert_eq!(s, 200, "{b}");
    assert_eq!(raw_object(&key(&sha(clean))).as_deref(), Some(clean));
    let org_id = org_id(plane, &acme);
    assert!(
        plane
            .store
            .artifact_bytes(&org_id, &sha(clean))
            .unwrap()
            .is_none(),
        "a promoted file's bytes stay out of the database"
    );
    let (s, bytes) = get(plane, &acme, &format!("/v1/artifacts/{}", sha(clean)));
    assert_eq!((s, bytes.as_slice()), (200, clean));

    // Held for a person: in the database, not (yet) in the store.
    for held in [report_csv, late_csv] {
        assert!(raw_object(&key(&sha(held))).is_none());
        let (s, b) = get(plane, &acme, &format!("/v1/artifacts/{}", sha(held)));
        assert_eq!((s, error_reason(&b).as_str()), (404, "awaiting_approval"));
    }
    let report_approval = pending_approval(plane, &acme, "output/client/report.csv");
    let late_approval = pending_approval(plane, &acme, "output/client/late.csv");
    let (s, b) = post(
        plane,
        &acme,
        &format!("/v1/approvals/{report_approval}/approve"),
        json!({"reason": "checked"}),
    );
    assert_eq!((s, b["state"].as_str()), (200, Some("approved")), "{b}");
    assert_eq!(
        raw_object(&key(&sha(report_csv))).as_deref(),
        Some(report_csv)
    );
    assert!(
        plane
            .store
            .held_bytes(&org_id, &report_approval)
            .unwrap()
            .is_none()
            && plane
                .store
                .artifact_bytes(&org_id, &sha(report_csv))
                .unwrap()
                .is_none(),
        "an approved file leaves the database for the store"
    );
    let (s, bytes) = get(plane, &acme, &format!("/v1/artifacts/{}", sha(report_csv)));
    assert_eq!((s, bytes.as_slice()), (200, report_csv));

    // Approved too late: expired instead, and nothing left in the store.
    plane.clock.advance(std::time::Duration::from_secs(601));
    let (s, b) = post(
        plane,
        &acme,
        &format!("/v1/approvals/{late_approval}/approve"),
        json!({}),
    );
    assert_eq!(
        (s, b["error"]["reason"].as_str()),
        (409, Some("approval_expired")),
        "{b}"
    );
    assert!(raw_object(&key(&sha(late_csv))).is_none());
    let (s, b) = get(plane, &acme, &format!("/v1/artifacts/{}", sha(late_csv)));
    assert_eq!((s, error_reason(&b).as_str()), (404, "quarantined"));
    assert!(
        plane.events_named("artifact.rejected").iter().any(|e| {
            e.data["path"] == "output/client/late.csv"
                && e.data["reasons"][0]["rule"] == "not_approved"
        }),
        "the expiry is recorded"
    );

    // Bytes changed behind the control plane's back are never served.
    plane.outputs_put(&sha(clean), b"id,total\n1,99\n");
    let (s, b) = get(plane, &acme, &format!("/v1/artifacts/{}", sha(clean)));
    assert_eq!((s, error_reason(&b).as_str()), (500, "artifact_corrupt"));
    let (s, b) = call(
        "GET",
        &format!("{}/v1/artifacts/{}/verify", plane.url, sha(clean)),
        &bearer(&acme.token),
        b"",
    );
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["ok"], false, "{b}");
    assert_eq!(b["computed"], sha(b"id,total\n1,99\n").as_str(), "{b}");
    plane.outputs_remove(&sha(clean));
    let (s, b) = get(plane, &acme, &format!("/v1/artifacts/{}", sha(clean)));
    assert_eq!((s, error_reason(&b).as_str()), (500, "output_missing"));
    acme
}

fn org_id(plane: &Plane, org: &Org) -> String {
    let hash = moat_core::hash::sha256_hex(org.token.as_bytes());
    plane.store.org_of_api_token(&hash).unwrap().expect("org")
}

impl Plane {
    fn outputs_put(&self, sha: &str, data: &[u8]) {
        block_on(self.outputs.put(sha, data)).unwrap();
    }

    fn outputs_remove(&self, sha: &str) {
        block_on(self.outputs.remove(sha)).unwrap();
    }
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

#[test]
fn promoted_files_go_to_a_directory_and_a_store_that_fails_is_retried() {
    let plane = Plane::sqlite_with(EXPORT_POLICY, |dir| {
        Outputs::directory(&dir.join("outputs")).unwrap()
    });
    let root = plane.dir.path().join("outputs");
    let read = |key: &str| std::fs::read(root.join(key)).ok();
    let acme = promoted_files_live_in_the_output_store(&plane, &read);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&root).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o700,
            "the store's directory is the server's alone"
        );
    }

    // A store that cannot take the file: 503 (runners send it again), and
    // nothing of the op is recorded; sent again once it can, it lands.
    let runner = registered(&plane, &acme, 4);
    op_dispatched(&plane, &acme, &runner, "r2");
    let data: &[u8] = b"id\n7\n";
    let body = report("r2", &[("output/again.csv", data)]);
    let parked = plane.dir.path().join("outputs.parked");
    std::fs::rename(&root, &parked).unwrap();
    std::fs::write(&root, b"not a directory").unwrap();
    let path = "/v1/runner/runs/r2/ops/clean/result";
    let (s, b) = runner_post(&plane, &runner, path, &body);
    assert_eq!(
        (s, b["error"]["reason"].as_str()),
        (503, Some("outputs_unavailable")),
        "{b}"
    );
    assert!(
        plane
            .store
            .artifacts(&org_id(&plane, &acme), "r2")
            .unwrap()
            .is_empty()
    );
    std::fs::remove_file(&root).unwrap();
    std::fs::rename(&parked, &root).unwrap();
    let (s, b) = runner_post(&plane, &runner, path, &body);
    assert_eq!(s, 200, "{b}");
    let sha = moat_core::hash::sha256_hex(data);
    assert_eq!(
        read(&format!("sha256/{}/{sha}", &sha[..2])).as_deref(),
        Some(data)
    );
}

/// moto's S3 server on a loopback port of its own, stopped when dropped.
struct Moto {
    child: Child,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto() -> Moto {
    let server = std::env::var("MOAT_TEST_MOTO").expect(
        "MOAT_TEST_MOTO: the path of moto_server (tests/suite.sh installs moto into target/s3-venv)",
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{server}: {e}"));
    let moto = Moto {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return moto;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("moto_server did not listen on {}", moto.url);
}

#[test]
fn promoted_files_go_to_an_s3_compatible_bucket() {
    let moto = moto();
    let bucket = format!("moat-{}", moat_core::random::new_id("").to_lowercase());
    let (s, _, b) = raw("PUT", &format!("{}/{bucket}", moto.url), &[], Some(b""));
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    let settings = [
        ("aws_endpoint", moto.url.as_str()),
        ("aws_allow_http", "true"),
        ("aws_access_key_id", "moat-test"),
        ("aws_secret_access_key", "moat-test"),
        ("aws_region", "us-east-1"),
    ];
    let outputs = Outputs::s3(&bucket, "org-outputs", &settings).unwrap();
    block_on(outputs.check()).expect("the probe object");
    let plane = Plane::sqlite_with(EXPORT_POLICY, |_| outputs);
    // Read straight from the bucket, not through object_store: moto wants
    // an Authorization header, and does not check its signature.
    let read = |key: &str| {
        let (s, _, body) = raw(
            "GET",
            &format!("{}/{bucket}/org-outputs/{key}", moto.url),
            &[("authorization", "AWS moat-test:unchecked".to_owned())],
            None,
        );
        (s == 200).then_some(body)
    };
    promoted_files_live_in_the_output_store(&plane, &read);

    // No such bucket: the start-up probe says so.
    let missing = Outputs::s3("no-such-bucket-here", "", &settings).unwrap();
    let e = block_on(missing.check()).unwrap_err().to_string();
    assert!(e.contains("s3://no-such-bucket-here"), "{e}");
}

#[test]
fn an_org_secret_inside_a_compressed_export_is_found_on_the_control_plane() {
    use std::io::Write as _;
    let plane = Plane::sqlite_with(EXPORT_POLICY, |dir| {
        Outputs::directory(&dir.join("outputs")).unwrap()
    });
    let acme = org(&plane, "acme");
    let secret = format!("sk-live-{}", moat_core::random::new_id(""));
    let (s, b) = call(
        "PUT",
        &format!("{}/v1/secrets/client-key", plane.url),
        &bearer(&acme.token),
        json!({"value": secret}).to_string().as_bytes(),
    );
    assert_eq!(s, 201, "{b}");
    let runner = registered(&plane, &acme, 5);
    op_dispatched(&plane, &acme, &runner, "r1");
    // The secret deflated: not in the bytes as they travel.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    // Repeated, so that deflate codes it rather than storing it as is.
    let rows = format!("1,{secret}\n").repeat(200);
    gz.write_all(format!("id,key\n{rows}").as_bytes()).unwrap();
    let leaky = gz.finish().unwrap();
    assert!(!leaky.windows(secret.len()).any(|w| w == secret.as_bytes()));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(b"id,total\n1,2\n").unwrap();
    let clean = gz.finish().unwrap();
    let broken: &[u8] = b"\x1f\x8b\x08\0\0\0\0\0\0\x03not deflate";
    let body = report_typed(
        "r1",
        &[
            ("output/leaky.csv.gz", &leaky, "gzip"),
            ("output/clean.csv.gz", &clean, "gzip"),
            ("output/broken.gz", broken, "gzip"),
        ],
    );
    let (s, b) = runner_post(
        &plane,
        &runner,
        "/v1/runner/runs/r1/ops/clean/result",
        &body,
    );
    assert_eq!(s, 200, "{b}");
    let sha = |data: &[u8]| moat_core::hash::sha256_hex(data);
    let (s, bytes) = get(&plane, &acme, &format!("/v1/artifacts/{}", sha(&clean)));
    assert_eq!((s, bytes), (200, clean.clone()));
    for (file, says) in [
        (&leaky, "holds one of the org's stored secrets"),
        (&broken.to_vec(), "could not unpack"),
    ] {
        let (s, b) = get(&plane, &acme, &format!("/v1/artifacts/{}", sha(file)));
        assert_eq!((s, error_reason(&b).as_str()), (404, "quarantined"));
        assert!(
            String::from_utf8_lossy(&b).contains(says),
            "{}",
            String::from_utf8_lossy(&b)
        );
        assert!(!String::from_utf8_lossy(&b).contains(&secret));
    }
    let rejected = plane.events_named("artifact.rejected");
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    assert!(
        rejected
            .iter()
            .all(|e| e.data["reasons"][0]["rule"] == "secret")
    );
    // Nothing of them in the store, or in the database.
    let root = plane.dir.path().join("outputs");
    for file in [&leaky, &broken.to_vec()] {
        let h = sha(file);
        assert!(!root.join(format!("sha256/{}/{h}", &h[..2])).exists());
        assert!(!String::from_utf8_lossy(&plane.database_bytes()).contains(&secret));
    }
}
