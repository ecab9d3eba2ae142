#![allow(clippy::expect_used, clippy::unwrap_used)]
//! `moat up` as a newcomer meets it: everything it prints for a person to
//! paste works as printed (run here with bash), the agent's first steps
//! answer while the demo run waits for its approval, each paste is a new
//! run, its state lives in the per-user state directory (never the source
//! tree), and a taken address is named as such.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::up::start_up;
use common::{MOAT, free_port, host_processes_with};
use serde_json::Value;

fn bash(script: &str) -> String {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\nfailed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The lines of `text` from the one starting with `first` through the one
/// ending with `last`.
fn block<'a>(text: &'a str, first: &str, last: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with(first))
        .unwrap_or_else(|| panic!("no line starting with {first:?} in:\n{text}"));
    let end = start
        + lines[start..]
            .iter()
            .position(|l| l.trim_end().ends_with(last))
            .unwrap_or_else(|| panic!("no line ending with {last:?} in:\n{text}"));
    lines[start..=end].to_vec()
}

#[test]
fn moat_up_prints_first_steps_that_work_as_printed_while_the_demo_waits() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("state");
    let listen = format!("127.0.0.1:{}", free_port());
    let (up, printed, errors) = start_up(home.path(), &["--demo", "--listen", &listen]);

    // Its state is in the per-user state directory, and it says where.
    let dir = state.join("moat/up");
    assert!(
        printed.contains(&format!("State:      {}", dir.display())),
        "{printed}"
    );
    for file in [
        "agent-token",
        "org-admin-token",
        "moat.db",
        "control-plane.key",
    ] {
        assert!(
            dir.join(file).exists(),
            "{file} missing in {}",
            dir.display()
        );
    }
    assert!(!home.path().join("moat-up").exists());

    // The agent's first steps, pasted as printed, twice: each is a new run,
    // and each answers at once although the demo's run waits for a person.
    let steps = block(&printed, "TOKEN=", "/finish; echo").join("\n");
    for _ in 0..2 {
        let out = bash(&steps);
        let answers: Vec<Value> = out
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(answers.len(), 3, "{out}");
        assert_eq!(answers[0]["state"], "queued", "{out}");
        assert_eq!(answers[1]["state"], "succeeded", "{out}");
        assert_eq!(answers[1]["result"]["status"], "ok", "{out}");
        assert_eq!(answers[1]["result"]["result"]["stdout"], "3 input/a.txt\n");
        assert_eq!(answers[2]["finishRequested"], true, "{out}");
    }

    // The printed approvals command works as printed (full path to moat).
    let approvals = block(&printed, "MOAT_CONTROL_PLANE=", "approvals list").join("\n");
    let listed = bash(&approvals);
    let demo = printed
        .split_whitespace()
        .find(|w| w.starts_with("demo-"))
        .unwrap();
    assert!(
        listed.contains(demo) && listed.contains("pending"),
        "{listed}"
    );

    // Approved, the demo's last step runs and the run finishes by itself.
    let approval = listed.split_whitespace().next().unwrap();
    let approve = approvals.replace("approvals list", &format!("approvals approve {approval}"));
    bash(&approve);
    let token = std::fs::read_to_string(dir.join("agent-token")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = bash(&format!(
            "curl -s -H 'Authorization: Bearer {}' http://{listen}/v1/runs/{demo}",
            token.trim()
        ));
        let run: Value = serde_json::from_str(&run).unwrap();
        if run["state"] == "succeeded" {
            break;
        }
        assert!(Instant::now() < deadline, "the demo run stayed {run}");
        std::thread::sleep(Duration::from_millis(100));
    }

    drop(up);
    let errors = errors.join().unwrap();
    assert!(errors.contains("moat up: stopping"), "{errors}");
    assert!(
        host_processes_with(dir.to_str().unwrap()).is_empty(),
        "left running: {:?}",
        host_processes_with(dir.to_str().unwrap())
    );
}

#[test]
fn moat_up_on_a_taken_address_says_so_and_names_listen() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("up");
    let out = Command::new(MOAT)
        .args(["up", "--listen", &listen, "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{listen} is already in use")) && stderr.contains("--listen"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Nothing was made or started.
    assert!(!Path::new(&dir).exists());
}

/// The program the agent generated to clean the client's spreadsheets:
/// it writes what it should (a cleaned CSV, a summary, and a report for
/// the client, which the default policy lets leave only with a person's
/// approval) and, as generated
/// code may, what it should not: a copy of an executable, a symlink to a
/// host file, a file far past the write budget, a CSV holding one of the
/// org's secrets and one named with it, put together from two halves (`HEAD` and `TAIL`,
/// replaced by the test): the control plane scrubs a whole secret out of
/// an operation's arguments, so generated code that leaks one builds it.
const CLEANING: &str = r#"
import csv, glob, json, os, shutil
rows = []
for name in sorted(glob.glob('input/*.csv')):
    with open(name, newline='') as f:
        for row in csv.DictReader(f):
            rows.append({k.strip().lower(): (v or '').strip() for k, v in row.items()})
seen, clean = set(), []
for r in rows:
    email = r.get('email', '').lower()
    if email and email not in seen:
        seen.add(email)
        clean.append({'name': r['name'].title(), 'email': email, 'amount': '%.2f' % float(r['amount'])})
os.makedirs('output', exist_ok=True)
with open('output/clean.csv', 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=['name', 'email', 'amount'], lineterminator='\n')
    w.writeheader()
    w.writerows(clean)
with open('output/summary.json', 'w') as f:
    json.dump({'rowsIn': len(rows), 'rowsOut': len(clean)}, f)
os.makedirs('output/client', exist_ok=True)
with open('output/client/report.csv', 'w') as f:
    f.write('client,total\n')
    f.write('%s,%.2f\n' % ('all', sum(float(r['amount']) for r in clean)))
with open('output/client/draft.csv', 'w') as f:
    f.write('client,total\ndraft,0.00\n')
with open('output/contacts.csv', 'w') as f:
    f.write('name,key\nbilling,' + 'HEAD' + 'TAIL' + '\n')
with open('output/' + 'HEAD' + 'TAIL' + '.csv', 'w') as f:
    f.write('a,b\n1,2\n')
shutil.copy('/usr/bin/true', 'output/helper')
os.symlink('/etc/passwd', 'output/passwd')
try:
    with open('output/big.bin', 'wb') as f:
        for _ in range(200):
            f.write(b'x' * (1 << 20))
except OSError as e:
    print('big.bin:', e.strerror)
"#;

#[test]
fn the_spreadsheet_scenario_promotes_clean_outputs_holds_one_for_approval_and_quarantines_the_rest()
{
    use common::control::{call, download, sha256_hex};
    let inspector = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inspector");
    assert!(
        inspector.join("node_modules/playwright-core").is_dir()
            && Path::new("/usr/bin/chromium").exists(),
        "playwright-core and chromium are missing: run the suite with tests/suite.sh, which installs them"
    );
    let home = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let (up, _, errors) = start_up(
        home.path(),
        &["--listen", &listen, "--metrics-listen", &metrics],
    );
    let dir = home.path().join("state/moat/up");
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .unwrap()
            .trim()
            .to_owned()
    };
    let (agent, admin) = (read("agent-token"), read("org-admin-token"));
    let url = format!("http://{listen}");

    // One of the org's secrets, which the generated code happens to hold.
    let secret = format!(
        "sk-client-{}",
        &sha256_hex(home.path().to_str().unwrap().as_bytes())[..24]
    );
    let (status, body) = call(
        "PUT",
        &format!("{url}/v1/secrets/client-api-key"),
        &admin,
        Some(serde_json::json!({"value": secret})),
    );
    assert_eq!(status, 201, "{body}");

    // The client's spreadsheets, read-only inputs of the run.
    let run = format!("clean-{}", free_port());
    let inputs = serde_json::json!([
        {"path": "input/clients-a.csv", "content":
            "Name,Email,Amount\n ada lovelace ,ADA@example.com,12.5\nalan turing,alan@example.com,7\n"},
        {"path": "input/clients-b.csv", "content":
            "Name,Email,Amount\nAda Lovelace,ada@example.com,12.50\ngrace hopper,grace@example.com,3.1\n,,\n"},
    ]);
    let (status, body) = call(
        "POST",
        &format!("{url}/v1/runs"),
        &agent,
        Some(serde_json::json!({"id": run, "inputs": inputs})),
    );
    assert_eq!(status, 201, "{body}");

    let (head, tail) = secret.split_at(secret.len() / 2);
    let program = CLEANING.replace("HEAD", head).replace("TAIL", tail);
    let op = serde_json::json!({"id": "clean", "op": "exec_argv",
        "args": {"argv": ["/usr/bin/python3", "-c", program]}});
    let (status, mut answer) = call(
        "POST",
        &format!("{url}/v1/runs/{run}/ops?wait_ms=20000"),
        &agent,
        Some(op),
    );
    assert_eq!(status, 200, "{answer}");
    let deadline = Instant::now() + Duration::from_secs(180);
    while matches!(answer["state"].as_str(), Some("queued" | "dispatched")) {
        assert!(Instant::now() < deadline, "the op never finished: {answer}");
        answer = call(
            "GET",
            &format!("{url}/v1/runs/{run}/ops/clean?wait_ms=20000"),
            &agent,
            None,
        )
        .1;
    }
    assert_eq!(answer["state"], "succeeded", "{answer}");
    let result = &answer["result"]["result"];
    // No network, the inputs read-only, the write budget enforced.
    assert_eq!(result["exitCode"], 0, "{result}");
    assert!(
        result["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("big.bin: No space left on device"),
        "{result}"
    );
    let exports = &result["exports"];

    // The cleaned CSV and the summary are promoted and downloadable, byte
    // for byte what the program wrote.
    let clean_csv = "name,email,amount\nAda Lovelace,ada@example.com,12.50\n\
                     Alan Turing,alan@example.com,7.00\nGrace Hopper,grace@example.com,3.10\n";
    let summary = r#"{"rowsIn": 5, "rowsOut": 3}"#;
    let promoted: Vec<(String, String)> = exports["promoted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap().to_owned(),
                p["sha256"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut paths: Vec<&str> = promoted.iter().map(|(p, _)| p.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        ["output/clean.csv", "output/summary.json"],
        "{exports}"
    );
    for (path, sha) in &promoted {
        let want = if path.ends_with(".csv") {
            clean_csv
        } else {
            summary
        };
        assert_eq!(sha, &sha256_hex(want.as_bytes()), "{path}");
        let (status, bytes) = download(&format!("{url}/v1/artifacts/{sha}"), &agent);
        assert_eq!(status, 200, "{path}");
        assert_eq!(String::from_utf8(bytes).unwrap(), want, "{path}");
    }

    // The other four are quarantined, each with its reason; those the
    // verifier read answer 404 with it, and nothing of them is stored.
    let rejected: std::collections::BTreeMap<String, Value> = exports["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["path"].as_str().unwrap().to_owned(), r["reasons"].clone()))
        .collect();
    let rule_of = |path: &str| -> Vec<String> {
        rejected[path]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["rule"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(rejected.len(), 5, "{exports}");
    assert_eq!(rule_of("output/helper"), ["executable"], "{exports}");
    assert_eq!(rule_of("output/passwd"), ["symlink"], "{exports}");
    assert_eq!(rule_of("output/big.bin"), ["too_large"], "{exports}");
    assert_eq!(rule_of("output/contacts.csv"), ["secret"], "{exports}");
    // Named with the secret: rejected, and the name is scrubbed.
    assert_eq!(
        rule_of("output/[REDACTED:client-api-key].csv"),
        ["secret"],
        "{exports}"
    );
    assert!(!answer.to_string().contains(&secret), "{answer}");
    let leaked = format!("name,key\nbilling,{secret}\n");
    let helper = std::fs::read("/usr/bin/true").unwrap();
    for (bytes, rule) in [
        (leaked.as_bytes(), "secret"),
        (helper.as_slice(), "executable"),
    ] {
        let sha = sha256_hex(bytes);
        let (status, body) = call("GET", &format!("{url}/v1/artifacts/{sha}"), &agent, None);
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["error"]["reason"], "quarantined", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("{rule} (")),
            "{body}"
        );
    }
    let (_, listed) = call(
        "GET",
        &format!("{url}/v1/runs/{run}/artifacts"),
        &agent,
        None,
    );
    let labels = listed.to_string();
    assert!(
        !labels.contains("helper")
            && !labels.contains("contacts")
            && !labels.contains("big.bin")
            && !labels.contains("REDACTED")
            && !labels.contains(&secret),
        "{listed}"
    );
    // Nor does the secret appear anywhere the agent can read.
    let (_, events) = call(
        "GET",
        &format!("{url}/v1/runs/{run}/events?limit=10000"),
        &agent,
        None,
    );
    assert!(
        !events.to_string().contains(&secret),
        "the secret is in the run's events"
    );
    let count = |kind: &str| {
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == kind)
            .count()
    };
    assert_eq!(
        (
            count("artifact.promoted"),
            count("artifact.rejected"),
            count("artifact.validated"),
            count("approval.requested"),
        ),
        (2, 5, 2, 2)
    );

    // The report for the client passed every check, but the policy asks a
    // person before it leaves: held, not downloadable yet.
    let report = "client,total\nall,22.60\n";
    let pending = exports["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 2, "{exports}");
    let held = |path: &str| {
        pending
            .iter()
            .find(|p| p["path"] == path)
            .unwrap_or_else(|| panic!("{path} is not pending: {exports}"))
    };
    assert_eq!(
        held("output/client/report.csv")["sha256"],
        sha256_hex(report.as_bytes()).as_str()
    );
    let approval = held("output/client/report.csv")["approvalId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The agent cannot approve what its own program wrote.
    let (status, body) = call(
        "POST",
        &format!("{url}/v1/approvals/{approval}/approve"),
        &agent,
        Some(serde_json::json!({})),
    );
    assert!(matches!(status, 401 | 403), "{status} {body}");
    // The draft is denied: quarantined with the approver's reason.
    let draft = "client,total\ndraft,0.00\n";
    let draft_approval = held("output/client/draft.csv")["approvalId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = call(
        "POST",
        &format!("{url}/v1/approvals/{draft_approval}/deny"),
        &admin,
        Some(serde_json::json!({"reason": "not for the client yet"})),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        "GET",
        &format!("{url}/v1/artifacts/{}", sha256_hex(draft.as_bytes())),
        &agent,
        None,
    );
    assert_eq!(status, 404, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        body["error"]["reason"] == "quarantined"
            && message.contains("not_approved (denied by the approver: not for the client yet)"),
        "{body}"
    );
    let report_url = format!("{url}/v1/artifacts/{}", sha256_hex(report.as_bytes()));
    let (status, body) = call("GET", &report_url, &agent, None);
    assert_eq!(
        (status, body["error"]["reason"].as_str()),
        (404, Some("awaiting_approval")),
        "{body}"
    );

    // A person looks at it in the Inspector, in a browser, and approves it.
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/export-approval-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let approved = Command::new("node")
        .arg(inspector.join("approve-export.mjs"))
        .env("MOAT_URL", &url)
        .env("MOAT_TOKEN", &admin)
        .env("MOAT_APPROVAL", &approval)
        .env("MOAT_PATH", "output/client/report.csv")
        .env("MOAT_PREVIEW", "all,22.60")
        .env("MOAT_DETAILS", format!("csv, {} bytes", report.len()))
        .env("MOAT_RUN", &run)
        .env("MOAT_SECRET", &secret)
        .env(
            "MOAT_REJECTED",
            "output/helper executable\noutput/passwd symlink\noutput/big.bin too_large\n\
             output/contacts.csv secret\noutput/[REDACTED:client-api-key].csv secret\n\
             output/client/draft.csv not_approved",
        )
        .env("MOAT_SHOTS", &shots)
        .output()
        .unwrap();
    assert!(
        approved.status.success(),
        "{}{}",
        String::from_utf8_lossy(&approved.stdout),
        String::from_utf8_lossy(&approved.stderr)
    );
    let (status, bytes) = download(&report_url, &agent);
    assert_eq!(status, 200);
    assert_eq!(String::from_utf8(bytes).unwrap(), report);

    // Counted in the control plane's metrics, by rule.
    let scraped = bash(&format!("curl -s http://{metrics}/metrics"));
    for (rule, count) in [
        ("executable", 1),
        ("symlink", 1),
        ("too_large", 1),
        ("secret", 2),
    ] {
        let line = format!("moat_artifact_validation_failures_total{{rule=\"{rule}\"}} {count}");
        assert!(scraped.lines().any(|l| l == line), "{line}: {scraped}");
    }

    // And audit reports, for the run, what was promoted and what was not.
    let audit = Command::new(MOAT)
        .args(["audit", "--db"])
        .arg(format!("sqlite:{}", dir.join("moat.db").display()))
        .arg(&run)
        .output()
        .unwrap();
    let audit = String::from_utf8_lossy(&audit.stdout);
    assert!(
        audit.contains("Export boundary: 3 file(s) promoted, 6 rejected, 0 awaiting approval")
            && audit.contains(&format!("approved ({approval})"))
            && audit.contains("rejected  \"output/contacts.csv\": secret"),
        "{audit}"
    );

    // The three promoted files, and only they, are in the trusted output
    // store: the directory beside the database, by hash.
    let outputs = dir.join("moat.db-outputs/sha256");
    let mut stored: Vec<String> = std::fs::read_dir(&outputs)
        .unwrap()
        .flat_map(|fan| std::fs::read_dir(fan.unwrap().path()).unwrap())
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    stored.sort_unstable();
    let mut want: Vec<String> = [clean_csv, summary, report]
        .iter()
        .map(|text| sha256_hex(text.as_bytes()))
        .collect();
    want.sort_unstable();
    assert_eq!(stored, want, "what {} holds", outputs.display());

    drop(up);
    let errors = errors.join().unwrap();
    assert!(!errors.contains("panicked"), "{errors}");
}
