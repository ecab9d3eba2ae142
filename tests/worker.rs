#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The `worker` class through `moat exec --class worker`: Python and
//! JavaScript components (built here by `moat worker build` from
//! tests/worker/guest.py and reverser.js, with componentize-py and jco) run
//! by wasmtime inside a namespace sandbox. Their file opens are refused
//! and recorded, a loop ends by the deadline with `process.timeout`,
//! memory past the limit fails cleanly, and the `inputs` and `outputs`
//! bindings serve only what was granted, every call recorded.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use common::{Canary, Run, exec, host_processes_with};

/// `moat worker build SOURCE` of a guest of tests/worker, into the test's
/// own directory under target/; the component's path.
fn build(source: &str) -> PathBuf {
    let python = std::env::var("MOAT_TEST_COMPONENTIZE_PY").expect(
        "MOAT_TEST_COMPONENTIZE_PY is not set: run the suite with `bash tests/suite.sh`, \
         which installs componentize-py into target/worker-venv",
    );
    let jco = std::env::var("MOAT_TEST_JCO").expect(
        "MOAT_TEST_JCO is not set: run the suite with `bash tests/suite.sh`, which installs \
         jco into tests/worker/node_modules",
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("worker-guests");
    std::fs::create_dir_all(&out_dir).expect("guest dir");
    let copy = out_dir.join(source);
    std::fs::copy(root.join("tests/worker").join(source), &copy).expect("guest source");
    let output = Command::new(common::MOAT)
        .args(["worker", "build"])
        .arg(&copy)
        .env("MOAT_COMPONENTIZE_PY", python)
        .env("MOAT_JCO", jco)
        .output()
        .expect("running moat worker build");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "moat worker build {source}: {}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let wasm = copy.with_extension("wasm");
    // It says what it built, by hash.
    let hash = sha256_of(&wasm);
    assert!(stdout.contains(&format!("sha256 {hash}")), "{stdout}");
    wasm
}

fn sha256_of(path: &std::path::Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(
        std::fs::read(path).expect("component"),
    ))
}

/// The Python guest, built once per test binary.
fn guest() -> &'static PathBuf {
    static GUEST: OnceLock<PathBuf> = OnceLock::new();
    GUEST.get_or_init(|| build("guest.py"))
}

/// The JavaScript guest, built once per test binary.
fn js_guest() -> &'static PathBuf {
    static GUEST: OnceLock<PathBuf> = OnceLock::new();
    GUEST.get_or_init(|| build("reverser.js"))
}

/// One worker at a time: a test checks that no runtime is left once its
/// run ended, and two cold compiles on two cores only slow each other.
static ONE_WORKER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn worker(args: &[&str], guest_args: &[&str]) -> Run {
    let module = guest().display().to_string();
    let _one = ONE_WORKER.lock().unwrap_or_else(|e| e.into_inner());
    let mut all = vec!["--class", "worker"];
    all.extend_from_slice(args);
    let mut program = vec![module.as_str()];
    program.extend_from_slice(guest_args);
    let run = exec(&all, &program);
    assert!(
        host_processes_with("/moat/moat-worker").is_empty(),
        "a worker runtime was left running"
    );
    run
}

#[test]
fn a_worker_runs_a_python_component_with_its_arguments_in_the_worker_class() {
    let run = worker(&[], &["greets", "you"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("hello from a worker, greets you"),
        "{}",
        run.stdout
    );
    assert_eq!(run.report["class"], "worker");
    let worker = &run.report["worker"];
    assert_eq!(worker["ended"], "exited");
    assert_eq!(worker["moduleSha256"].as_str().map(str::len), Some(64));
    let started = run.events_of("sandbox.exec.started");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["data"]["class"], "worker");
    // The component and its two arguments, never the runtime's own.
    assert_eq!(started[0]["data"]["argc"], 3);
    // The runtime itself ran in a namespace sandbox, every layer applied.
    common::assert_all_layers_enforced(&run);
}

#[test]
fn a_worker_that_opens_a_host_file_is_refused_and_the_denial_is_recorded() {
    let canary = Canary::plant();
    let path = canary.path.display().to_string();
    let run = worker(&[], &["open", &path]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("refused:"), "{}", run.stdout);
    assert!(!run.stdout.contains(&canary.content), "{}", run.stdout);
    let denied = run
        .events_of("sandbox.violation")
        .into_iter()
        .find(|e| e["data"]["object"] == path.as_str())
        .unwrap_or_else(|| panic!("no denial of {path}: {:?}", run.events));
    assert_eq!(denied["data"]["layer"], "wasi");
    assert_eq!(denied["data"]["access"], "fs.open");
    let violations = run.report["violations"].as_array().expect("violations");
    assert!(violations.iter().any(|v| v["object"] == path.as_str()));
    canary.assert_intact();
}

#[test]
fn a_worker_in_an_endless_loop_ends_by_its_deadline_with_process_timeout() {
    let run = worker(&["--timeout", "2s"], &["loop"]);
    assert_eq!(run.code, 124, "{}", run.stderr);
    assert_eq!(run.report["timedOut"], true);
    assert_eq!(run.report["worker"]["ended"], "timedOut");
    let timeout = run.events_of("process.timeout");
    assert_eq!(timeout.len(), 1, "{:?}", run.events);
    assert_eq!(timeout[0]["data"]["timeoutMs"], 2000);
    assert_eq!(timeout[0]["data"]["killed"], "worker invocation");
    assert!(run.stderr.contains("deadline"), "{}", run.stderr);
}

#[test]
fn a_worker_allocating_past_its_memory_limit_fails_cleanly() {
    let run = worker(&["--memory", "64M"], &["memory"]);
    assert_eq!(run.code, 137, "{}", run.stderr);
    let worker = &run.report["worker"];
    assert_eq!(worker["ended"], "memoryExceeded");
    assert_eq!(worker["memoryLimitBytes"], 64 << 20);
    let peak = worker["peakMemoryBytes"].as_u64().expect("peak");
    assert!(peak <= 64 << 20, "{peak}");
    assert!(run.stderr.contains("memory limit"), "{}", run.stderr);
    // The limit is the guest's: the runtime and its sandbox were fine.
    assert_eq!(run.report["oomKilled"], false);
}

#[test]
fn a_worker_reads_its_inputs_and_writes_its_outputs_through_bindings_each_call_recorded() {
    let input = tempfile::tempdir().expect("inputs");
    let output = tempfile::tempdir().expect("outputs");
    std::fs::write(input.path().join("in.txt"), "some text").expect("input");
    let canary = Canary::plant();
    // A link out of the inputs is not followed.
    std::os::unix::fs::symlink(&canary.path, input.path().join("link")).expect("link");
    common::make_world_accessible(input.path());
    common::make_world_accessible(output.path());
    let (i, o) = (
        common::path_str(input.path()),
        common::path_str(output.path()),
    );
    let run = worker(&["--input", i, "--output", o], &["io", "in.txt"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("listed: in.txt"), "{}", run.stdout);
    assert!(
        run.stdout.contains("escape: BindingError_InvalidName"),
        "{}",
        run.stdout
    );
    let written = std::fs::read_to_string(output.path().join("result/in.txt")).expect("output");
    assert_eq!(written, "SOME TEXT");
    let calls: Vec<(String, String, String)> = run
        .events_of("worker.binding")
        .iter()
        .map(|e| {
            let d = &e["data"];
            let name = d["name"].as_str().unwrap_or("").to_owned();
            (
                format!(
                    "{}.{}",
                    d["binding"].as_str().unwrap(),
                    d["call"].as_str().unwrap()
                ),
                name,
                d["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expect = |call: &str, name: &str, outcome: &str| {
        (call.to_owned(), name.to_owned(), outcome.to_owned())
    };
    assert_eq!(
        calls,
        vec![
            expect("inputs.names", "", "ok"),
            expect("inputs.read", "in.txt", "ok"),
            expect("outputs.write", "result/in.txt", "ok"),
            expect("inputs.read", "../escape", "invalid-name"),
        ]
    );
    // Reading the link is refused: no link is followed.
    let run = worker(&["--input", i], &["io", "link"]);
    assert!(
        run.stdout.contains("refused: BindingError_InvalidName"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains(&canary.content));
    canary.assert_intact();
    // Without --output, writing is refused and recorded.
    let run = worker(&["--input", i], &["io", "in.txt"]);
    assert!(
        run.stdout.contains("refused: BindingError_NotGranted"),
        "{}",
        run.stdout
    );
    let refused = run.events_of("worker.binding");
    assert!(
        refused
            .iter()
            .any(|e| e["data"]["binding"] == "outputs" && e["data"]["outcome"] == "not-granted"),
        "{refused:?}"
    );
}

#[test]
fn a_workers_kv_writes_and_queue_sends_are_effects_made_only_for_what_was_granted() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().expect("dir");
    let hello = base64::engine::general_purpose::STANDARD.encode("hello");
    let snapshot = dir.path().join("kv.json");
    std::fs::write(
        &snapshot,
        format!(r#"{{"namespaces": {{"config": {{"greeting": "{hello}"}}}}}}"#),
    )
    .expect("snapshot");
    let effects = dir.path().join("effects.json");
    common::make_world_accessible(dir.path());
    let (kv, out) = (common::path_str(&snapshot), common::path_str(&effects));
    let run = worker(&["--kv", kv, "--queue", "next", "--effects", out], &["kv"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    for line in [
        "greeting: hello",
        "seen: yes",
        "keys: greeting,seen",
        // Another namespace, another queue: neither was granted.
        "refused: BindingError_NotGranted\nrefused: BindingError_NotGranted",
    ] {
        assert!(run.stdout.contains(line), "{line}: {}", run.stdout);
    }
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&effects).expect("effects")).expect("json");
    assert_eq!(
        written,
        serde_json::json!({
            "kv": [{"namespace": "config", "key": "seen",
                    "value": base64::engine::general_purpose::STANDARD.encode("yes")}],
            "sends": [{"queue": "next", "body": {"said": "hello"}, "idempotencyKey": "once"}],
        })
    );
    let calls: Vec<String> = run
        .events_of("worker.binding")
        .iter()
        .map(|e| {
            let d = &e["data"];
            format!(
                "{}.{} {}",
                d["binding"].as_str().unwrap(),
                d["call"].as_str().unwrap(),
                d["outcome"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            "kv.get ok",
            "kv.set ok",
            "kv.get ok",
            "kv.keys ok",
            "queue.send ok",
            "kv.get not-granted",
            "queue.send not-granted"
        ]
    );
    // Without --effects there is nowhere for them to go: refused up front.
    let run = worker(&["--kv", kv], &["kv"]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("--effects"), "{}", run.stderr);
}

#[test]
fn a_worker_reaches_only_allowlisted_domains_through_its_http_binding_and_the_proxy_records_it() {
    let server = common::servers::Server::http();
    let port = server.port;
    let allowed = format!("http://app.test:{port}/hello?token=kept-out-of-the-record");
    let other = format!("http://other.test:{port}/");
    let allow = format!("app.test:{port}");
    let run = worker(
        &[
            "--network",
            "allowlist",
            "--allow-domain",
            &allow,
            "--allow-address",
            "127.0.0.1",
            "--resolve",
            "app.test=127.0.0.1",
            "--resolve",
            "other.test=127.0.0.1",
        ],
        &["fetch", &allowed, &other],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let body = common::servers::HTTP_BODY.trim();
    assert!(
        run.stdout
            .contains(&format!("fetched: {allowed} 200  {body}")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains(&format!("fetched: {other} 403 domain_not_allowed")),
        "{}",
        run.stdout
    );
    // The proxy refused other.test before any connection: one request arrived.
    assert_eq!(server.count(), 1, "{:?}", server.seen());
    let denied = run.events_of("network.denied");
    assert!(
        denied
            .iter()
            .any(|e| e["data"]["reason"] == "domain_not_allowed"
                && e["data"]["host"] == "other.test"),
        "{denied:?}"
    );
    let fetches: Vec<&str> = run
        .events_of("worker.binding")
        .iter()
        .filter(|e| e["data"]["binding"] == "http")
        .filter_map(|e| e["data"]["name"].as_str())
        .collect();
    assert_eq!(
        fetches,
        [
            format!("GET http://app.test:{port}/hello"),
            format!("GET {other}")
        ]
    );
    assert!(
        !run.events
            .iter()
            .any(|e| e.to_string().contains("kept-out-of-the-record"))
    );
    // Without the allowlist, the binding is not granted and nothing is sent.
    let run = worker(&[], &["fetch", &allowed]);
    assert!(run.stdout.contains("refused:"), "{}", run.stdout);
    assert!(
        run.stdout.contains("BindingError_NotGranted"),
        "{}",
        run.stdout
    );
    assert_eq!(server.count(), 1);
}

#[test]
fn a_javascript_component_built_with_moat_worker_build_uses_the_same_bindings() {
    let wasm = js_guest().clone();
    let input = tempfile::tempdir().expect("inputs");
    let output = tempfile::tempdir().expect("outputs");
    std::fs::write(input.path().join("word.txt"), "stressed").expect("input");
    common::make_world_accessible(input.path());
    common::make_world_accessible(output.path());
    let (i, o) = (
        common::path_str(input.path()),
        common::path_str(output.path()),
    );
    let module = wasm.display().to_string();
    let _one = ONE_WORKER.lock().unwrap_or_else(|e| e.into_inner());
    let run = exec(
        &["--class", "worker", "--input", i, "--output", o],
        &[&module],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("hello from javascript, reversed word.txt"),
        "{}",
        run.stdout
    );
    let written = std::fs::read_to_string(output.path().join("reversed.txt")).expect("output");
    assert_eq!(written, "desserts");
    assert_eq!(
        run.report["worker"]["moduleSha256"],
        sha256_of(&wasm).as_str()
    );
    let calls: Vec<&str> = run
        .events_of("worker.binding")
        .iter()
        .filter_map(|e| e["data"]["call"].as_str())
        .collect();
    // It asks first whether a queue started it: none did.
    assert_eq!(calls, ["message", "names", "read", "write"]);
}

#[test]
fn moat_worker_build_refuses_what_it_cannot_build_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rust = dir.path().join("main.rs");
    std::fs::write(&rust, "fn main() {}").expect("source");
    let output = Command::new(common::MOAT)
        .args(["worker", "build"])
        .arg(&rust)
        .output()
        .expect("moat worker build");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("Python (.py) or JavaScript"));
    // A Python guest that does not build: the tool's error, no component.
    let broken = dir.path().join("broken.py");
    std::fs::write(&broken, "this is not python(").expect("source");
    let output = Command::new(common::MOAT)
        .args(["worker", "build"])
        .arg(&broken)
        .env(
            "MOAT_COMPONENTIZE_PY",
            std::env::var("MOAT_TEST_COMPONENTIZE_PY").expect("MOAT_TEST_COMPONENTIZE_PY"),
        )
        .output()
        .expect("moat worker build");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("componentize-py failed"));
    assert!(!dir.path().join("broken.wasm").exists());
    // A missing tool is named.
    let js = dir.path().join("x.js");
    std::fs::write(&js, "export const run = { run() {} };").expect("source");
    let output = Command::new(common::MOAT)
        .args(["worker", "build", "--jco", "/nonexistent/jco"])
        .arg(&js)
        .output()
        .expect("moat worker build");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("running /nonexistent/jco"), "{stderr}");
    assert!(!dir.path().join("x.wasm").exists());
}

#[test]
fn a_worker_refuses_flags_that_would_give_a_component_directories_or_network() {
    let module = guest().display().to_string();
    for extra in [
        vec!["--workspace", "/tmp"],
        vec!["--ro", "/tmp"],
        vec!["--network", "full"],
        vec!["--env", "HOME"],
    ] {
        let mut args = vec!["--class", "worker"];
        args.extend(extra.iter().copied());
        let run = exec(&args, &[module.as_str()]);
        assert_eq!(run.code, 2, "{extra:?}: {}", run.stderr);
        assert!(run.stderr.contains("--class worker"), "{}", run.stderr);
    }
    // A core module (not a component) is refused before anything starts.
    let dir = tempfile::tempdir().expect("tempdir");
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").expect("core module");
    let run = exec(&["--class", "worker"], &[core.to_str().expect("utf-8")]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("not a component"), "{}", run.stderr);
}

/// A message's view once `done(view)` holds (polled, 2 minutes at most).
fn wait_message(
    url: &str,
    token: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let (status, view) = common::control::call("GET", url, token, None);
        assert_eq!(status, 200, "{view}");
        if done(&view) {
            return view;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the message never got there: {view}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The events of a run, through the API.
fn run_events(url: &str, token: &str, run: &str) -> Vec<serde_json::Value> {
    let (status, page) =
        common::control::call("GET", &format!("{url}/v1/runs/{run}/events"), token, None);
    assert_eq!(status, 200, "{page}");
    page["events"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_queue_chain_runs_python_then_javascript_through_moat_up_with_retries_dead_letters_and_idempotency()
 {
    use base64::Engine as _;
    use common::control::{call, download};
    use serde_json::json;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let python = std::fs::read(guest()).expect("python guest");
    let javascript = std::fs::read(js_guest()).expect("javascript guest");
    // The other tests check that no runtime outlives their run.
    let _one = ONE_WORKER.lock().unwrap_or_else(|e| e.into_inner());
    let home = tempfile::tempdir().expect("home");
    let listen = format!("127.0.0.1:{}", common::free_port());
    let (up, _, errors) = common::up::start_up(home.path(), &["--listen", &listen]);
    let dir = home.path().join("state/moat/up");
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .expect(name)
            .trim()
            .to_owned()
    };
    let (agent, admin) = (read("agent-token"), read("org-admin-token"));
    let url = format!("http://{listen}");

    // The second link: JavaScript, reversing what it is sent into kv.
    let (status, body) = call(
        "PUT",
        &format!("{url}/v1/queues/reverse"),
        &admin,
        Some(json!({"moduleBase64": b64(&javascript), "kv": ["results"]})),
    );
    assert_eq!(status, 200, "{body}");
    // The first: Python, reading a kv key and an input, writing an
    // output and sending to the second. Fast retries for the test.
    let (status, body) = call(
        "PUT",
        &format!("{url}/v1/queues/start"),
        &admin,
        Some(json!({
            "moduleBase64": b64(&python), "args": ["chain"],
            "inputs": [{"path": "input/note.txt", "content": "the note\n"}],
            "kv": ["config"], "sendTo": ["reverse"], "maxAttempts": 3, "backoffMs": 100,
        })),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["moduleSha256"], sha256_of(guest()));
    // An agent may not define a consumer (a component's preamble is
    // enough to ask).
    let (status, _) = call(
        "PUT",
        &format!("{url}/v1/queues/other"),
        &agent,
        Some(json!({"moduleBase64": b64(b"\0asm\x0d\0\x01\0")})),
    );
    assert_eq!(status, 403);

    // Sent twice with one idempotency key: queued once.
    let send = json!({"body": {"name": "Ada"}, "idempotencyKey": "first"});
    let (status, first) = call(
        "POST",
        &format!("{url}/v1/queues/start/messages"),
        &agent,
        Some(send.clone()),
    );
    assert_eq!(status, 201, "{first}");
    let (status, again) = call(
        "POST",
        &format!("{url}/v1/queues/start/messages"),
        &agent,
        Some(send),
    );
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["duplicate"], true);
    let id = first["message"]["id"].as_str().expect("id").to_owned();
    assert_eq!(again["message"]["id"], id.as_str());
    let message_url = format!("{url}/v1/queues/start/messages/{id}");

    // No greeting in kv yet: each invocation exits 3; after 3 it is dead.
    let dead = wait_message(&message_url, &agent, |m| m["state"] == "dead");
    assert_eq!(dead["attempts"], 3, "{dead}");
    assert!(
        dead["lastError"]
            .as_str()
            .unwrap_or("")
            .contains("the worker exited with status 1"),
        "{dead}"
    );
    let (status, listed) = call(
        "GET",
        &format!("{url}/v1/queues/start/messages?state=dead"),
        &agent,
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(
        listed["messages"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    // The failed attempt's run: the worker class, its binding calls
    // recorded, the message's step on the record, and no send made.
    let failed_run = dead["runId"].as_str().expect("run").to_owned();
    let (_, view) = call("GET", &format!("{url}/v1/runs/{failed_run}"), &agent, None);
    assert_eq!(
        view["state"], "failed",
        "the delivery run ends as its invocation: {view}"
    );
    let events = run_events(&url, &agent, &failed_run);
    let of = |events: &[serde_json::Value], kind: &str| -> Vec<serde_json::Value> {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .cloned()
            .collect()
    };
    let granted = of(&events, "capability.granted");
    assert_eq!(granted[0]["data"]["class"], "worker", "{granted:?}");
    assert!(
        of(&events, "worker.binding")
            .iter()
            .any(|e| e["data"]["binding"] == "kv" && e["data"]["outcome"] == "not-found"),
        "{events:?}"
    );
    let steps = of(&events, "queue.message");
    assert!(
        steps
            .iter()
            .any(|e| e["data"]["state"] == "deadLettered" && e["data"]["attempt"] == 3),
        "{steps:?}"
    );
    let (_, reversed_queue) = call(
        "GET",
        &format!("{url}/v1/queues/reverse/messages"),
        &agent,
        None,
    );
    assert_eq!(
        reversed_queue["messages"],
        json!([]),
        "a failed invocation sent nothing"
    );

    // Redriving a live message is refused; a dead one is queued again and,
    // with the greeting set, succeeds.
    let (status, body) = call("POST", &format!("{message_url}/redrive"), &agent, None);
    assert_eq!(status, 403, "an agent may not redrive: {body}");
    let agent_put = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build();
    let agent_put: ureq::Agent = agent_put.into();
    let response = agent_put
        .put(&format!("{url}/v1/kv/config/greeting"))
        .header("authorization", &format!("Bearer {agent}"))
        .send(&b"Hello"[..])
        .expect("kv put");
    assert_eq!(response.status().as_u16(), 200);
    let (status, body) = call("POST", &format!("{message_url}/redrive"), &admin, None);
    assert_eq!(status, 200, "{body}");
    let done = wait_message(&message_url, &agent, |m| m["state"] == "done");
    assert_eq!(done["attempts"], 1, "{done}");
    let (status, body) = call("POST", &format!("{message_url}/redrive"), &admin, None);
    assert_eq!(
        (status, body["error"]["reason"].clone()),
        (409, json!("not_dead"))
    );

    // The Python run: its output went through the export boundary.
    let text = "Hello, Ada: the note";
    let python_run = done["runId"].as_str().expect("run").to_owned();
    let (status, artifacts) = call(
        "GET",
        &format!("{url}/v1/runs/{python_run}/artifacts"),
        &agent,
        None,
    );
    assert_eq!(status, 200);
    let promoted = artifacts["artifacts"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|a| a["label"] == "output/greeting.txt" && a["kind"] == "export")
        })
        .cloned()
        .unwrap_or_else(|| panic!("no promoted output/greeting.txt: {artifacts}"));
    let (status, bytes) = download(
        &format!(
            "{url}/v1/artifacts/{}",
            promoted["sha256"].as_str().unwrap_or_default()
        ),
        &agent,
    );
    assert_eq!((status, bytes.as_slice()), (200, text.as_bytes()));
    let events = run_events(&url, &agent, &python_run);
    let calls: Vec<String> = of(&events, "worker.binding")
        .iter()
        .map(|e| {
            format!(
                "{}.{} {}",
                e["data"]["binding"].as_str().unwrap_or(""),
                e["data"]["call"].as_str().unwrap_or(""),
                e["data"]["outcome"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            "queue.message ok",
            "kv.get ok",
            "inputs.read ok",
            "outputs.write ok",
            "queue.send ok"
        ],
        "{events:?}"
    );
    assert!(
        of(&events, "queue.message")
            .iter()
            .any(|e| e["data"]["state"] == "acknowledged" && e["data"]["sends"] == 1),
        "{events:?}"
    );
    assert!(!of(&events, "artifact.promoted").is_empty(), "{events:?}");
    // Compiled on its first delivery, loaded from the runner's cache since.
    let finished = of(&events, "sandbox.exec.finished");
    assert_eq!(finished[0]["data"]["class"], "worker", "{finished:?}");
    assert_eq!(
        finished[0]["data"]["worker"]["compiled"], false,
        "{finished:?}"
    );

    // The Inspector's run page says the class, each binding call and the
    // message's steps.
    let plane = common::control::Serve::attached(&url);
    let page = common::control::inspector_page(&plane, &admin, &format!("/ui/runs/{python_run}"));
    for shown in [
        "data-class=\"worker\"",
        "worker.binding",
        "kv.get config/greeting ok",
        "queue.send reverse ok",
        &format!("queue start message {id} acknowledged"),
    ] {
        assert!(page.contains(shown), "{shown} not on the run page:\n{page}");
    }

    // Replayed: the same component, message and kv snapshot (from the
    // operation's envelope) give the same outputs; nothing is sent again.
    let replayed = Command::new(common::MOAT)
        .args(["replay", &python_run, "--json", "--db"])
        .arg(format!("sqlite:{}", dir.join("moat.db").display()))
        .arg("--policy")
        .arg(dir.join("policy.cedar"))
        .arg("--trusted-key")
        .arg(dir.join("control-plane.pub"))
        .output()
        .expect("moat replay");
    let report: serde_json::Value = serde_json::from_slice(&replayed.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&replayed.stderr)));
    assert_eq!(report["ops"][0]["replayed"], true, "{report:#}");
    assert_eq!(report["ops"][0]["same"], true, "{report:#}");
    assert_eq!(report["diverged"], false, "{report:#}");

    // The JavaScript link ran on the message Python sent.
    let (_, sent) = call(
        "GET",
        &format!("{url}/v1/queues/reverse/messages"),
        &agent,
        None,
    );
    let next = sent["messages"][0]["id"]
        .as_str()
        .expect("sent message")
        .to_owned();
    let reversed = wait_message(
        &format!("{url}/v1/queues/reverse/messages/{next}"),
        &agent,
        |m| m["state"] == "done",
    );
    assert_eq!(reversed["body"], json!({"text": text}));
    let expected: String = text.chars().rev().collect();
    let (status, value) = download(&format!("{url}/v1/kv/results/reversed"), &agent);
    assert_eq!(
        (status, String::from_utf8_lossy(&value).into_owned()),
        (200, expected)
    );
    // The duplicate ran once: one message in the queue, delivered 3 + 1 times.
    let (_, all) = call(
        "GET",
        &format!("{url}/v1/queues/start/messages"),
        &agent,
        None,
    );
    assert_eq!(all["messages"].as_array().map(Vec::len), Some(1), "{all}");
    drop(up);
    let errors = errors.join().expect("stderr");
    assert!(!errors.contains("panicked"), "{errors}");
    assert!(
        host_processes_with("/moat/moat-worker").is_empty(),
        "a worker runtime was left running"
    );
}
