//! The `microvm` workload class, end to end: `moat exec --class microvm`
//! boots a real QEMU `microvm` guest (Debian's kernel, `moat` as its init)
//! inside a namespace jail. Under TCG (no usable hardware virtualization,
//! as on the build machine) each run takes seconds: the tests are few, run
//! one at a time, and each checks several things of one guest.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::servers::*;
use common::*;
use serde_json::Value;

/// The root's VM cache, where each run's state directory lives while it runs.
const RUNS: &str = "/var/cache/moat/microvm/runs";

fn state_dirs() -> Vec<String> {
    std::fs::read_dir(RUNS)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// `moat exec --class microvm --allow-degraded ARGS -- PROGRAM`, checked to
/// leave nothing behind on the host: no emulator, no state directory.
fn vm_exec(args: &[&str], program: &[&str]) -> Run {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let mut all = vec!["--class", "microvm", "--allow-degraded"];
    all.extend_from_slice(args);
    vm_exec_locked(&all, program)
}

/// `moat exec ARGS -- PROGRAM` while the caller holds [`ONE_VM`].
fn vm_exec_locked(args: &[&str], program: &[&str]) -> Run {
    let run = exec(args, program);
    assert_nothing_left(&run);
    run
}

fn assert_nothing_left(run: &Run) {
    let emulators = host_processes_with("qemu-system-x86_64");
    assert!(emulators.is_empty(), "emulator left running: {emulators:?}");
    let left = state_dirs();
    assert!(
        left.is_empty(),
        "state left in {RUNS}: {left:?}\n{}",
        dump(run)
    );
}

fn dump(run: &Run) -> String {
    let events: Vec<String> = run.events.iter().map(Value::to_string).collect();
    format!(
        "\n--- exit code: {}\n--- stdout:\n{}\n--- stderr:\n{}\n--- report:\n{}\n--- events:\n{}\n",
        run.code,
        run.stdout,
        run.stderr,
        run.report,
        events.join("\n")
    )
}

/// The run was a VM, said so in the report and both events, and named the
/// accelerator honestly: software emulation only with a reason.
fn assert_ran_in_a_vm(run: &Run) {
    assert_eq!(run.report["class"], "microvm", "{}", dump(run));
    let vm = &run.report["vm"];
    match vm["accelerator"].as_str() {
        Some("kvm") => assert!(vm["degraded"].is_null(), "{}", dump(run)),
        Some("tcg") => assert!(
            vm["degraded"].as_str().is_some_and(|r| !r.is_empty()),
            "TCG without a reason: {}",
            dump(run)
        ),
        other => panic!("accelerator {other:?}: {}", dump(run)),
    }
    let started = run.events_of("sandbox.exec.started");
    assert_eq!(started.len(), 1, "{}", dump(run));
    assert_eq!(started[0]["data"]["class"], "microvm");
    // The jail that held the emulator was a full namespace sandbox.
    assert_all_layers_enforced(run);
    let finished = run.events_of("sandbox.exec.finished");
    assert_eq!(finished[0]["data"]["class"], "microvm");
}

#[test]
fn the_guest_has_its_own_kernel_memory_and_no_network() {
    let script = "cat /proc/cmdline; grep MemTotal /proc/meminfo; \
                  echo \"ifaces: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')\"; \
                  echo \"uid: $(id -u)\"; grep CapEff /proc/self/status; \
                  [ -e /sys ] && echo SYS-VISIBLE; echo end";
    let run = vm_exec(&["--memory", "512M"], &["/bin/sh", "-c", script]);
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert_ran_in_a_vm(&run);
    let host_cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    assert!(run.stdout.contains("moat_guest=1"), "{}", dump(&run));
    assert!(
        !run.stdout.contains(host_cmdline.trim()),
        "the host's kernel command line: {}",
        dump(&run)
    );
    // MemTotal is the VM's memory less what the guest kernel keeps.
    let mem_kib: u64 = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no MemTotal: {}", dump(&run)));
    assert!(
        (512 * 1024 * 8 / 10..=512 * 1024).contains(&mem_kib),
        "MemTotal {mem_kib} kB for a 512 MiB guest: {}",
        dump(&run)
    );
    assert_eq!(run.report["vm"]["memoryBytes"], 512u64 << 20);
    assert!(run.stdout.contains("ifaces: lo \n"), "{}", dump(&run));
    // With no writable root the program is nobody, without a capability.
    assert!(run.stdout.contains("uid: 65534"), "{}", dump(&run));
    assert!(
        run.stdout.contains("CapEff:\t0000000000000000"),
        "{}",
        dump(&run)
    );
    assert!(!run.stdout.contains("SYS-VISIBLE"), "{}", dump(&run));
    assert!(run.stdout.ends_with("\nend\n"), "{}", dump(&run));
}

#[test]
fn a_timeout_destroys_the_machine() {
    let run = vm_exec(&["--timeout", "2s"], &["/bin/sleep", "60"]);
    assert_eq!(run.code, 124, "{}", dump(&run));
    assert_eq!(run.report["timedOut"], true, "{}", dump(&run));
    assert_ran_in_a_vm(&run);
    let timeouts = run.events_of("process.timeout");
    assert_eq!(timeouts.len(), 1, "{}", dump(&run));
    assert_eq!(timeouts[0]["data"]["timeoutMs"], 2000);
    assert!(
        run.stderr.contains("timed out after 2000 ms"),
        "{}",
        dump(&run)
    );
}

#[test]
fn the_allowlist_reaches_allowed_names_only_through_the_proxy() {
    let server = Server::http();
    let allow = format!("app.test:{}", server.port);
    let script = format!(
        "curl -sS http://app.test:{port}/ok; \
         echo \"other: $(curl -s -o /dev/null -w '%{{http_code}}' http://other.test:{port}/no)\"; \
         curl -sS --noproxy '*' -m 5 http://10.0.2.2:{port}/direct >/dev/null 2>&1 \
           || echo DIRECT-REFUSED",
        port = server.port
    );
    let run = vm_exec(
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
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert_ran_in_a_vm(&run);
    assert!(run.stdout.contains(HTTP_BODY), "{}", dump(&run));
    assert!(run.stdout.contains("other: 403"), "{}", dump(&run));
    assert!(run.stdout.contains("DIRECT-REFUSED"), "{}", dump(&run));
    // Only the allowed request reached the host's server.
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].line.contains("/ok"), "{seen:?}");
    let requests = run.events_of("network.request");
    assert!(
        requests.iter().any(|e| e.to_string().contains("app.test")),
        "{}",
        dump(&run)
    );
    let denied = run.events_of("network.denied");
    assert!(
        denied.iter().any(|e| e.to_string().contains("other.test")),
        "{}",
        dump(&run)
    );
}

#[test]
fn roots_are_shared_as_declared_and_owned_by_the_program() {
    let ws = workspace();
    let input = workspace();
    let tag = token();
    let script = format!(
        "cat /workspace/input/hello.txt; echo \"made {tag}\" > /workspace/out-{tag}.txt; \
         echo x > /workspace/input/new-{tag} 2>/dev/null || echo INPUT-READ-ONLY; \
         echo x > /usr/{tag} 2>/dev/null || echo USR-READ-ONLY; echo \"uid: $(id -u)\""
    );
    let run = vm_exec(
        &[
            "--workspace",
            path_str(ws.path()),
            "--input",
            path_str(input.path()),
        ],
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert_ran_in_a_vm(&run);
    assert!(run.stdout.starts_with("hello\n"), "{}", dump(&run));
    assert!(run.stdout.contains("INPUT-READ-ONLY"), "{}", dump(&run));
    assert!(run.stdout.contains("USR-READ-ONLY"), "{}", dump(&run));
    let made = ws.path().join(format!("out-{tag}.txt"));
    assert_eq!(
        std::fs::read_to_string(&made).unwrap(),
        format!("made {tag}\n")
    );
    // Written through the jail's idmapped root: the workspace owner's file.
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(ws.path()).unwrap().uid();
    assert_eq!(std::fs::metadata(&made).unwrap().uid(), owner);
    assert!(!input.path().join(format!("new-{tag}")).exists());
    assert!(!Path::new("/usr").join(&tag).exists());
}

#[test]
fn software_emulation_needs_consent_and_bad_specs_are_refused() {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    // Without --allow-degraded: KVM, or a refusal that says why.
    let run = exec(&["--class", "microvm"], &["/bin/true"]);
    assert_nothing_left(&run);
    match run.report["vm"]["accelerator"].as_str() {
        Some("kvm") => assert_eq!(run.code, 0, "{}", dump(&run)),
        _ => {
            assert_eq!(run.code, 125, "{}", dump(&run));
            let error = run.report["setupError"].as_str().unwrap_or_default();
            assert!(
                error.contains("hardware virtualization is not usable here")
                    && error.contains("--allow-degraded"),
                "{}",
                dump(&run)
            );
            assert_eq!(run.report["class"], "microvm");
            let denied = run.events_of("sandbox.exec.denied");
            assert_eq!(denied.len(), 1, "{}", dump(&run));
            assert!(run.stderr.contains("--allow-degraded"), "{}", dump(&run));
        }
    }
    // A program the guest does not have: 127, said as for any run.
    let run = vm_exec_locked(
        &["--class", "microvm", "--allow-degraded"],
        &["/no/such/program"],
    );
    assert_eq!(run.code, 127, "{}", dump(&run));
    assert!(
        run.stderr.contains("cannot execute /no/such/program"),
        "{}",
        dump(&run)
    );
    assert_eq!(run.report["exit"]["kind"], "execFailed", "{}", dump(&run));
    // What the class cannot give is refused before anything starts.
    for (args, says) in [
        (vec!["--memory", "64M"], "128 MiB"),
        (vec!["--network", "full"], "--network full"),
        (vec!["--max-write", "1M"], "storage budget"),
        (vec!["--mode", "danger-full-access"], "danger-full-access"),
        (vec!["--ro", "/var/tmp:/run/data"], "the guest's init's"),
    ] {
        let mut all = vec!["--class", "microvm", "--allow-degraded"];
        all.extend_from_slice(&args);
        let run = exec(&all, &["/bin/true"]);
        assert_eq!(run.code, 2, "{args:?}: {}", dump(&run));
        assert!(run.stderr.contains(says), "{args:?}: {}", dump(&run));
        assert!(run.events.is_empty(), "{args:?}: {}", dump(&run));
        assert_nothing_left(&run);
    }
}

#[test]
fn an_unprivileged_user_gets_a_guest_too() {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let copy = unprivileged_copy();
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    for dir in [home.path(), ws.path()] {
        std::os::unix::fs::chown(dir, Some(65534), Some(65534)).unwrap();
    }
    let report = home.path().join("report.json");
    let moat = copy.path().join("moat");
    // Its own cache, under its own home.
    let output = command_as("env", Some(65534))
        .arg(format!("HOME={}", home.path().display()))
        .arg(&moat)
        .args(["exec", "--class", "microvm", "--allow-degraded", "--report"])
        .arg(&report)
        .args(["--workspace", path_str(ws.path()), "--"])
        .args(["/bin/sh", "-c", "id -u > /workspace/who; id -u"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
        .unwrap_or(Value::Null);
    let all = format!("{stdout}\n{stderr}\n{report}");
    assert_eq!(output.status.code(), Some(0), "{all}");
    assert_eq!(stdout.trim(), "65534", "{all}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("who")).unwrap(),
        "65534\n"
    );
    assert_eq!(report["class"], "microvm", "{all}");
    // KVM only where nobody may open it and a guest boots; emulation with
    // the reason otherwise.
    let vm = &report["vm"];
    match vm["accelerator"].as_str() {
        Some("kvm") => assert!(vm["degraded"].is_null(), "{all}"),
        _ => assert!(
            vm["degraded"].as_str().is_some_and(|r| !r.is_empty()),
            "{all}"
        ),
    }
    assert_eq!(
        report["enforcement"]["hostIdentity"]["status"],
        "not_enforced"
    );
    let runs = home.path().join(".cache/moat/microvm/runs");
    assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 0, "{all}");
    let emulators = host_processes_with("qemu-system-x86_64");
    assert!(emulators.is_empty(), "{emulators:?}");
}
