#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The deployment as containers, with Debian's podman, on a network of the
//! test's own: PostgreSQL with `ssl=on` and a certificate made here, the
//! control plane from `deploy/images/control-plane.Containerfile` (scratch
//! and one static binary) reaching it with `sslmode=verify-full` and a
//! password file, and two runners from `deploy/images/runner.Containerfile`
//! with the DaemonSet's hardening (their own user namespace, uid 65532, no
//! capabilities, no_new_privs, read-only root, the shipped seccomp profile,
//! nothing masked), enrolled with one token file written once. A runner
//! container is restarted twice (SIGTERM: it drains), and a run completes
//! each time without anyone writing a token. No registry is reached: the
//! runner image's base is built here from Debian's busybox-static.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::control::*;
use common::{MOAT, make_world_accessible, path_str};
use serde_json::{Value, json};

const PODMAN: &str = "/usr/bin/podman";

/// The host ids the runner containers' user namespace maps 0..65536 onto.
const POD_ID_BASE: u32 = 1_912_602_624;

/// The cgroup (in each hierarchy) the test's containers go under: Moat's
/// own subtree, never podman's default libpod_parent.
const CGROUP_PARENT: &str = "/moat/podman-test";

fn podman(args: &[&str]) -> (bool, String) {
    let mut all: Vec<&str> = args.to_vec();
    if matches!(args.first(), Some(&"run" | &"build")) {
        all.insert(1, "--cgroup-parent");
        all.insert(2, CGROUP_PARENT);
    }
    let out = Command::new(PODMAN)
        // No systemd here to manage cgroups; the session's limits are lower
        // than podman's default ulimits, hence the explicit ones below.
        .arg("--cgroup-manager=cgroupfs")
        .args(&all)
        .output()
        .expect("podman (Debian's podman, installed by tests/suite.sh)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn must(args: &[&str]) -> String {
    let (ok, out) = podman(args);
    assert!(ok, "podman {args:?}: {out}");
    out
}

/// Removes the cgroup directory `dir` and the ones below it (conmon's),
/// deepest first; a cgroup that still holds a process stays.
fn remove_empty_cgroups(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_cgroups(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Everything the test made in podman, removed however the test ends.
struct Made {
    tag: String,
    containers: Vec<String>,
    images: Vec<String>,
    network: Option<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = podman(&["rm", "--force", "--time", "0", c]);
        }
        for i in &self.images {
            let _ = podman(&["rmi", "--force", i]);
        }
        if let Some(n) = &self.network {
            let _ = podman(&["network", "rm", "--force", n]);
        }
        // The parent cgroups podman made for them, now empty.
        if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
            for h in hierarchies.flatten() {
                remove_empty_cgroups(&h.path().join(CGROUP_PARENT.trim_start_matches('/')));
            }
        }
    }
}

const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=4096:4096",
];

fn build(made: &mut Made, name: &str, file: &Path, context: &Path, extra: &[&str]) -> String {
    let image = format!("localhost/moat-test-{name}:{}", made.tag);
    let mut args = vec![
        "build",
        "--network",
        "none",
        "--quiet",
        "-f",
        path_str(file),
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-t", &image, path_str(context)]);
    must(&args);
    made.images.push(image.clone());
    image
}

/// A CA, and certificates it signed for `names` (IP addresses or DNS
/// names): (CA PEM, certificate PEM, key PEM).
fn pki(names: &[&str]) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "Moat containers test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, names[0]);
    leaf.use_authority_key_identifier_extension = true;
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_pem, cert.pem(), key.serialize_pem())
}

fn write(path: &Path, text: &str, owner: u32, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::os::unix::fs::chown(path, Some(owner), Some(owner)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn uid_of(user: &str) -> u32 {
    let out = Command::new("id").args(["-u", user]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// GET `url` answers 200 (a refused or failed connection is a no).
fn answers_200(url: &str) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    agent.get(url).call().is_ok_and(|r| r.status() == 200)
}

fn runners(cp: &Serve, org: &str) -> Vec<Value> {
    let (_, body) = call("GET", &format!("{}/v1/runners", cp.url), org, None);
    body["runners"].as_array().cloned().unwrap_or_default()
}

/// One run with one operation, finished: it must succeed.
fn a_run_completes(cp: &Serve, org: &str, id: &str) {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", cp.url),
        org,
        Some(json!({"id": id})),
    );
    assert_eq!(status, 201, "{body}");
    let (status, op) = post_op(
        cp,
        org,
        id,
        envelope(
            "w",
            "artifact_write",
            json!({"path": "output/x", "content": id, "maxBytes": 64}),
        ),
    );
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("succeeded")),
        "{id}: {op}"
    );
    call(
        "POST",
        &format!("{}/v1/runs/{id}/finish", cp.url),
        org,
        None,
    );
    wait_state(cp, org, id, "succeeded");
}

#[test]
fn the_images_run_as_a_deployment_and_a_restarted_runner_enrols_again_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    make_world_accessible(dir.path());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let setup = setup_with(dir.path(), |m| m["cgroupLimits"] = json!("deployment"));
    let suffix = moat_core::random::new_id("");
    let mut made = Made {
        tag: suffix[..10].to_owned(),
        containers: Vec::new(),
        images: Vec::new(),
        network: None,
    };

    // Images. The runner's base is busybox-static with a merged /usr, built
    // here (no registry); the control plane's is scratch.
    let base_ctx = dir.path().join("base");
    std::fs::create_dir(&base_ctx).unwrap();
    std::fs::copy("/bin/busybox", base_ctx.join("busybox")).unwrap();
    std::fs::write(
        base_ctx.join("Containerfile"),
        "FROM scratch\nCOPY busybox /usr/bin/busybox\n\
         RUN [\"/usr/bin/busybox\", \"sh\", \"-c\", \"/usr/bin/busybox mkdir -p /usr/lib /usr/sbin /etc /tmp && \
         /usr/bin/busybox ln -s usr/bin /bin && /usr/bin/busybox ln -s usr/lib /lib && /usr/bin/busybox mkdir -p /usr/lib64 && /usr/bin/busybox ln -s usr/lib64 /lib64 && \
         /usr/bin/busybox ln -s usr/sbin /sbin && /usr/bin/busybox --install -s /usr/bin\"]\n",
    )
    .unwrap();
    let base = build(
        &mut made,
        "base",
        &base_ctx.join("Containerfile"),
        &base_ctx,
        &[],
    );
    let cp_ctx = dir.path().join("cp-image");
    std::fs::create_dir(&cp_ctx).unwrap();
    std::fs::copy(MOAT, cp_ctx.join("moat")).unwrap();
    let cp_image = build(
        &mut made,
        "control-plane",
        &root.join("deploy/images/control-plane.Containerfile"),
        &cp_ctx,
        &[],
    );
    let runner_ctx = dir.path().join("runner-image");
    std::fs::create_dir(&runner_ctx).unwrap();
    std::fs::copy(&setup.runner, runner_ctx.join("moat-runner")).unwrap();
    let base_arg = format!("BASE={base}");
    let runner_image = build(
        &mut made,
        "runner",
        &root.join("deploy/images/runner.Containerfile"),
        &runner_ctx,
        &["--build-arg", &base_arg],
    );
    // The image holds the very file the control plane allowlists.
    let hashed = must(&[
        "run",
        "--rm",
        "--network",
        "none",
        ULIMITS[0],
        ULIMITS[1],
        ULIMITS[2],
        ULIMITS[3],
        "--entrypoint",
        "/usr/bin/sha256sum",
        &runner_image,
        "/usr/local/bin/moat-runner",
    ]);
    assert!(
        hashed.starts_with(&setup.runner_hash),
        "{hashed} vs {}",
        setup.runner_hash
    );

    // A network of the test's own.
    let octet = 100 + u8::from_str_radix(&suffix[..2], 16).unwrap() % 100;
    let subnet = format!("10.213.{octet}.0/24");
    let ip = |host: u8| format!("10.213.{octet}.{host}");
    let network = format!("moat-test-{}", made.tag);
    must(&["network", "create", "--subnet", &subnet, &network]);
    made.network = Some(network.clone());

    // PostgreSQL, ssl=on with a certificate for its address, TLS and SCRAM
    // only; its data directory made here by Debian's initdb, run from the
    // host's /usr in the container.
    let postgres = uid_of("postgres");
    let pg = dir.path().join("pg");
    std::fs::create_dir(&pg).unwrap();
    std::os::unix::fs::chown(&pg, Some(postgres), Some(postgres)).unwrap();
    let password = moat_core::random::new_id("");
    write(&dir.path().join("pwfile"), &password, postgres, 0o600);
    let pg_bin = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap()
        .map(|e| e.unwrap().path().join("bin"))
        .max()
        .unwrap();
    let initdb = Command::new("runuser")
        .current_dir("/")
        .args(["-u", "postgres", "--"])
        .arg(pg_bin.join("initdb"))
        .args([
            "-D",
            &format!("{}/data", pg.display()),
            "-U",
            "moat",
            "-E",
            "UTF8",
            "--auth=scram-sha-256",
        ])
        .arg(format!("--pwfile={}", dir.path().join("pwfile").display()))
        .output()
        .unwrap();
    assert!(
        initdb.status.success(),
        "{}",
        String::from_utf8_lossy(&initdb.stderr)
    );
    let data = pg.join("data");
    let (pg_ca, pg_cert, pg_key) = pki(&[&ip(10)]);
    write(&data.join("server.crt"), &pg_cert, postgres, 0o600);
    write(&data.join("server.key"), &pg_key, postgres, 0o600);
    write(
        &data.join("pg_hba.conf"),
        "hostssl all moat 0.0.0.0/0 scram-sha-256\n",
        postgres,
        0o600,
    );
    let pg_name = format!("moat-test-pg-{}", made.tag);
    made.containers.push(pg_name.clone());
    let pg_volume = format!("{}:/var/lib/pg", data.display());
    let user = format!("{postgres}:{postgres}");
    must(&[
        "run",
        "-d",
        "--name",
        &pg_name,
        "--network",
        &network,
        "--ip",
        &ip(10),
        ULIMITS[0],
        ULIMITS[1],
        ULIMITS[2],
        ULIMITS[3],
        "--user",
        &user,
        "-v",
        "/usr:/usr:ro",
        "-v",
        "/etc/passwd:/etc/passwd:ro",
        "-v",
        "/etc/group:/etc/group:ro",
        "-v",
        &pg_volume,
        &base,
        &format!("{}/postgres", pg_bin.display()),
        "-D",
        "/var/lib/pg",
        "-c",
        "listen_addresses=*",
        "-c",
        "ssl=on",
        "-c",
        "ssl_cert_file=/var/lib/pg/server.crt",
        "-c",
        "ssl_key_file=/var/lib/pg/server.key",
        "-c",
        "unix_socket_directories=",
        "-c",
        "fsync=off",
    ]);

    let pg_addr: std::net::SocketAddr = format!("{}:5432", ip(10)).parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect_timeout(&pg_addr, Duration::from_secs(1)).is_err() {
        assert!(
            Instant::now() < deadline,
            "PostgreSQL never listened: {}",
            podman(&["logs", &pg_name]).1
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The control plane: uid 65532, read-only root, its files mounted.
    let etc = dir.path().join("etc-moat");
    std::fs::create_dir(&etc).unwrap();
    for (name, text) in [
        (
            "control-plane.key",
            std::fs::read_to_string(&setup.key).unwrap(),
        ),
        (
            "policy.cedar",
            std::fs::read_to_string(&setup.policy).unwrap(),
        ),
        (
            "admin-token",
            std::fs::read_to_string(&setup.admin).unwrap(),
        ),
        ("db-password", password.clone()),
        ("db-ca.pem", pg_ca.clone()),
    ] {
        write(&etc.join(name), &text, 65532, 0o400);
    }
    make_world_accessible(&etc);
    let cp_name = format!("moat-test-cp-{}", made.tag);
    made.containers.push(cp_name.clone());
    let etc_volume = format!("{}:/etc/moat:ro", etc.display());
    let db_url = format!(
        "postgres://moat@{}:5432/postgres?sslmode=verify-full&sslrootcert=/etc/moat/db-ca.pem",
        ip(10)
    );
    must(&[
        "run",
        "-d",
        "--name",
        &cp_name,
        "--network",
        &network,
        "--ip",
        &ip(20),
        ULIMITS[0],
        ULIMITS[1],
        ULIMITS[2],
        ULIMITS[3],
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &etc_volume,
        &cp_image,
        "serve",
        "--db",
        &db_url,
        "--db-password-file",
        "/etc/moat/db-password",
        "--listen",
        "0.0.0.0:7700",
        "--environment",
        "test",
        "--lease",
        "5s",
        "--key",
        "/etc/moat/control-plane.key",
        "--policy",
        "/etc/moat/policy.cedar",
        "--admin-token-file",
        "/etc/moat/admin-token",
    ]);
    let cp = Serve::attached(&format!("http://{}:7700", ip(20)));
    let ready = format!("{}/readyz", cp.url);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !answers_200(&ready) {
        if Instant::now() > deadline {
            panic!(
                "the control plane never got ready.\ncontrol plane: {}\npostgres: {}",
                podman(&["logs", &cp_name]).1,
                podman(&["logs", &pg_name]).1
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // The org, its build, its manifest, and its cluster's enrolment.
    let acme = org(&cp, "acme");
    prepare_org(&cp, &setup, &acme);
    let key = ClusterKey::new();
    let subject = "system:serviceaccount:moat-runner:moat-runner";
    let issuer = "https://kubernetes.default.svc.cluster.local";
    let (status, enrolment) = call(
        "POST",
        &format!("{}/v1/runner-enrolments", cp.url),
        &acme,
        Some(json!({"name": "cluster", "issuer": issuer, "subject": subject, "jwks": key.jwks()})),
    );
    assert_eq!(status, 201, "{enrolment}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = key.token(&json!({
        "iss": issuer, "sub": subject, "aud": [enrolment["audience"]],
        "iat": now, "nbf": now, "exp": now + 600,
    }));
    let runner_uid = POD_ID_BASE + 65532;
    let enrol_dir = dir.path().join("enrolment");
    std::fs::create_dir(&enrol_dir).unwrap();
    write(&enrol_dir.join("token"), &token, runner_uid, 0o400);
    std::os::unix::fs::chown(&enrol_dir, Some(runner_uid), Some(runner_uid)).unwrap();
    let written = std::fs::metadata(enrol_dir.join("token"))
        .unwrap()
        .modified()
        .unwrap();

    // Two runners with the DaemonSet's hardening.
    let profile = root.join("deploy/kubernetes/node/moat-runner-seccomp.json");
    let seccomp = format!("seccomp={}", profile.display());
    let map = format!("0:{POD_ID_BASE}:65536");
    let enrol_volume = format!("{}:/run/moat/enrolment:ro", enrol_dir.display());
    let mut names = Vec::new();
    for (n, host) in [("a", 31u8), ("b", 32)] {
        let state = dir.path().join(format!("state-{n}"));
        std::fs::create_dir(&state).unwrap();
        std::os::unix::fs::chown(&state, Some(runner_uid), Some(runner_uid)).unwrap();
        let name = format!("moat-test-runner-{n}-{}", made.tag);
        made.containers.push(name.clone());
        let state_volume = format!("{}:/var/lib/moat-runner", state.display());
        // emptyDirs: host directories owned by the pod's user.
        let tmp = dir.path().join(format!("tmp-{n}"));
        std::fs::create_dir(&tmp).unwrap();
        std::os::unix::fs::chown(&tmp, Some(runner_uid), Some(runner_uid)).unwrap();
        let tmp_volume = format!("{}:/tmp", tmp.display());
        must(&[
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            &network,
            "--ip",
            &ip(host),
            ULIMITS[0],
            ULIMITS[1],
            ULIMITS[2],
            ULIMITS[3],
            "--uidmap",
            &map,
            "--gidmap",
            &map,
            "--user",
            "65532:65532",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--security-opt",
            &seccomp,
            "--security-opt",
            "unmask=ALL",
            "--read-only",
            "-v",
            &tmp_volume,
            "-v",
            &state_volume,
            "-v",
            &enrol_volume,
            &runner_image,
            "runner",
            "start",
            "--control-plane",
            &cp.url,
            "--enrolment-token-file",
            "/run/moat/enrolment/token",
            "--state-dir",
            "/var/lib/moat-runner",
        ]);
        names.push(name);
    }
    wait_until("both runners registered", Duration::from_secs(60), || {
        runners(&cp, &acme).len() == 2
    });
    a_run_completes(&cp, &acme, "first");

    // Restart one runner twice: it drains on SIGTERM, starts again, and
    // registers with the same token file. A run completes each time.
    for (round, expected) in [(1, 3), (2, 4)] {
        let (ok, out) = podman(&["restart", "--time", "30", &names[0]]);
        assert!(ok, "restart {round}: {out}");
        wait_until(
            "the restarted runner registered again",
            Duration::from_secs(60),
            || runners(&cp, &acme).len() == expected,
        );
        a_run_completes(&cp, &acme, &format!("after-restart-{round}"));
    }
    assert_eq!(
        std::fs::metadata(enrol_dir.join("token"))
            .unwrap()
            .modified()
            .unwrap(),
        written,
        "nobody wrote a token"
    );
    let all = runners(&cp, &acme);
    assert!(
        all.iter().all(|r| r["enrolmentId"] == enrolment["id"]),
        "{all:?}"
    );
    // The runner drained and exited 0 at each stop.
    let logs = must(&["logs", &names[0]]);
    assert_eq!(logs.matches("stopped (SIGTERM)").count(), 2, "{logs}");
}
