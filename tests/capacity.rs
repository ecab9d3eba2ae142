#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Capacity, quotas and placement end to end, with real `moat serve` and
//! sealed runner processes: a runner takes only the CPU and memory it has;
//! an org over its quota waits (or is refused), and the quota frees when a
//! run is torn down or its runner's lease is lost; the placement policy
//! keeps dedicated hosts and separated tenants apart, recording each
//! refusal; an operator drains a runner; the capacity view and its
//! Inspector page (in Chromium) show it all.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::MOAT;
use common::control::*;
use serde_json::{Value, json};

/// Each run reserves one CPU and 256 MiB of its runner.
fn limited(dir: &Path) -> Setup {
    setup_with(dir, |m| {
        m["limits"]["cpuMillis"] = json!(1000);
        m["limits"]["memoryBytes"] = json!(256 * 1024 * 1024);
    })
}

fn run_view(serve: &Serve, token: &str, run: &str) -> Value {
    let (status, body) = call("GET", &format!("{}/v1/runs/{run}", serve.url), token, None);
    assert_eq!(status, 200, "{body}");
    body
}

/// Waits until a runner holds `run`.
fn wait_held(serve: &Serve, token: &str, run: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let view = run_view(serve, token, run);
        if matches!(view["state"].as_str(), Some("claimed" | "running")) {
            return view;
        }
        assert!(Instant::now() < deadline, "run {run} never held: {view}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `run`'s waiting reason contains `want`.
fn wait_waiting(serve: &Serve, token: &str, run: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = run_view(serve, token, run);
        if view["waiting"].as_str().is_some_and(|w| w.contains(want)) {
            assert_eq!(view["state"], "queued", "{view}");
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "run {run} never waited for {want:?}: {view}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn runners(serve: &Serve, token: &str) -> Vec<Value> {
    let (status, body) = call("GET", &format!("{}/v1/runners", serve.url), token, None);
    assert_eq!(status, 200, "{body}");
    body["runners"].as_array().cloned().unwrap_or_default()
}

/// Waits for `n` registered runners of the org; their views.
fn wait_runners(serve: &Serve, token: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = runners(serve, token);
        if all.len() >= n {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "only {} runners: {all:?}",
            all.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn on_host<'a>(all: &'a [Value], host: &str) -> &'a Value {
    all.iter()
        .find(|r| r["hostId"] == host)
        .unwrap_or_else(|| panic!("no runner on {host}: {all:?}"))
}

/// `moat ARGS` against `serve` with the token in `token_file`.
fn moat(serve: &Serve, token_file: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(MOAT)
        .args(args)
        .env("MOAT_CONTROL_PLANE", &serve.url)
        .env("MOAT_TOKEN_FILE", token_file)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_runner_takes_what_it_has_and_a_quota_holds_runs_back_until_freed() {
    let dir = tempfile::tempdir().unwrap();
    let setup = limited(dir.path());
    let db = format!("sqlite:{}", dir.path().join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    // Four slots but one and a half CPUs: one run at a time.
    let mut a = Runner::start_with(
        &serve,
        &setup,
        &acme,
        // (A name no other process's command line contains: kill() goes
        // by it.)
        "runner-a",
        &[
            "--slots",
            "4",
            "--cpus",
            "1.5",
            "--memory",
            "4GiB",
            "--host-id",
            "host-a",
        ],
    );
    create_run(&serve, &acme, "r1");
    create_run(&serve, &acme, "r2");
    wait_held(&serve, &acme, "r1");
    let shown = on_host(&wait_runners(&serve, &acme, 1), "host-a").clone();
    assert_eq!(shown["cpuMillis"], 1500, "{shown}");
    assert_eq!(shown["cpuReserved"], 1000, "{shown}");
    assert_eq!(shown["memoryReserved"], 256 * 1024 * 1024, "{shown}");
    // Long polls come and go; r2 is never taken while r1 holds the CPU.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(run_view(&serve, &acme, "r2")["state"], "queued");
    // r1's teardown frees its reservation: r2 goes.
    finish_run(&serve, &acme, "r1");
    wait_held(&serve, &acme, "r2");

    // The deployment's admin sets a quota of one run at a time; the org's
    // own admin may read it but not raise it.
    let admin_file = &setup.admin;
    let acme_file = dir.path().join("acme-token");
    std::fs::write(&acme_file, &acme).unwrap();
    let (ok, said) = moat(
        &serve,
        admin_file,
        &[
            "orgs",
            "quota",
            "acme",
            "--concurrent-runs",
            "1",
            "--cpu-seconds",
            "3600",
        ],
    );
    assert!(ok, "{said}");
    assert!(said.contains("concurrent runs  1 of 1"), "{said}");
    let (ok, said) = moat(
        &serve,
        &acme_file,
        &["orgs", "quota", "acme", "--concurrent-runs", "9"],
    );
    assert!(!ok && said.contains("401"), "{said}");
    let (ok, said) = moat(&serve, &acme_file, &["orgs", "quota", "acme"]);
    assert!(
        ok && said.contains("quota_exceeded: concurrent_runs 1 of 1"),
        "{said}"
    );

    // A second runner with room to spare changes nothing: r3 waits for
    // the quota, and says so.
    let _b = Runner::start_with(
        &serve,
        &setup,
        &acme,
        "runner-b",
        &["--slots", "2", "--cpus", "4", "--host-id", "host-b"],
    );
    wait_runners(&serve, &acme, 2);
    create_run(&serve, &acme, "r3");
    wait_waiting(
        &serve,
        &acme,
        "r3",
        "quota_exceeded: concurrent_runs 1 of 1",
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(run_view(&serve, &acme, "r3")["state"], "queued");

    // The Inspector's capacity page, in a browser.
    let a_id = on_host(&runners(&serve, &acme), "host-a")["id"]
        .as_str()
        .unwrap()
        .to_owned();
    browse_capacity(&serve, &acme, &a_id);

    // Runner a dies holding r2: its lease lapses, r2 is queued again and
    // takes the org's one place on b; r3 still waits.
    assert_eq!(
        run_view(&serve, &acme, "r2")["attempts"],
        1,
        "an idle run keeps its lease"
    );
    a.kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r2 = wait_held(&serve, &acme, "r2");
        if r2["runnerId"].as_str() != Some(a_id.as_str()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "r2 never left the dead runner: {r2}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(run_view(&serve, &acme, "r3")["state"], "queued");
    let events = run_events(&serve, &acme, "r2");
    assert_eq!(count(&events, "run.lease_expired"), 1, "{events:?}");
    // r2 ends: r3 goes.
    finish_run(&serve, &acme, "r2");
    wait_held(&serve, &acme, "r3");

    // Set to refuse: a new run over quota is turned away, and recorded.
    let (ok, said) = moat(
        &serve,
        admin_file,
        &["orgs", "quota", "acme", "--over", "refuse"],
    );
    assert!(ok, "{said}");
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "r4"})),
    );
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["reason"], "quota_exceeded", "{body}");
    let store = moat_store::Store::open(&db).unwrap();
    let refused = wait_event(&store, moat_core::EventType::RequestRefused);
    assert_eq!(refused[0].event.data["reason"], "quota_exceeded");
    assert!(
        store.run_by_id("r4").unwrap().is_none(),
        "nothing of r4 kept"
    );
    // Cleared: runs go again.
    let (ok, said) = moat(&serve, admin_file, &["orgs", "quota", "acme", "--clear"]);
    assert!(ok && said.contains("no quota"), "{said}");
    create_run(&serve, &acme, "r5");
    wait_held(&serve, &acme, "r5");
    assert_ledger_intact(&serve);
}

/// The org's capacity page in Chromium, with `runner` on host-a holding
/// one run of a 1.5-CPU budget, and the quota reached.
fn browse_capacity(serve: &Serve, token: &str, runner: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        root.join("tests/inspector/node_modules/playwright-core")
            .is_dir(),
        "playwright-core is not installed: (cd tests/inspector && npm ci), as tests/suite.sh does"
    );
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: apt-get install chromium, as tests/suite.sh does"
    );
    let shots = root.join("target/inspector-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let out = Command::new("node")
        .arg(root.join("tests/inspector/capacity.mjs"))
        .env("MOAT_URL", &serve.url)
        .env("MOAT_TOKEN", token)
        .env("MOAT_RUNNER", runner)
        .env("MOAT_HOST", "host-a")
        .env("MOAT_SHOTS", &shots)
        .output()
        .expect("node (the machine's Node.js)");
    assert!(
        out.status.success(),
        "the capacity page:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// acme only on hosts dedicated to it; globex and initech never together.
const PLACEMENT: &str = r#"
permit(principal, action == Moat::Action::"place", resource);

@id("dedicated-hosts")
@reason("the host is dedicated to another org")
forbid(principal, action == Moat::Action::"place", resource)
when { resource.labels has dedicated && resource.labels.dedicated != principal.name };

@id("globex-initech-apart")
@reason("globex and initech never share a host")
forbid(principal, action == Moat::Action::"place", resource)
when { ["globex", "initech"].contains(principal.name)
       && (context.tenants.contains("globex") || context.tenants.contains("initech")) };
"#;

/// On both backends: the claim reads the host's other tenants in SQL of
/// its own on each (on PostgreSQL with what the runner holds).
#[test]
fn placement_keeps_dedicated_hosts_and_separated_tenants_apart_and_a_drain_stops_a_runner() {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup(dir.path());
    let policy = dir.path().join("placement.cedar");
    std::fs::write(&policy, PLACEMENT).unwrap();
    for db in databases(dir.path()) {
        let backend = if db.url.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        };
        placement_on(dir.path(), &setup, &policy, &db.url, backend);
    }
}

fn placement_on(dir: &Path, setup: &Setup, policy: &Path, db: &str, backend: &str) {
    let serve = Serve::start_with(
        setup,
        db,
        "127.0.0.1:0",
        &["--placement-policy", policy.to_str().unwrap()],
    );
    let tokens: Vec<String> = ["acme", "globex", "initech"]
        .iter()
        .map(|name| {
            let token = org(&serve, name);
            prepare_org(&serve, setup, &token);
            token
        })
        .collect();
    let (acme, globex, initech) = (&tokens[0], &tokens[1], &tokens[2]);
    let dedicated = ["--host-id", "host-1", "--label", "dedicated=acme"];
    // Each backend's runners have state directories of their own.
    let name = |n: &str| format!("{n}-{backend}");
    let _acme_1 = Runner::start_with(&serve, setup, acme, &name("acme-1"), &dedicated);
    let mut globex_1 = Runner::start_with(&serve, setup, globex, &name("globex-1"), &dedicated);
    let _globex_2 = Runner::start_with(
        &serve,
        setup,
        globex,
        &name("globex-2"),
        &["--host-id", "host-2"],
    );
    let _initech_2 = Runner::start_with(
        &serve,
        setup,
        initech,
        &name("initech-2"),
        &["--host-id", "host-2"],
    );
    wait_runners(&serve, globex, 2);
    wait_runners(&serve, initech, 1);
    wait_runners(&serve, acme, 1);

    // acme's run goes to its dedicated host.
    create_run(&serve, acme, "a1");
    wait_held(&serve, acme, "a1");

    // globex's run is refused on host-1 (recorded once, with the reason)
    // and goes to host-2.
    create_run(&serve, globex, "g1");
    let g1 = wait_held(&serve, globex, "g1");
    let globex_runners = runners(&serve, globex);
    assert_eq!(
        g1["runnerId"],
        on_host(&globex_runners, "host-2")["id"],
        "{g1}"
    );

    // initech's run may not join globex on host-2: it waits, saying why,
    // and the refusal is in its ledger.
    create_run(&serve, initech, "i1");
    wait_waiting(
        &serve,
        initech,
        "i1",
        "placement_waiting: globex and initech never share a host",
    );
    let events = run_events(&serve, initech, "i1");
    let denied: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "run.placement_denied")
        .collect();
    assert_eq!(denied.len(), 1, "recorded once: {events:?}");
    assert_eq!(denied[0]["data"]["hostId"], "host-2");
    assert_eq!(
        denied[0]["data"]["policies"],
        json!(["globex-initech-apart"])
    );
    assert_eq!(count(&events, "run.claimed"), 0);

    // The capacity view: the deployment's admin sees every tenant; an
    // org's admin, its own runners and only a count of the others.
    let (status, all) = call("GET", &format!("{}/v1/capacity", serve.url), ADMIN, None);
    assert_eq!(status, 200, "{all}");
    let host = |view: &Value, id: &str| -> Value {
        view["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["hostId"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no {id}: {view}"))
    };
    assert_eq!(host(&all, "host-1")["tenants"], json!(["acme"]), "{all}");
    assert_eq!(host(&all, "host-2")["tenants"], json!(["globex"]), "{all}");
    assert_eq!(host(&all, "host-2")["runners"].as_array().unwrap().len(), 2);
    let (status, mine) = call("GET", &format!("{}/v1/capacity", serve.url), initech, None);
    assert_eq!(status, 200, "{mine}");
    assert_eq!(mine["hosts"].as_array().unwrap().len(), 1, "{mine}");
    let seen = host(&mine, "host-2");
    assert_eq!(seen["tenants"], json!([]), "{mine}");
    assert_eq!(seen["otherTenants"], 1, "{mine}");
    assert_eq!(seen["runners"].as_array().unwrap().len(), 1, "{mine}");
    assert!(!mine.to_string().contains("globex"), "{mine}");

    // globex leaves host-2: initech's run goes there.
    finish_run(&serve, globex, "g1");
    let i1 = wait_held(&serve, initech, "i1");
    assert!(i1.get("waiting").is_none(), "{i1}");

    // A globex run meanwhile waits: host-1 is acme's, host-2 has initech.
    create_run(&serve, globex, "g2");
    wait_waiting(&serve, globex, "g2", "placement_waiting:");

    // The operator drains globex's runner on host-1: it stops (exit 0),
    // and the registry says it is draining.
    let globex_1_id = on_host(&globex_runners, "host-1")["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let token_file = dir.join(format!("globex-token-{backend}"));
    std::fs::write(&token_file, globex).unwrap();
    let (ok, said) = moat(&serve, &token_file, &["runner", "drain", &globex_1_id]);
    assert!(ok, "{said}");
    assert!(said.contains("is draining"), "{said}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = globex_1.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the drained runner did not stop");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    let drained = on_host(&runners(&serve, globex), "host-1").clone();
    assert_eq!(drained["draining"], true, "{drained}");
    // Another org's admin cannot drain it, nor learn it exists.
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runners/{globex_1_id}/drain", serve.url),
        acme,
        Some(json!({})),
    );
    assert_eq!(status, 404, "{body}");
    assert_ledger_intact(&serve);
}
