//! The control plane's test rig: a `moat serve` process on a backend, a
//! sealed runner registered with a bootstrap token, an agent's HTTP calls.
//! Shared by tests/control.rs and benches/control.rs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use moat_store::TempPostgres;
use serde_json::{Value, json};

use super::{MOAT, host_processes_with, path_str, signed_manifest};

pub const POLICY: &str = r#"
@id("read-inputs")
permit(principal in Moat::Org::"acme", action == Moat::Action::"artifact_read", resource)
when { context.size <= 1048576 };

@id("write-outputs")
permit(principal in Moat::Org::"acme", action == Moat::Action::"artifact_write", resource);

@id("tools")
permit(principal in Moat::Org::"acme", action == Moat::Action::"exec_argv", resource)
when { context.network == "off" && (resource == Moat::Executable::"/usr/bin/wc"
       || resource == Moat::Executable::"/usr/bin/python3") };

@id("python-with-network") @approval("required")
permit(principal in Moat::Org::"acme", action == Moat::Action::"exec_argv",
       resource == Moat::Executable::"/usr/bin/python3")
when { context.network != "off" };

@id("no-secrets")
forbid(principal, action, resource == Moat::Path::"input/secret.txt");

@id("sensitive-read") @approval("required")
permit(principal in Moat::Org::"acme", action == Moat::Action::"artifact_read", resource)
when { context.path like "input/sensitive/*" };

@id("crm-read")
permit(principal in Moat::Org::"acme", action == Moat::Action::"http_request",
       resource == Moat::Tool::"crm_lookup")
when { context.method == "GET" };

@id("exports")
permit(principal in Moat::Org::"acme", action == Moat::Action::"export", resource)
when { context.path like "output/*" };

@id("browse")
permit(principal in Moat::Org::"acme", action == Moat::Action::"browser_step", resource)
when { ["open", "navigate", "wait_for", "extract", "screenshot", "close"].contains(context.action) };

@id("follow-links")
permit(principal in Moat::Org::"acme", action == Moat::Action::"browser_step", resource)
when { context.action == "click" && context.element.tag == "a" && context.domain == "app.test" };

@id("no-deleting")
forbid(principal, action == Moat::Action::"browser_step", resource)
when { context.element.text like "*Delete*" };

@id("browse-act") @approval("required")
permit(principal in Moat::Org::"acme", action == Moat::Action::"browser_step", resource)
when { ["click", "type", "select", "fill_secret"].contains(context.action) &&
       !(context.action == "click" && context.element.tag == "a" && context.domain == "app.test") };

@id("crm-write") @approval("required") @risk("high")
permit(principal in Moat::Org::"acme", action == Moat::Action::"http_request",
       resource == Moat::Tool::"crm_update");
"#;

pub const ADMIN: &str = "admin-token-for-tests-0123456789";

pub fn sha256_hex(bytes: &[u8]) -> String {
    moat_core::hash::sha256_hex(bytes)
}

/// One storage backend for a test: the `--db` value and what keeps it alive.
pub struct Db {
    pub url: String,
    _pg: Option<TempPostgres>,
}

pub fn databases(dir: &Path) -> Vec<Db> {
    let pg = TempPostgres::create()
        .expect("PostgreSQL is needed: bash tests/suite.sh starts a throwaway one (or set MOAT_TEST_POSTGRES)");
    vec![
        Db {
            url: format!("sqlite:{}", dir.join("control.db").display()),
            _pg: None,
        },
        Db {
            url: pg.url.clone(),
            _pg: Some(pg),
        },
    ]
}

/// Everything a control plane needs on disk: keys, policy, admin token, a
/// signed manifest for environment `test` naming the policy, a sealed runner.
pub struct Setup {
    pub dir: PathBuf,
    pub key: PathBuf,
    pub policy: PathBuf,
    pub admin: PathBuf,
    pub signed: Value,
    pub runner: PathBuf,
    pub runner_hash: String,
}

pub fn setup(dir: &Path) -> Setup {
    setup_with(dir, |_| {})
}

pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `setup`, with the sealed manifest edited first.
pub fn setup_with(dir: &Path, edit: impl FnOnce(&mut Value)) -> Setup {
    let (signed_path, public) = signed_manifest(dir, |m| {
        m["environment"] = json!("test");
        m["policyHash"] = json!(sha256_hex(POLICY.as_bytes()));
        edit(m);
    });
    let policy = dir.join("policy.cedar");
    std::fs::write(&policy, POLICY).unwrap();
    let admin = dir.join("admin-token");
    std::fs::write(&admin, ADMIN).unwrap();
    let runner = dir.join("moat-runner");
    let built = Command::new(MOAT)
        .args(["runner", "build", "--manifest", path_str(&signed_path)])
        .args([
            "--trusted-key",
            path_str(&public),
            "--out",
            path_str(&runner),
        ])
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let report: Value = serde_json::from_slice(&built.stdout).unwrap();
    Setup {
        dir: dir.to_owned(),
        key: dir.join("keys/moat.key"),
        policy,
        admin,
        signed: serde_json::from_str(&std::fs::read_to_string(&signed_path).unwrap()).unwrap(),
        runner,
        runner_hash: report["runnerHash"].as_str().unwrap().to_owned(),
    }
}

/// A `moat serve` process, killed (by its pid) when dropped.
pub struct Serve {
    /// `None`: a control plane this test did not start (in a container).
    pub child: Option<Child>,
    pub url: String,
    /// Its database: every event in it is checked against its schema when
    /// the test is done with it.
    db: String,
}

impl Serve {
    pub fn start(setup: &Setup, db: &str, listen: &str) -> Serve {
        Self::start_with(setup, db, listen, &[])
    }

    /// `start` with more flags for `moat serve` (a `--lease` of its own
    /// in place of the tests' 3 s).
    pub fn start_with(setup: &Setup, db: &str, listen: &str, extra: &[&str]) -> Serve {
        let lease: &[&str] = if extra.iter().any(|a| a.starts_with("--lease")) {
            &[]
        } else {
            &["--lease", "3s"]
        };
        let mut child = Command::new(MOAT)
            .args([
                "serve",
                "--db",
                db,
                "--listen",
                listen,
                "--environment",
                "test",
            ])
            .args(lease)
            .args([
                "--key",
                path_str(&setup.key),
                "--policy",
                path_str(&setup.policy),
            ])
            .args(["--admin-token-file", path_str(&setup.admin)])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
            .unwrap_or_else(|| panic!("moat serve did not start: {line}"))
            .to_owned();
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
            }
        });
        Serve {
            child: Some(child),
            url,
            db: db.to_owned(),
        }
    }

    /// A control plane running elsewhere (a container), reached at `url`;
    /// its ledger is not checked from here.
    pub fn attached(url: &str) -> Serve {
        Serve {
            child: None,
            url: url.to_owned(),
            db: String::new(),
        }
    }

    pub fn port(&self) -> &str {
        self.url.rsplit(':').next().unwrap()
    }

    pub fn stop(&mut self) {
        // SIGTERM to the pid of the child this test started: a clean stop.
        if let Some(child) = &mut self.child {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let Some(child) = &mut self.child else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
        if !std::thread::panicking() {
            check_ledger(&self.db);
        }
    }
}

/// Every event a control plane recorded is of its type's schema.
fn check_ledger(db: &str) {
    let store = moat_store::Store::open(db).expect("reopening the control plane's database");
    let mut after = 0;
    loop {
        let page = store.all_events(after, 1000).expect("reading the ledger");
        let Some(last) = page.last() else {
            return;
        };
        after = last.seq;
        for stored in &page {
            super::check_event(&stored.to_json(), &format!("the ledger of {db}"));
        }
    }
}

/// For event streams and downloads, which the typed client does not read.
static AGENT: std::sync::LazyLock<ureq::Agent> = std::sync::LazyLock::new(|| {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
});

/// The private CAs of control planes served over TLS, by base URL.
static TRUSTED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, moat_client::CaRoots>>,
> = std::sync::LazyLock::new(Default::default);

/// The rig's calls to `base` trust only the CAs in the PEM file `ca` (a
/// control plane served over TLS with the test's own certificate).
pub fn trust_ca(base: &str, ca: &Path) {
    let roots = moat_client::CaRoots::from_pem_file(ca).unwrap();
    TRUSTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(base.to_owned(), roots);
}

/// The API's own client (`moat-client`, as the operator commands and
/// `moat up` use it): one per control plane and token, keeping its
/// connections as an agent would.
fn client(base: &str, token: &str) -> std::sync::Arc<moat_client::OrgClient> {
    type Clients =
        std::collections::HashMap<(String, String), std::sync::Arc<moat_client::OrgClient>>;
    static CLIENTS: std::sync::LazyLock<std::sync::Mutex<Clients>> =
        std::sync::LazyLock::new(Default::default);
    let mut clients = CLIENTS.lock().unwrap_or_else(|e| e.into_inner());
    let key = (base.to_owned(), token.to_owned());
    std::sync::Arc::clone(clients.entry(key).or_insert_with(|| {
        let trusted = TRUSTED.lock().unwrap_or_else(|e| e.into_inner());
        std::sync::Arc::new(moat_client::OrgClient::with_roots(
            base,
            token,
            Duration::from_secs(60),
            trusted.get(base),
        ))
    }))
}

/// An HTTP call: status and JSON body (`Null` if it has none).
pub fn call(method: &str, url: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    try_call(method, url, token, body).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// [`call`], with a failure to reach the server as an error.
pub fn try_call(
    method: &str,
    url: &str,
    token: &str,
    body: Option<Value>,
) -> Result<(u16, Value), moat_client::ClientError> {
    let split = url
        .find("://")
        .and_then(|scheme| url[scheme + 3..].find('/').map(|path| scheme + 3 + path))
        .unwrap_or(url.len());
    let (base, path) = url.split_at(split);
    let client = client(base, token);
    let answer = match (method, &body) {
        ("GET", _) => client.get_answer(path),
        ("PUT", Some(body)) => client.put_answer(path, body),
        (_, Some(body)) => client.post_answer(path, body),
        (_, None) => client.post_empty_answer(path),
    }?;
    Ok((
        answer.status,
        serde_json::from_slice(&answer.body).unwrap_or(Value::Null),
    ))
}

/// `GET url` without credentials: the status and the body as text.
pub fn get_text(url: &str) -> (u16, String) {
    let mut response = AGENT.get(url).call().unwrap();
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().unwrap())
}

/// The whole body of a server-sent event stream (read until it ends).
pub fn stream_text(url: &str, token: &str) -> String {
    stream_text_after(url, token, 0)
}

/// The same, resuming after event `seq` (`Last-Event-ID`).
pub fn stream_text_after(url: &str, token: &str, seq: i64) -> String {
    let mut request = AGENT
        .get(url)
        .header("authorization", &format!("Bearer {token}"));
    if seq > 0 {
        request = request.header("last-event-id", &seq.to_string());
    }
    let mut response = request.call().unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.body_mut().read_to_string().unwrap()
}

pub fn download(url: &str, token: &str) -> (u16, Vec<u8>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .get(url)
        .header("authorization", &format!("Bearer {token}"))
        .call()
        .unwrap();
    (
        response.status().as_u16(),
        response.body_mut().read_to_vec().unwrap(),
    )
}

/// An org on `serve`: its API token.
pub fn org(serve: &Serve, name: &str) -> String {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/orgs", serve.url),
        ADMIN,
        Some(json!({"name": name})),
    );
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_owned()
}

/// Publishes the manifest and allowlists the runner build for the org.
pub fn prepare_org(serve: &Serve, setup: &Setup, token: &str) {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/manifests", serve.url),
        token,
        Some(setup.signed.clone()),
    );
    assert_eq!(status, 201, "{body}");
    let build = json!({"sha256": setup.runner_hash, "label": "test build"});
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runner-builds", serve.url),
        token,
        Some(build),
    );
    assert_eq!(status, 201, "{body}");
}

/// A sealed runner process, registered with a fresh bootstrap token.
pub struct Runner {
    pub child: Child,
    pub state: PathBuf,
}

impl Runner {
    pub fn start(serve: &Serve, setup: &Setup, token: &str, name: &str) -> Runner {
        Self::start_with(serve, setup, token, name, &[])
    }

    /// `start` with more flags for `moat runner start` (`--resolve`...).
    pub fn start_with(
        serve: &Serve,
        setup: &Setup,
        token: &str,
        name: &str,
        extra: &[&str],
    ) -> Runner {
        Self::spawn(serve, setup, token, name, None, extra, None)
    }

    /// `start_with`, its standard error written to `log` (what an operator
    /// reads: which runs it claimed, and how).
    pub fn start_logged(
        serve: &Serve,
        setup: &Setup,
        token: &str,
        name: &str,
        extra: &[&str],
        log: &Path,
    ) -> Runner {
        Self::spawn(serve, setup, token, name, None, extra, Some(log))
    }

    /// `start` as host user `uid` (no privilege): its token file and state
    /// directory are given to that user first.
    pub fn start_as(serve: &Serve, setup: &Setup, token: &str, name: &str, uid: u32) -> Runner {
        Self::spawn(serve, setup, token, name, Some(uid), &[], None)
    }

    fn spawn(
        serve: &Serve,
        setup: &Setup,
        token: &str,
        name: &str,
        uid: Option<u32>,
        extra: &[&str],
        log: Option<&Path>,
    ) -> Runner {
        let (status, body) = call(
            "POST",
            &format!("{}/v1/bootstrap-tokens", serve.url),
            token,
            Some(json!({})),
        );
        assert_eq!(status, 201, "{body}");
        let token_file = setup.dir.join(format!("{name}.token"));
        std::fs::write(&token_file, body["token"].as_str().unwrap()).unwrap();
        let state = setup.dir.join(name);
        let mut command = super::command_as(path_str(&setup.runner), uid);
        if let Some(uid) = uid {
            std::fs::create_dir(&state).unwrap();
            for path in [&token_file, &state] {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
            }
            // Its sandboxes take the user's own id, not a block of root's.
            command.env_remove("MOAT_UID_RANGE");
        }
        if let Some(log) = log {
            command.stderr(std::fs::File::create(log).unwrap());
        }
        let child = command
            .args(["runner", "start", "--control-plane", &serve.url])
            .args([
                "--bootstrap-token-file",
                path_str(&token_file),
                "--state-dir",
                path_str(&state),
            ])
            .args(extra)
            .spawn()
            .unwrap();
        Runner { child, state }
    }

    /// A sealed runner that registers with the enrolment token in
    /// `token_file` (nothing is spent: every start may use the same file).
    pub fn start_enrolled(setup: &Setup, serve: &Serve, token_file: &Path, name: &str) -> Runner {
        let state = setup.dir.join(name);
        let child = Command::new(&setup.runner)
            .args(["runner", "start", "--control-plane", &serve.url])
            .args([
                "--enrolment-token-file",
                path_str(token_file),
                "--state-dir",
                path_str(&state),
            ])
            .spawn()
            .unwrap();
        Runner { child, state }
    }

    /// Kills the runner and the processes it started (found by its state
    /// directory on their command lines), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for found in host_processes_with(path_str(&self.state)) {
            let pid = found.split(':').next().unwrap_or_default();
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits up to `limit` for `runner`'s process to exit; its status.
pub fn exit_of(runner: &mut Runner, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = runner.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the runner did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A control plane on SQLite in `dir` with org `acme` ready for runs:
/// the setup, the database's URL, the server, and acme's token.
pub fn sqlite_plane(dir: &Path) -> (Setup, String, Serve, String) {
    let setup = setup(dir);
    let db = format!("sqlite:{}", dir.join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    (setup, db, serve, acme)
}

/// The Inspector's page at `path` as the org whose token this is sees it
/// (signed in: its cookie).
pub fn inspector_page(serve: &Serve, token: &str, path: &str) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let mut answer = agent
        .get(&format!("{}{path}", serve.url))
        .header("cookie", &format!("moat_inspector={token}"))
        .call()
        .unwrap();
    assert_eq!(answer.status(), 200, "{path}");
    answer.body_mut().read_to_string().unwrap()
}

/// Approves the approval request `id` (as the org's admin).
pub fn approve(serve: &Serve, token: &str, id: &str) {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/approvals/{id}/approve", serve.url),
        token,
        Some(json!({})),
    );
    assert_eq!(status, 200, "{body}");
}

/// Submits `op` to `run`, which the test policy holds for an approval,
/// and approves it.
pub fn submit_approved(serve: &Serve, token: &str, run: &str, op: Value) {
    let (status, op) = call(
        "POST",
        &format!("{}/v1/runs/{run}/ops", serve.url),
        token,
        Some(op),
    );
    assert_eq!(status, 202, "{op}");
    approve(
        serve,
        token,
        op["approval"]["id"].as_str().expect("an approval"),
    );
}

/// Queues `run` with one input, `input/a.txt`.
pub fn create_run(serve: &Serve, token: &str, run: &str) {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        token,
        Some(json!({"id": run, "inputs": [{"path": "input/a.txt", "content": "abc\n"}]})),
    );
    assert_eq!(status, 201, "{body}");
}

/// The agent ends `run` (`POST .../finish`) and waits until it has succeeded.
pub fn finish_run(serve: &Serve, token: &str, run: &str) {
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs/{run}/finish", serve.url),
        token,
        None,
    );
    assert!(status < 300, "finishing {run}: {status} {body}");
    wait_state(serve, token, run, "succeeded");
}

pub fn envelope(id: &str, op: &str, args: Value) -> Value {
    json!({"id": id, "op": op, "args": args})
}

/// Submits an operation and waits (up to 2 minutes: the suite runs tests
/// side by side on two cores) for its result.
pub fn post_op(serve: &Serve, token: &str, run: &str, env: Value) -> (u16, Value) {
    let id = env["id"].as_str().unwrap_or_default().to_owned();
    let (status, mut op) = call(
        "POST",
        &format!("{}/v1/runs/{run}/ops?wait_ms=20000", serve.url),
        token,
        Some(env),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while status == 200 && matches!(op["state"].as_str(), Some("queued" | "dispatched")) {
        assert!(
            Instant::now() < deadline,
            "operation {id} never finished: {op}"
        );
        let url = format!("{}/v1/runs/{run}/ops/{id}?wait_ms=20000", serve.url);
        op = call("GET", &url, token, None).1;
    }
    (status, op)
}

/// Runs `python3 -c script` as operation `id` of `run` and waits until it
/// has succeeded; returns the operation.
pub fn python_op(serve: &Serve, token: &str, run: &str, id: &str, script: &str) -> Value {
    let argv = json!({"argv": ["/usr/bin/python3", "-c", script]});
    let (status, op) = post_op(serve, token, run, envelope(id, "exec_argv", argv));
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("succeeded")),
        "{op}"
    );
    op
}

pub fn run_state(serve: &Serve, token: &str, run: &str) -> String {
    let (_, body) = call("GET", &format!("{}/v1/runs/{run}", serve.url), token, None);
    body["state"].as_str().unwrap_or_default().to_owned()
}

pub fn wait_state(serve: &Serve, token: &str, run: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let state = run_state(serve, token, run);
        if state == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run {run} stayed {state}, wanted {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn run_events(serve: &Serve, token: &str, run: &str) -> Vec<Value> {
    let (status, body) = call(
        "GET",
        &format!("{}/v1/runs/{run}/events?limit=10000", serve.url),
        token,
        None,
    );
    assert_eq!(status, 200, "{body}");
    let events = body["events"].as_array().unwrap().clone();
    for event in &events {
        super::check_event(event, "GET /v1/runs/{run}/events");
    }
    events
}

/// The first `kind` event of `run`, waiting up to a minute for it (a
/// runner's `run.destroyed` comes after the run's end).
pub fn wait_run_event(serve: &Serve, token: &str, run: &str, kind: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = run_events(serve, token, run)
            .into_iter()
            .find(|e| e["type"] == kind)
        {
            return e;
        }
        assert!(Instant::now() < deadline, "no {kind} event for {run}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

pub fn assert_ledger_intact(serve: &Serve) {
    let (status, body) = call(
        "GET",
        &format!("{}/v1/ledger/verify", serve.url),
        ADMIN,
        None,
    );
    assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
}

/// Signs `dir/manifest.json`, edited, with the same key: a newer manifest.
pub fn resign(setup: &Setup, edit: impl FnOnce(&mut Value)) -> Value {
    let mut bare: Value =
        serde_json::from_str(&std::fs::read_to_string(setup.dir.join("manifest.json")).unwrap())
            .unwrap();
    edit(&mut bare);
    let (bare_path, signed_path) = (
        setup.dir.join("manifest2.json"),
        setup.dir.join("signed2.json"),
    );
    std::fs::write(&bare_path, bare.to_string()).unwrap();
    let _ = std::fs::remove_file(&signed_path);
    let out = Command::new(MOAT)
        .args([
            "manifest",
            "sign",
            "--key",
            path_str(&setup.key),
            "--out",
            path_str(&signed_path),
        ])
        .arg(&bare_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&signed_path).unwrap()).unwrap()
}

/// Waits until the ledger holds an event of `kind`; returns them all.
pub fn wait_event(
    store: &moat_store::Store,
    kind: moat_core::EventType,
) -> Vec<moat_ledger::StoredEvent> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let found: Vec<_> = store
            .all_events(0, 100_000)
            .unwrap()
            .into_iter()
            .filter(|e| e.event.event_type == kind)
            .collect();
        if !found.is_empty() {
            return found;
        }
        assert!(Instant::now() < deadline, "no {} event", kind.as_str());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A P-256 key standing in for a cluster's service-account signing key:
/// its JWKS, and a token for `claims` as the kubelet would project it.
pub struct ClusterKey(ring::signature::EcdsaKeyPair);

impl ClusterKey {
    pub fn new() -> ClusterKey {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        ClusterKey(
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                .unwrap(),
        )
    }

    pub fn jwks(&self) -> Value {
        use base64::Engine as _;
        use ring::signature::KeyPair as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let point = self.0.public_key().as_ref();
        json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
                         "x": b64.encode(&point[1..33]), "y": b64.encode(&point[33..])}]})
    }

    pub fn token(&self, claims: &Value) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let signed = format!(
            "{}.{}",
            b64.encode(json!({"alg": "ES256", "kid": "k1"}).to_string()),
            b64.encode(claims.to_string())
        );
        let signature = self
            .0
            .sign(&ring::rand::SystemRandom::new(), signed.as_bytes())
            .unwrap();
        format!("{signed}.{}", b64.encode(signature.as_ref()))
    }
}

/// A CA of the test's own and a certificate it signed for 127.0.0.1 and
/// localhost, as PEM files in `dir`: (ca.pem, cert.pem, key.pem).
pub fn private_ca(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Moat test private CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "moat control plane");
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (ca, crt, pem_key) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&ca, ca_cert.pem()).unwrap();
    std::fs::write(&crt, cert.pem()).unwrap();
    std::fs::write(&pem_key, key.serialize_pem()).unwrap();
    (ca, crt, pem_key)
}
