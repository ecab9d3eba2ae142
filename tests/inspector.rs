#![allow(clippy::expect_used, clippy::unwrap_used)]
//! `moat up` and the Inspector, end to end: `moat up --demo` starts the
//! control plane, a sealed runner and the Inspector; a real headless
//! Chromium (Playwright, `tests/inspector/walkthrough.mjs`) signs in, finds
//! the demo run, watches its events arrive live, approves the step waiting
//! for approval, sees it finish and downloads its artifact. Screenshots go
//! to `target/inspector-screenshots/`. Then the ledger is checked for who
//! approved, through which door, and that the chain is intact.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{MOAT, free_port, path_str};
use serde_json::Value;

/// `moat up`, stopped with SIGTERM (by its pid) when dropped.
struct Up {
    child: Child,
    dir: PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = moat_sandbox::process::terminate(self.child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn get(url: &str, token: &str) -> Value {
    let mut response = ureq::get(url)
        .header("authorization", &format!("Bearer {token}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    serde_json::from_slice(&response.body_mut().read_to_vec().unwrap()).unwrap()
}

fn start_up(dir: &Path, port: u16) -> Up {
    let child = Command::new(MOAT)
        .args(["up", "--demo", "--dir", path_str(dir)])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(dir.with_extension("err")).unwrap())
        .spawn()
        .expect("moat up");
    let mut up = Up {
        child,
        dir: dir.to_owned(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let printed = std::fs::read_to_string(dir.with_extension("out")).unwrap_or_default();
        if printed.contains("Stop with Ctrl-C") {
            return up;
        }
        if let Ok(Some(status)) = up.child.try_wait() {
            panic!(
                "moat up exited ({status}): {}",
                std::fs::read_to_string(dir.with_extension("err")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "moat up did not come up in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads a decoy credential, then calls mount and ptrace.
const SNOOP: &str = "import ctypes\n\
    try:\n    open('/root/.aws/credentials').read()\nexcept OSError as e:\n    print('read', e.errno)\n\
    libc = ctypes.CDLL(None)\n\
    print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n\
    print('ptrace', libc.ptrace(0, 0, 0, 0))\n";

/// What the run page lists under that step.
const BLOCKED: [&str; 3] = [
    "tried to read /root/.aws/credentials: denied (landlock fs.read_file)",
    "called mount: denied (seccomp syscall)",
    "called ptrace: denied (seccomp syscall)",
];

#[test]
fn an_operator_approves_a_paused_step_in_the_inspector_and_downloads_its_result() {
    let node_modules = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inspector/node_modules");
    assert!(
        node_modules.join("playwright-core").is_dir(),
        "playwright-core is not installed: (cd tests/inspector && npm ci), as tests/suite.sh does"
    );
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: apt-get install chromium, as tests/suite.sh does"
    );
    // The runner's launcher is root here: with the kernel's audit on, it
    // reads Landlock's refusals too.
    let _audit = common::AuditSetting::set(true);
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("up");
    let port = free_port();
    let up = start_up(&dir, port);
    let url = format!("http://127.0.0.1:{port}");
    let admin = std::fs::read_to_string(dir.join("org-admin-token")).unwrap();
    let admin = admin.trim();

    // The demo's export step waits for a person.
    let deadline = Instant::now() + Duration::from_secs(20);
    let approval = loop {
        let pending = get(&format!("{url}/v1/approvals?state=pending"), admin);
        if let Some(first) = pending["approvals"].as_array().and_then(|a| a.first()) {
            break first.clone();
        }
        assert!(Instant::now() < deadline, "no approval request: {pending}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(approval["rule"], "data-export", "{approval}");
    let run = approval["runId"].as_str().unwrap().to_owned();
    let op = approval["opId"].as_str().unwrap().to_owned();
    // The same queue from a shell.
    let listed = Command::new(MOAT)
        .args(["approvals", "list", "--json"])
        .env("MOAT_CONTROL_PLANE", &url)
        .env("MOAT_TOKEN_FILE", dir.join("org-admin-token"))
        .output()
        .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["approvals"][0]["id"], approval["id"]);

    // The agent adds a step that prints random bytes while the export waits
    // (the demo run finishes by itself once its last step is decided, so
    // this is the agent's last chance); it runs at once.
    let agent_token = std::fs::read_to_string(dir.join("agent-token")).unwrap();
    let exec_step = |id: &str, script: &str| -> Value {
        let body = serde_json::json!({"id": id, "op": "exec_argv",
            "args": {"argv": ["/usr/bin/python3", "-c", script]}});
        let mut answer = ureq::post(&format!("{url}/v1/runs/{run}/ops?wait_ms=20000"))
            .header("authorization", &format!("Bearer {}", agent_token.trim()))
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap();
        let op: Value = serde_json::from_slice(&answer.body_mut().read_to_vec().unwrap()).unwrap();
        assert_eq!(op["state"], "succeeded", "{op}");
        op
    };
    exec_step("random", "import os; print(os.urandom(8).hex())");

    // And a step that goes looking for credentials and tries mount and
    // ptrace: refused, and the run page says what it tried.
    let op_snoop = exec_step("snoop", SNOOP);
    let blocked = &op_snoop["result"]["result"]["blocked"];
    for line in BLOCKED {
        assert!(
            blocked
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b.as_str().unwrap().starts_with(line)),
            "{line}: {op_snoop}"
        );
    }

    // Another run, live and idle, for the walkthrough to cancel.
    let to_cancel = "to-cancel";
    let created = ureq::post(&format!("{url}/v1/runs"))
        .header("authorization", &format!("Bearer {}", agent_token.trim()))
        .header("content-type", "application/json")
        .send(
            serde_json::json!({"id": to_cancel, "inputs": [{"path": "input/a.txt", "content": "a"}]})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);

    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/inspector-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let walk = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inspector/walkthrough.mjs"))
        .env("MOAT_URL", &url)
        .env("MOAT_TOKEN", admin)
        .env("MOAT_RUN", &run)
        .env("MOAT_APPROVAL", approval["id"].as_str().unwrap())
        .env("MOAT_OP", &op)
        .env("MOAT_SHOTS", &shots)
        .env("MOAT_CANCEL_RUN", to_cancel)
        .env("MOAT_BLOCKED_OP", "snoop")
        .env("MOAT_BLOCKED", BLOCKED.join("\n"))
        .output()
        .expect("node (the machine's Node.js)");
    assert!(
        walk.status.success(),
        "walkthrough failed:\n{}\n{}\nmoat up's log: {}",
        String::from_utf8_lossy(&walk.stdout),
        String::from_utf8_lossy(&walk.stderr),
        std::fs::read_to_string(up.dir.join("serve.log")).unwrap_or_default()
    );
    let report: Value = serde_json::from_slice(
        walk.stdout
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(report["ok"], true, "{report}");
    let cancelled = get(&format!("{url}/v1/runs/{to_cancel}"), admin);
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    for name in [
        "01-login.png",
        "04-approved.png",
        "05-run-done.png",
        "08-cancelled.png",
        "09-usage.png",
    ] {
        assert!(shots.join(name).is_file(), "{name} missing");
    }

    // The ledger says who approved, through which door; the artifact the
    // browser downloaded is the run's.
    let events = get(&format!("{url}/v1/runs/{run}/events"), admin);
    let events = events["events"].as_array().unwrap();
    let granted = events
        .iter()
        .find(|e| e["type"] == "approval.granted")
        .expect("approval.granted");
    assert_eq!(granted["opId"], op.as_str());
    assert_eq!(granted["data"]["via"], "inspector");
    assert!(
        granted["data"]["by"]
            .as_str()
            .unwrap()
            .starts_with("token:")
    );
    let artifacts = get(&format!("{url}/v1/runs/{run}/artifacts"), admin);
    assert!(
        artifacts["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["sha256"] == report["artifactSha256"]),
        "{artifacts} / {report}"
    );
    // The Inspector refuses a stranger, and a foreign site's form.
    let plain: ureq::Agent = ureq::Agent::config_builder()
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .into();
    let page = plain.get(&format!("{url}/ui/runs")).call().unwrap();
    assert_eq!(
        (
            page.status().as_u16(),
            page.headers().get("location").map(|l| l.to_str().unwrap())
        ),
        (303, Some("/ui/login"))
    );
    let forged = plain
        .post(&format!(
            "{url}/ui/approvals/{}/approve",
            approval["id"].as_str().unwrap()
        ))
        .header("origin", "http://evil.example")
        .header("cookie", &format!("moat_inspector={admin}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .send("reason=forged")
        .unwrap();
    assert_eq!(
        forged.status().as_u16(),
        403,
        "a cross-site form was accepted"
    );

    // The audit, from the ledger alone: it went beyond its default
    // boundary once, through the Inspector, in a workspace-write sandbox.
    let audited = Command::new(MOAT)
        .args(["audit", &run, "--json", "--db"])
        .arg(format!("sqlite:{}", dir.join("moat.db").display()))
        .output()
        .unwrap();
    assert_eq!(
        audited.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&audited.stderr)
    );
    let audit: Value = serde_json::from_slice(&audited.stdout).unwrap();
    assert_eq!(audit["beyondDefaultBoundary"], true, "{audit}");
    assert_eq!(audit["approvals"][0]["opId"], op.as_str());
    assert_eq!(audit["approvals"][0]["via"], "inspector");
    assert_eq!(
        audit["sandboxModes"],
        serde_json::json!(["workspace-write"])
    );
    assert_eq!(audit["networkModes"], serde_json::json!(["off"]));
    assert!(
        audit["roots"]
            .as_array()
            .unwrap()
            .contains(&"/workspace (ro)".into()),
        "{audit}"
    );
    assert_eq!(
        audit["enforcement"]["seccomp"]["status"], "enforced",
        "{audit}"
    );
    // What the sandbox refused, with the step that tried it.
    let refused: Vec<(String, String)> = audit["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let op = v["opId"].as_str().unwrap().to_owned();
            (op, v["message"].as_str().unwrap().to_owned())
        })
        .collect();
    for line in BLOCKED {
        assert!(
            refused.contains(&("snoop".to_owned(), line.to_owned())),
            "{line}: {refused:?}"
        );
    }
    assert_eq!(audit["evidenceGaps"], serde_json::json!([]), "{audit}");
    assert!(
        audit["ledger"].as_str().unwrap().starts_with("intact"),
        "{audit}"
    );

    // Replay: the same inputs and permissions in a fresh sandbox. The step
    // that printed random bytes (submitted above) diverges; the others,
    // refusals included, do not.
    let replay = |extra: &[&str]| {
        Command::new(MOAT)
            .args(["replay", &run, "--json", "--db"])
            .arg(format!("sqlite:{}", dir.join("moat.db").display()))
            .arg("--policy")
            .arg(dir.join("policy.cedar"))
            .arg("--trusted-key")
            .arg(dir.join("control-plane.pub"))
            .args(extra)
            .output()
            .unwrap()
    };
    let replayed = replay(&[]);
    assert_eq!(
        replayed.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    let report: Value = serde_json::from_slice(&replayed.stdout).unwrap();
    let verdicts: Vec<(String, Value)> = report["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["op"].as_str().unwrap().to_owned(), o["same"].clone()))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("read".to_owned(), Value::Bool(true)),
            ("count".to_owned(), Value::Bool(true)),
            ("summary".to_owned(), Value::Bool(true)),
            ("export".to_owned(), Value::Bool(true)),
            ("random".to_owned(), Value::Bool(false)),
            ("snoop".to_owned(), Value::Bool(true)),
        ],
        "{report:#}"
    );
    // A changed policy is refused unless asked for.
    let mut policy = std::fs::read_to_string(dir.join("policy.cedar")).unwrap();
    policy.push_str("\n// edited after the run\n");
    std::fs::write(dir.join("policy.cedar"), policy).unwrap();
    let refused = replay(&[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("the policy changed"));
    let forced = replay(&["--allow-changed"]);
    assert_eq!(
        forced.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );

    let pid = up.child.id();
    drop(up);
    // Nothing of moat up is left: not the control plane, not the runner.
    let leftovers: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(path_str(&dir)))
        .collect();
    assert!(leftovers.is_empty(), "moat up ({pid}) left {leftovers:?}");
}
