#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Workload classes in a managed run: the policy puts a third-party
//! program in the `microvm` class, a runner that offers only `namespace`
//! never claims a run that needs it (the run says why it waits, in the API
//! and the Inspector), and a runner started with `--class microvm` runs
//! that program in a virtual machine while a trusted one stays in a
//! namespace sandbox — as the decision, the capability, the events, the
//! audit and the Inspector record. Real `moat serve`, sealed runners and
//! QEMU (software emulation here: the report says which accelerator ran).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::control::*;
use common::{MOAT, host_processes_with};
use serde_json::{Value, json};

/// The rig's policy, with every program permitted offline (as the default
/// policy does) and a rule that classifies every program whose code is not
/// the operator's own as `microvm`.
fn policy() -> String {
    format!(
        r#"{POLICY}
@id("programs-offline")
permit(principal in Moat::Org::"acme", action == Moat::Action::"exec_argv", resource)
when {{ context.network == "off" }};

@id("untrusted-code-in-a-vm") @workload_class("microvm")
permit(principal, action == Moat::Action::"exec_argv", resource)
when {{ context.origin != "trusted" }};
"#
    )
}

/// A control plane on SQLite serving `policy`, with org `acme` ready for
/// runs under the rig's manifest edited by `edit` (and naming `policy`).
fn plane(
    dir: &std::path::Path,
    policy: &str,
    edit: impl FnOnce(&mut Value),
) -> (Setup, String, Serve, String) {
    let setup = setup_with(dir, |m| {
        m["policyHash"] = json!(sha256_hex(policy.as_bytes()));
        m["workloadClasses"] = json!(["namespace", "microvm"]);
        edit(m);
    });
    std::fs::write(&setup.policy, policy).unwrap();
    let db = format!("sqlite:{}", dir.join("control.db").display());
    let serve = Serve::start(&setup, &db, "127.0.0.1:0");
    let acme = org(&serve, "acme");
    prepare_org(&serve, &setup, &acme);
    (setup, db, serve, acme)
}

fn run_view(serve: &Serve, token: &str, run: &str) -> Value {
    let (status, body) = call("GET", &format!("{}/v1/runs/{run}", serve.url), token, None);
    assert_eq!(status, 200, "{body}");
    body
}

/// The Inspector's page at `path`, as the org's operator sees it.
fn inspector_page(serve: &Serve, token: &str, path: &str) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "20", "-H"])
        .arg(format!("cookie: moat_inspector={token}"))
        .arg(format!("{}{path}", serve.url))
        .output()
        .expect("curl");
    assert!(out.status.success(), "curl {path}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `check` holds of the run, or fails with what it was.
fn wait_run(serve: &Serve, token: &str, run: &str, what: &str, check: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let view = run_view(serve, token, run);
        if check(&view) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {view}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_third_party_program_runs_in_a_vm_on_a_runner_that_offers_the_class_only() {
    let dir = tempfile::tempdir().unwrap();
    let (setup, db, serve, acme) = plane(dir.path(), &policy(), |m| {
        // This machine's KVM boots no stock kernel: software emulation.
        m["allowEmulation"] = json!(true);
        for exe in m["allowedExecutables"].as_array_mut().unwrap() {
            if exe["path"] == "/usr/bin/cat" {
                exe["origin"] = json!("third-party");
            }
        }
    });

    // A runner that offers only namespace registers, and says what its host has.
    let _plain = Runner::start(&serve, &setup, &acme, "plain");
    let runners = |serve: &Serve| -> Vec<Value> {
        let (_, body) = call("GET", &format!("{}/v1/runners", serve.url), &acme, None);
        body["runners"].as_array().cloned().unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while runners(&serve).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the plain runner never registered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let plain = runners(&serve)[0].clone();
    assert_eq!(plain["workloadClasses"], json!(["namespace"]), "{plain}");
    assert!(
        plain["host"]["landlockAbi"].as_u64().unwrap() >= 1,
        "{plain}"
    );
    assert!(
        plain["host"]["kernel"]
            .as_str()
            .is_some_and(|k| !k.is_empty())
    );

    // The run may run cat, which the policy puts in a VM: it needs microvm,
    // and waits, saying why, while the only runner lacks the class.
    create_run(&serve, &acme, "needs-a-vm");
    let view = run_view(&serve, &acme, "needs-a-vm");
    assert_eq!(
        view["workloadClasses"],
        json!(["namespace", "microvm"]),
        "{view}"
    );
    let plain_id = plain["id"].as_str().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let view = run_view(&serve, &acme, "needs-a-vm");
    assert_eq!(
        view["state"], "queued",
        "claimed by a runner without the class: {view}"
    );
    let waiting = view["waiting"].as_str().unwrap_or_default();
    assert!(
        waiting.contains("microvm") && waiting.contains(plain_id),
        "the reason names the class and what the runners offer: {view}"
    );
    let page = inspector_page(&serve, &acme, "/ui/runs/needs-a-vm");
    let shown = page
        .split_once("id=\"run-waiting\"")
        .and_then(|(_, rest)| rest.split_once("</dd>"))
        .map(|(reason, _)| reason.to_owned())
        .unwrap_or_else(|| panic!("no waiting reason on the run page: {page}"));
    assert!(
        shown.contains("needs workload class microvm") && shown.contains(plain_id),
        "{shown}"
    );
    // A class nobody knows is refused when the run is created.
    let (status, body) = call(
        "POST",
        &format!("{}/v1/runs", serve.url),
        &acme,
        Some(json!({"id": "explicit", "workloadClasses": ["gvisor"]})),
    );
    assert_eq!(status, 400, "an unknown class is refused: {body}");

    // A runner that offers microvm claims it.
    let _vm = Runner::start_with(&serve, &setup, &acme, "vm", &["--class", "microvm"]);
    wait_run(&serve, &acme, "needs-a-vm", "never claimed", |v| {
        v["state"] != "queued"
    });
    let view = run_view(&serve, &acme, "needs-a-vm");
    assert!(view.get("waiting").is_none(), "{view}");
    let vm_runner = runners(&serve)
        .into_iter()
        .find(|r| r["id"] == view["runnerId"])
        .unwrap();
    assert_eq!(
        vm_runner["workloadClasses"],
        json!(["namespace", "microvm"])
    );
    // Which accelerator depends on the host (here: tcg, KVM boots no stock
    // kernel); what the runner says is what its guests then run under.
    let accelerator = vm_runner["host"]["accelerator"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        vm_runner["host"]["hardwareVirtualization"],
        accelerator == "kvm",
        "{vm_runner}"
    );
    eprintln!("microvm accelerator: {accelerator}");

    // A program named otherwise than the manifest lists it is refused: the
    // policy classified the name it was given.
    let argv = json!({"argv": ["cat", "/proc/cmdline"]});
    let (_, op) = post_op(
        &serve,
        &acme,
        "needs-a-vm",
        envelope("bare", "exec_argv", argv),
    );
    assert_eq!(op["result"]["reason"], "executable_not_allowed", "{op}");

    // The third-party program runs in a VM: the guest's kernel, not the host's.
    let argv = json!({"argv": ["/usr/bin/cat", "/proc/cmdline"]});
    let (status, op) = post_op(
        &serve,
        &acme,
        "needs-a-vm",
        envelope("vm-op", "exec_argv", argv),
    );
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("succeeded")),
        "{op}"
    );
    assert_eq!(op["decision"]["class"], "microvm", "{op}");
    let result = &op["result"]["result"];
    assert!(
        result["stdout"].as_str().unwrap().contains("moat_guest=1"),
        "{op}"
    );
    assert_eq!(result["class"], "microvm", "{op}");
    assert_eq!(result["vm"]["accelerator"], accelerator.as_str(), "{op}");
    // A trusted tool stays in a namespace sandbox.
    let argv = json!({"argv": ["/usr/bin/wc", "-c", "input/a.txt"]});
    let (_, op) = post_op(
        &serve,
        &acme,
        "needs-a-vm",
        envelope("ns-op", "exec_argv", argv),
    );
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_eq!(op["decision"]["class"], "namespace", "{op}");
    assert!(op["result"]["result"].get("vm").is_none_or(Value::is_null));

    // The events say which class each program ran in.
    let events = run_events(&serve, &acme, "needs-a-vm");
    let started = |op: &str| {
        events
            .iter()
            .find(|e| e["type"] == "sandbox.exec.started" && e["opId"] == op)
            .unwrap_or_else(|| panic!("no start of {op}: {events:?}"))
            .clone()
    };
    assert_eq!(started("vm-op")["data"]["class"], "microvm");
    assert!(started("ns-op")["data"].get("class").is_none());
    let granted = events
        .iter()
        .find(|e| e["type"] == "capability.granted" && e["opId"] == "vm-op")
        .unwrap();
    assert_eq!(granted["data"]["class"], "microvm", "{granted}");
    let refused = events
        .iter()
        .find(|e| e["type"] == "capability.denied" && e["opId"] == "bare")
        .unwrap_or_else(|| panic!("the bare name's refusal is not recorded: {events:?}"));
    assert_eq!(
        refused["data"]["reason"], "executable_not_allowed",
        "{refused}"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "sandbox.exec.started" && e["opId"] == "bare")
    );

    // The Inspector and the audit say so too.
    let page = inspector_page(&serve, &acme, "/ui/runs/needs-a-vm");
    assert!(
        page.contains(&format!("data-class=\"microvm ({accelerator})\"")),
        "{page}"
    );
    finish_run(&serve, &acme, "needs-a-vm");
    let audited = Command::new(MOAT)
        .args(["audit", "needs-a-vm", "--db", &db])
        .output()
        .unwrap();
    let audit = String::from_utf8_lossy(&audited.stdout);
    assert!(audited.status.success(), "{audit} {audited:?}");
    let vm_line = format!("microvm: a QEMU microvm guest of its own (accelerator {accelerator}");
    assert!(audit.contains(&vm_line), "{audit}");
    assert!(audit.contains("namespace: moat-sandbox"), "{audit}");
    // Replay gives no capability, so no class: it does not re-run in a
    // namespace sandbox what ran in a guest, and says so.
    let replayed = Command::new(MOAT)
        .args(["replay", "needs-a-vm", "--json", "--db", &db, "--policy"])
        .arg(&setup.policy)
        .arg("--trusted-key")
        .arg(setup.dir.join("keys/moat.pub"))
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&replayed.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&replayed.stderr)));
    let verdict = |id: &str| {
        report["ops"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["op"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not in the replay: {report:#}"))
    };
    let vm = verdict("vm-op");
    assert_eq!(vm["replayed"], false, "{report:#}");
    assert!(
        vm["why"].as_str().is_some_and(|w| w.contains("microvm")),
        "{vm}"
    );
    assert_eq!(verdict("ns-op")["same"], true, "{report:#}");
    assert_ledger_intact(&serve);
    let emulators = host_processes_with("qemu-system-x86_64");
    assert!(emulators.is_empty(), "emulator left running: {emulators:?}");
}

#[test]
fn an_operation_classified_beyond_its_runner_is_refused_and_recorded() {
    // Programs with network go to a VM: a run's needs, found at its
    // creation, are those of programs without network; an operation that
    // asks for network is classified when it is decided.
    let text = format!(
        r#"{POLICY}
@id("online-code-in-a-vm") @workload_class("microvm")
permit(principal, action == Moat::Action::"exec_argv", resource)
when {{ context.network != "off" }};
"#
    );
    let dir = tempfile::tempdir().unwrap();
    let (setup, _, serve, acme) = plane(dir.path(), &text, |_| {});
    let _plain = Runner::start(&serve, &setup, &acme, "plain");
    create_run(&serve, &acme, "offline");
    assert_eq!(
        run_view(&serve, &acme, "offline")["workloadClasses"],
        json!(["namespace"])
    );
    wait_run(&serve, &acme, "offline", "never claimed", |v| {
        v["state"] != "queued"
    });
    // Asked with network, python3 must run in a VM the runner cannot give:
    // refused at once (no approval is asked for a program that cannot run).
    let argv = json!({"argv": ["/usr/bin/python3", "-c", "print(1)"], "network": "allowlist"});
    let (status, refused) = post_op(
        &serve,
        &acme,
        "offline",
        envelope("online", "exec_argv", argv),
    );
    assert_eq!(status, 403, "{refused}");
    let op = &refused["op"];
    assert_eq!(op["state"], "denied", "{op}");
    assert_eq!(op["result"]["reason"], "class_not_available", "{op}");
    let message = op["result"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("microvm") && message.contains("offers namespace"),
        "{op}"
    );
    let events = run_events(&serve, &acme, "offline");
    let denied = events
        .iter()
        .find(|e| e["type"] == "capability.denied" && e["opId"] == "online")
        .unwrap_or_else(|| panic!("no denial recorded: {events:?}"));
    assert_eq!(denied["data"]["class"], "microvm", "{denied}");
    assert_eq!(denied["data"]["reason"], "class_not_available", "{denied}");
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "sandbox.exec.started" && e["opId"] == "online"),
        "a refused program started: {events:?}"
    );
    // The same program without network is the namespace class's, and runs.
    let op = python_op(&serve, &acme, "offline", "offline-op", "print(2)");
    assert_eq!(op["decision"]["class"], "namespace", "{op}");
    finish_run(&serve, &acme, "offline");
    assert_ledger_intact(&serve);
}
