//! `moat up`: everything on one machine in one command — the control plane
//! on embedded SQLite (with the Inspector), a demo org with a signed sample
//! manifest, and one sealed local runner — then it waits until Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine as _;
use clap::Args;
use moat_client::OrgClient;
use moat_core::WorkloadClass;
use moat_core::sign::PrivateKey;
use serde_json::{Value, json};

use crate::files;
use crate::manifest;

const ABOUT: &str = "\
Starts, on this machine: `moat serve` on an embedded SQLite database with the
Inspector, a demo org, a sample manifest signed by a fresh control-plane key
(the default policy, policies/default.cedar, is written beside it for you to
edit), a sealed runner built from this binary and registered with a
single-use bootstrap token. Then it prints the Inspector's address and an
agent's first commands, and serves until Ctrl-C (which stops both).

Everything lives in --dir (kept between runs: the database, the keys, the
tokens, the policy), by default `up/` in your state directory
($MOAT_STATE, else $XDG_STATE_HOME/moat, else ~/.local/state/moat), never
inside a source tree. Tokens are files there, readable by you only.

The runner serves several runs at once (--slots, at least 4): a run that
waits for an approval or for its agent never keeps another from starting.

  moat up                 # then open the printed Inspector URL
  moat up --demo          # also submits a sample run (one step waits for your approval)
  moat up --listen 127.0.0.1:7800 --dir /srv/moat-up   # another port, another place";

/// Start a control plane, a runner and the Inspector on this machine.
#[derive(Args)]
#[command(after_long_help = ABOUT)]
pub struct UpArgs {
    /// Where the database, keys, tokens and runner state live [default:
    /// up/ in the state directory, e.g. ~/.local/state/moat/up].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Address of the control plane and the Inspector.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700")]
    listen: String,
    /// Also submit a sample run.
    #[arg(long)]
    demo: bool,
    /// Runs the local runner serves at once [default: the runner's own
    /// default from CPUs and memory, at least 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    slots: Option<u16>,
    /// Also serve the control plane's Prometheus metrics at
    /// http://ADDR/metrics (runs, ops, refusals, export rejections by rule).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
}

/// The fewest slots `moat up`'s runner gets by default: the demo's run,
/// which waits for a person, and an agent's first runs side by side.
const MIN_SLOTS: u16 = 4;

pub fn main(args: UpArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat up: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Child processes, stopped (by pid) when dropped.
struct Children(Vec<(&'static str, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in self.0.iter_mut().rev() {
            // SIGTERM first: both shut down cleanly on it.
            let _ = moat_sandbox::process::terminate(child.id());
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn secret_file(path: &Path, make: impl FnOnce() -> String) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => return Ok(text.trim().to_owned()),
        // Only a missing file is made anew: replacing an unreadable key
        // would lose every secret sealed with it.
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("{}", path.display()));
        }
        Err(_) => {}
    }
    let value = make();
    files::write_atomic(path, format!("{value}\n").as_bytes(), 0o600)?;
    Ok(value)
}

fn random_token() -> String {
    moat_core::random::new_id("moat_")
}

/// `path` of the control plane at `base` with `token`: the status and the
/// body (`null` if it is not JSON, kept for the error message).
fn call(base: &str, path: &str, token: &str, body: Option<&Value>) -> anyhow::Result<(u16, Value)> {
    let client = OrgClient::new(base, token, Duration::from_secs(30));
    let answer = match body {
        Some(body) => client.post_answer(path, body),
        None => client.get_answer(path),
    }
    .with_context(|| format!("reaching {base}{path}"))?;
    Ok((
        answer.status,
        serde_json::from_slice(&answer.body).unwrap_or(Value::Null),
    ))
}

fn expect(base: &str, path: &str, token: &str, body: &Value, what: &str) -> anyhow::Result<Value> {
    let (status, answer) = call(base, path, token, Some(body))?;
    if !(200..300).contains(&status) {
        bail!("{what}: {status} {answer}");
    }
    Ok(answer)
}

fn run(args: UpArgs) -> anyhow::Result<()> {
    let me = std::env::current_exe().context("finding this binary")?;
    if moat_runner::seal::read_trailer(&me)?.is_some() {
        bail!("this is a sealed runner; run `moat up` with the plain moat binary");
    }
    // Before anything is made: another server on the address would answer
    // our health check and refuse our tokens.
    listen_free(&args.listen)?;
    let given = match args.dir.clone() {
        Some(dir) => dir,
        None => crate::state::dir(None)?.join("up"),
    };
    std::fs::create_dir_all(&given).with_context(|| format!("creating {}", given.display()))?;
    // The database, logs and tokens inside are the owner's only.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&given, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("{}", given.display()))?;
    }
    let dir = given
        .canonicalize()
        .with_context(|| format!("{}", given.display()))?;
    eprintln!("moat up: state in {}", dir.display());
    let path = |name: &str| dir.join(name);

    // The control plane's key, the admin token and the policy: made once.
    let key = match manifest::read_private_key(&path("control-plane.key")) {
        Ok(key) => key,
        Err(_) if !path("control-plane.key").exists() => {
            let key = PrivateKey::from_seed(moat_core::random::bytes::<32>());
            files::write_atomic(
                &path("control-plane.key"),
                (key.to_base64() + "\n").as_bytes(),
                0o600,
            )?;
            key
        }
        Err(e) => return Err(e),
    };
    files::write_atomic(
        &path("control-plane.pub"),
        (key.public().to_base64() + "\n").as_bytes(),
        0o644,
    )?;
    let admin = secret_file(&path("admin-token"), random_token)?;
    secret_file(&path("secrets.key"), || {
        base64::engine::general_purpose::STANDARD.encode(moat_core::random::bytes::<32>())
    })?;
    if !path("policy.cedar").exists() {
        files::write_atomic(
            &path("policy.cedar"),
            moat_control::policy::DEFAULT_POLICY.as_bytes(),
            0o644,
        )?;
    }
    let policy_text = std::fs::read_to_string(path("policy.cedar"))?;
    moat_control::PolicyEngine::new(&policy_text)
        .with_context(|| format!("{}", path("policy.cedar").display()))?;

    let url = format!("http://{}", args.listen);
    let mut children = Children(Vec::new());
    let serve = Command::new(&me)
        .args(["serve", "--listen", &args.listen, "--environment", "local"])
        .arg("--db")
        .arg(format!("sqlite:{}", path("moat.db").display()))
        .arg("--key")
        .arg(path("control-plane.key"))
        .arg("--policy")
        .arg(path("policy.cedar"))
        .arg("--admin-token-file")
        .arg(path("admin-token"))
        .arg("--secrets-key")
        .arg(path("secrets.key"))
        .args(
            args.metrics_listen
                .iter()
                .flat_map(|a| ["--metrics-listen", a.as_str()]),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(path("serve.log"))?)
        .spawn()
        .context("starting moat serve")?;
    children.0.push(("moat serve", serve));
    wait_healthy(&url, &mut children, &path("serve.log"))?;
    // The address was free a moment ago; make sure it is ours that answers.
    check_alive(&mut children, &path("serve.log"))?;

    // The demo org: its admin token is kept, so a second `moat up` reuses it.
    let org_token = match std::fs::read_to_string(path("org-admin-token")) {
        Ok(token) => token.trim().to_owned(),
        Err(_) => {
            let answer = expect(
                &url,
                "/v1/orgs",
                &admin,
                &json!({"name": "demo"}),
                "creating the demo org",
            )?;
            let token = answer["token"].as_str().unwrap_or_default().to_owned();
            files::write_atomic(
                &path("org-admin-token"),
                format!("{token}\n").as_bytes(),
                0o600,
            )?;
            token
        }
    };
    let agent_token = match std::fs::read_to_string(path("agent-token")) {
        Ok(token) => token.trim().to_owned(),
        Err(_) => {
            let answer = expect(
                &url,
                "/v1/agent-tokens",
                &org_token,
                &json!({}),
                "creating an agent token",
            )?;
            let token = answer["token"].as_str().unwrap_or_default().to_owned();
            files::write_atomic(&path("agent-token"), format!("{token}\n").as_bytes(), 0o600)?;
            token
        }
    };

    // A fresh sample manifest for this policy, and a runner sealed with it.
    let mut sample = manifest::template(&key.public());
    sample.policy_hash = moat_core::hash::sha256_hex(policy_text.as_bytes());
    sample
        .allowed_executables
        .retain(|e| Path::new(&e.path).exists());
    // Exports (which the default policy sends for approval) are written
    // too, by artifact_write only: a program sees export/ read-only, so
    // nothing lands there without the policy's decision on that write.
    sample.filesystem.write_roots.push("export".into());
    sample.filesystem.artifact_only.push("export".into());
    // What programs write under output/ leaves only through the export
    // boundary: data and documents, judged by content, scanned for
    // credentials (and, on the control plane, the org's secrets);
    // everything else is quarantined. A program may write at most 100 MiB
    // there per operation.
    sample.exports = Some(sample_exports());
    sample.limits.max_write_bytes = Some(100 << 20);
    // The worker class (queues' WebAssembly consumers) where this build
    // has its runtime: the runner runs moat-worker from beside itself.
    let worker_runtime = me.with_file_name("moat-worker");
    let workers = worker_runtime.is_file();
    if workers {
        sample.workload_classes = vec![WorkloadClass::Namespace, WorkloadClass::Worker];
    }
    let signed = sample.sign(&key).context("signing the sample manifest")?;
    let signed_json = serde_json::to_value(&signed)?;
    files::write_atomic(
        &path("manifest.signed.json"),
        signed_json.to_string().as_bytes(),
        0o644,
    )?;
    expect(
        &url,
        "/v1/manifests",
        &org_token,
        &signed_json,
        "publishing the sample manifest",
    )?;
    let runner_path = path("moat-runner");
    let _ = std::fs::remove_file(&runner_path);
    let built = Command::new(&me)
        .args(["runner", "build", "--manifest"])
        .arg(path("manifest.signed.json"))
        .arg("--trusted-key")
        .arg(path("control-plane.pub"))
        .arg("--out")
        .arg(&runner_path)
        .output()
        .context("building the sealed runner")?;
    if !built.status.success() {
        bail!(
            "building the sealed runner: {}",
            String::from_utf8_lossy(&built.stderr).trim()
        );
    }
    if workers {
        let beside = path("moat-worker");
        let _ = std::fs::remove_file(&beside);
        std::fs::copy(&worker_runtime, &beside)
            .with_context(|| format!("copying {} beside the runner", worker_runtime.display()))?;
    }
    let report: Value = serde_json::from_slice(&built.stdout)?;
    let runner_hash = report["runnerHash"].as_str().unwrap_or_default().to_owned();
    expect(
        &url,
        "/v1/runner-builds",
        &org_token,
        &json!({"sha256": runner_hash, "label": "moat up local runner"}),
        "allowing the runner build",
    )?;
    let bootstrap = expect(
        &url,
        "/v1/bootstrap-tokens",
        &org_token,
        &json!({}),
        "minting a bootstrap token",
    )?;
    files::write_atomic(
        &path("bootstrap-token"),
        bootstrap["token"].as_str().unwrap_or_default().as_bytes(),
        0o600,
    )?;
    let slots = args.slots.unwrap_or_else(|| {
        moat_runner::default_slots(signed.manifest.limits.memory_bytes).max(MIN_SLOTS)
    });
    let runner = Command::new(&runner_path)
        .args(["runner", "start", "--control-plane", &url])
        .args(["--slots", &slots.to_string()])
        .args(if workers {
            &["--class", "worker"][..]
        } else {
            &[][..]
        })
        .arg("--bootstrap-token-file")
        .arg(path("bootstrap-token"))
        .arg("--state-dir")
        .arg(path("runner-state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(path("runner.log"))?)
        .spawn()
        .context("starting the runner")?;
    children.0.push(("moat runner", runner));
    wait_runner(&url, &org_token, &mut children, &path("runner.log"))?;

    let demo = if args.demo {
        Some(demo_run(&url, &agent_token)?)
    } else {
        None
    };
    print_welcome(&url, &dir, &me, demo.as_deref());
    wait_for_stop(&mut children)
}

/// Refuses an address another process listens on, naming `--listen`.
fn listen_free(listen: &str) -> anyhow::Result<()> {
    match std::net::TcpListener::bind(listen) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => bail!(
            "{listen} is already in use (another `moat up` or `moat serve`?): stop it, \
             or choose another address with --listen, e.g. --listen 127.0.0.1:7800"
        ),
        Err(e) => Err(e).with_context(|| format!("--listen {listen}")),
    }
}

fn wait_healthy(url: &str, children: &mut Children, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    // No token: /healthz asks for none.
    let client = OrgClient::new(url, "", Duration::from_secs(5));
    loop {
        if client.get_answer("/healthz").is_ok_and(|a| a.status == 200) {
            return Ok(());
        }
        check_alive(children, log)?;
        if Instant::now() > deadline {
            bail!(
                "moat serve did not answer within 20 s (see {})",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_runner(url: &str, token: &str, children: &mut Children, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, answer) = call(url, "/v1/runners", token, None)?;
        let registered = answer["runners"].as_array().is_some_and(|r| !r.is_empty());
        if status == 200 && registered {
            return Ok(());
        }
        check_alive(children, log)?;
        if Instant::now() > deadline {
            bail!(
                "the runner did not register within 30 s (see {})",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn check_alive(children: &mut Children, log: &Path) -> anyhow::Result<()> {
    for (name, child) in &mut children.0 {
        if let Ok(Some(status)) = child.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!(
                "{name} exited ({status}): {}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    Ok(())
}

/// A sample run: read an input, count it, write a result, and one step that
/// waits for a person (a write under export/ is a data export).
fn demo_run(url: &str, agent: &str) -> anyhow::Result<String> {
    let id = format!("demo-{}", &random_token()[5..13]);
    expect(
        url,
        "/v1/runs",
        agent,
        &json!({"id": id, "inputs": [{"path": "input/notes.txt", "content": "Moat runs each step in a fresh sandbox.\nEvery decision is in the ledger.\n"}]}),
        "creating the demo run",
    )?;
    let ops = [
        json!({"id": "read", "op": "artifact_read", "args": {"path": "input/notes.txt", "maxBytes": 4096}}),
        json!({"id": "count", "op": "exec_argv", "args": {"argv": ["/usr/bin/wc", "-l", "input/notes.txt"]}}),
        json!({"id": "summary", "op": "artifact_write", "args": {"path": "output/summary.txt", "content": "2 lines\n", "maxBytes": 4096}}),
        json!({"id": "export", "op": "artifact_write", "args": {"path": "export/summary.csv", "content": "lines\n2\n", "maxBytes": 4096}}),
    ];
    for op in ops {
        let (status, answer) = call(url, &format!("/v1/runs/{id}/ops"), agent, Some(&op))?;
        if !(200..300).contains(&status) {
            eprintln!("moat up: demo op {}: {status} {answer}", op["id"]);
        }
    }
    // The agent is done: the runner finishes the run once its last step is
    // decided (approved and run, denied, or expired), freeing its slot.
    expect(
        url,
        &format!("/v1/runs/{id}/finish"),
        agent,
        &json!({}),
        "finishing the demo run",
    )?;
    Ok(id)
}

fn print_welcome(url: &str, dir: &Path, me: &Path, demo: Option<&str>) {
    outln!("{}", welcome(url, dir, me, demo));
}

/// What `moat up` prints once everything is up: every command in it works
/// pasted as printed (a test runs them), with this binary's full path since
/// `moat` need not be on PATH.
pub fn welcome(url: &str, dir: &Path, me: &Path, demo: Option<&str>) -> String {
    let d = shell_quote(&dir.display().to_string());
    let moat = shell_quote(&me.display().to_string());
    let mut text = format!(
        "\nMoat is up (control plane, one sealed runner, the Inspector).\n\n  \
         Inspector:  {url}/ui   (sign in with the token in {d}/org-admin-token)\n  \
         API:        {url}/openapi.json\n  State:      {d}\n  \
         Logs:       {d}/serve.log, {d}/runner.log\n\n"
    );
    if let Some(run) = demo {
        text.push_str(&format!(
            "Demo run {run} is in: its `export` step waits for your approval at {url}/ui/approvals;\n\
             the run finishes by itself once that step is decided.\n\n"
        ));
    }
    text.push_str(&format!(
        "An agent's first steps (paste into a shell; each time a new run):\n\n\
         TOKEN=$(cat {d}/agent-token); RUN=hello-$(date +%s%N)\n\
         curl -s -H \"Authorization: Bearer $TOKEN\" -H 'content-type: application/json' -d \"{{\\\"id\\\":\\\"$RUN\\\",\\\"inputs\\\":[{{\\\"path\\\":\\\"input/a.txt\\\",\\\"content\\\":\\\"hi\\\\n\\\"}}]}}\" {url}/v1/runs; echo\n\
         curl -s -H \"Authorization: Bearer $TOKEN\" -H 'content-type: application/json' -d '{{\"id\":\"wc\",\"op\":\"exec_argv\",\"args\":{{\"argv\":[\"/usr/bin/wc\",\"-c\",\"input/a.txt\"]}}}}' \"{url}/v1/runs/$RUN/ops?wait_ms=10000\"; echo\n\
         curl -s -X POST -H \"Authorization: Bearer $TOKEN\" {url}/v1/runs/$RUN/finish; echo\n\n\
         The last line ends the run (a run left open is finished after 15 minutes without\n\
         an operation: `moat serve --run-idle-timeout`).\n\n\
         Approvals from a shell:\n\n\
         MOAT_CONTROL_PLANE={url} MOAT_TOKEN_FILE={d}/org-admin-token {moat} approvals list\n\n\
         Stop with Ctrl-C."
    ));
    text
}

/// `text` as one word for a POSIX shell (quoted only when it must be).
fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:,=@%".contains(&b));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

fn wait_for_stop(children: &mut Children) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stopped = runtime.block_on(async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return None,
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => return None,
                _ = tick.tick() => {
                    for (name, child) in &mut children.0 {
                        if let Ok(Some(status)) = child.try_wait() {
                            return Some(format!("{name} exited ({status})"));
                        }
                    }
                }
            }
        }
    });
    match stopped {
        None => {
            eprintln!("moat up: stopping");
            Ok(())
        }
        Some(why) => bail!("{why}; stopping"),
    }
}

/// The sample manifest's export rules: data and documents under output/,
/// each at most 32 MiB, 200 files and 40 MiB an operation.
fn sample_exports() -> moat_core::exports::ExportRules {
    use moat_core::exports::{ExportRule, ExportRules, ExportType};
    ExportRules {
        rules: vec![ExportRule {
            path: "output/**".into(),
            types: vec![
                ExportType::Csv,
                ExportType::Json,
                ExportType::Ndjson,
                ExportType::Text,
                ExportType::Png,
                ExportType::Pdf,
                ExportType::Parquet,
            ],
            max_bytes: Some(32 << 20),
            csv: None,
            allow_shebang: false,
        }],
        // Promoted files travel to the control plane with the op's
        // result, whose body is bounded (64 MiB, base64): keep an op's
        // exports well inside it.
        max_files: Some(200),
        max_total_bytes: Some(40 << 20),
        secret_scan: None,
    }
}
