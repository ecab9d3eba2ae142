#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The Kubernetes runner's seccomp profile, applied as a container runtime
//! applies it (libseccomp, through `tests/deploy/apply-seccomp.py`), with
//! `moat exec` beneath: every sandbox the runner builds starts under it, and
//! the calls it adds are allowed only with the flags the sandbox uses.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

const PROFILE: &str = "deploy/kubernetes/node/moat-runner-seccomp.json";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn profile() -> Value {
    let text = std::fs::read_to_string(root().join(PROFILE)).expect("the shipped profile");
    serde_json::from_str(&text).expect("the profile is JSON")
}

/// Debian's Python, with its libseccomp bindings (`python3-seccomp`,
/// installed by tests/suite.sh): not whatever `python3` is first on PATH.
const PYTHON: &str = "/usr/bin/python3";

/// A `moat` that runs under `profile`: a script in `dir` that applies it
/// and then executes the real binary with its arguments.
fn moat_under(dir: &Path, profile: &Value) -> PathBuf {
    let file = dir.join("profile.json");
    std::fs::write(&file, profile.to_string()).expect("writing the profile");
    let text = dir.join("moat-under-profile.sh");
    std::fs::write(
        &text,
        format!(
            "#!/bin/sh\nexec {PYTHON} {} {} {} \"$@\"\n",
            root().join("tests/deploy/apply-seccomp.py").display(),
            file.display(),
            MOAT
        ),
    )
    .expect("writing the wrapper");
    let script = dir.join("moat-under-profile");
    install_executable(&text, &script);
    make_world_accessible(dir);
    script
}

/// `program` under `profile`: its exit code and standard error.
fn under(profile: &Value, program: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("profile.json");
    std::fs::write(&file, profile.to_string()).expect("writing the profile");
    let output = Command::new(PYTHON)
        .arg(root().join("tests/deploy/apply-seccomp.py"))
        .arg(&file)
        .args(program)
        .output()
        .expect("running apply-seccomp.py");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The profile as shipped before `setns` was allowed.
fn without_setns(profile: &Value) -> Value {
    let mut old = profile.clone();
    let rules = old["syscalls"].as_array_mut().expect("syscalls");
    rules.retain(|rule| rule["names"] != serde_json::json!(["setns"]));
    old
}

/// Names the profile allows without any condition on the arguments.
fn allowed_outright(profile: &Value) -> Vec<String> {
    profile["syscalls"]
        .as_array()
        .expect("syscalls")
        .iter()
        .filter(|rule| rule["action"] == "SCMP_ACT_ALLOW" && rule.get("args").is_none())
        .flat_map(|rule| rule["names"].as_array().expect("names").clone())
        .filter_map(|name| name.as_str().map(str::to_owned))
        .collect()
}

#[test]
fn every_sandbox_starts_under_the_runner_profile_with_each_network_mode() {
    let profile = profile();
    let dir = tempfile::tempdir().expect("tempdir");
    let moat = moat_under(dir.path(), &profile);
    let moat = moat.to_str().expect("utf-8 path");
    for network in [
        &["--network", "off"][..],
        &[
            "--network",
            "allowlist",
            "--allow-domain",
            "example.invalid",
        ][..],
    ] {
        let run = exec_as(moat, network, &["/usr/bin/true"], None);
        assert_eq!(run.code, 0, "{network:?}: {}", run.stderr);
        assert_all_layers_enforced(&run);
        assert_eq!(
            run.events_of("sandbox.exec.denied").len(),
            0,
            "{:#?}",
            run.events
        );
    }
}

#[test]
fn the_profile_without_setns_breaks_every_sandbox_and_says_so() {
    let old = without_setns(&profile());
    let dir = tempfile::tempdir().expect("tempdir");
    let moat = moat_under(dir.path(), &old);
    let run = exec_as(
        moat.to_str().expect("utf-8 path"),
        &["--network", "off"],
        &["/usr/bin/true"],
        None,
    );
    assert_eq!(run.code, 125, "{}", run.stderr);
    let denied = run.events_of("sandbox.exec.denied");
    assert_eq!(denied.len(), 1, "{:#?}", run.events);
    let reason = denied[0]["data"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("entering the sandbox's user namespace: Operation not permitted"),
        "{reason}"
    );
}

#[test]
fn namespace_calls_are_allowed_only_with_the_flags_the_sandbox_uses() {
    let profile = profile();
    let outright = allowed_outright(&profile);
    for name in ["setns", "unshare", "ptrace"] {
        assert!(
            !outright.iter().any(|n| n == name),
            "{name} is allowed with any arguments"
        );
    }
    // The kernel would allow these to root; the profile refuses them first.
    for (flag, what) in [
        ("--user", "a user namespace"),
        ("--mount", "a mount namespace"),
        ("--pid", "a pid namespace"),
    ] {
        let (code, stderr) = under(&profile, &["/usr/bin/unshare", flag, "/usr/bin/true"]);
        assert_ne!(code, 0, "unshare {flag} ({what}) was allowed");
        assert!(
            stderr.contains("Operation not permitted"),
            "{flag}: {stderr}"
        );
    }
    // And ptrace, which Moat never calls (PTRACE_TRACEME: harmless if allowed).
    let (code, stderr) = under(
        &profile,
        &[
            PYTHON,
            "-c",
            "import ctypes, sys\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             rc = libc.ptrace(0, 0, 0, 0)\n\
             sys.exit(0 if rc == -1 and ctypes.get_errno() == 1 else 1)",
        ],
    );
    assert_eq!(code, 0, "ptrace was not refused with EPERM: {stderr}");
}

/// A tool tests/suite.sh provides, named by an environment variable: a run
/// without it fails here, saying how to get it, rather than skipping.
fn suite_tool(var: &str) -> PathBuf {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: run the suite with `bash tests/suite.sh`, which installs the deployment checks' tools")
    });
    assert!(path.exists(), "{var}={} does not exist", path.display());
    path
}

/// `deploy/kubernetes` as `kubectl apply -k` would send it, rendered by
/// Debian's kubectl (kustomize v2.0, the oldest the kustomization promises
/// to work with).
fn rendered_kustomization(dir: &Path) -> PathBuf {
    let kubectl = suite_tool("MOAT_TEST_KUBECTL");
    let output = Command::new(kubectl)
        .args(["kustomize"])
        .arg(root().join("deploy/kubernetes"))
        .output()
        .expect("running kubectl kustomize");
    assert!(
        output.status.success(),
        "kubectl kustomize deploy/kubernetes failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let file = dir.join("rendered.yaml");
    std::fs::write(&file, &output.stdout).expect("writing the rendered manifests");
    file
}

#[test]
fn the_kustomization_renders_and_validates_strictly_on_every_supported_kubernetes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rendered = rendered_kustomization(dir.path());
    let text = std::fs::read_to_string(&rendered).expect("rendered");
    // Everything the issue of the old manifests named is in what is applied.
    for kind in [
        "kind: Namespace",
        "kind: Deployment",
        "kind: DaemonSet",
        "kind: NetworkPolicy",
        "kind: ConfigMap",
    ] {
        assert!(text.contains(kind), "{kind} missing from the render");
    }
    assert!(
        !text.contains("REPLACE-ME") && text.matches("@sha256:").count() == 2,
        "both images are pinned by digest through kustomize"
    );
    let validate = suite_tool("MOAT_TEST_DEPLOY_VENV").join("bin/kubernetes-validate");
    for minor in 30..=37 {
        let version = format!("1.{minor}.0");
        let output = Command::new(&validate)
            .args(["--strict", "--quiet", "-k", &version])
            .arg(&rendered)
            .output()
            .expect("running kubernetes-validate");
        assert!(
            output.status.success(),
            "kubernetes-validate --strict -k {version}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn checkov_passes_the_rendered_manifests_and_every_suppression_says_why_where_it_applies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rendered = rendered_kustomization(dir.path());
    let checkov = suite_tool("MOAT_TEST_DEPLOY_VENV").join("bin/checkov");
    // --skip-download: checkov asks its vendor's API for guidelines
    // otherwise, and this machine talks to no one.
    let output = Command::new(checkov)
        .args([
            "--framework",
            "kubernetes",
            "--skip-download",
            "-o",
            "json",
            "-f",
        ])
        .arg(&rendered)
        .env("HOME", dir.path())
        .output()
        .expect("running checkov");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "checkov's JSON ({e}): {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let summary = &report["summary"];
    let failed = report["results"]["failed_checks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let described: Vec<String> = failed
        .iter()
        .map(|c| format!("{} on {}", c["check_id"], c["resource"]))
        .collect();
    assert_eq!(summary["failed"], 0, "checkov failed checks: {described:?}");
    assert!(summary["passed"].as_u64().unwrap_or(0) > 150, "{summary}");
    assert!(
        output.status.success(),
        "checkov exited {:?}",
        output.status
    );

    let skipped = report["results"]["skipped_checks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut seen = Vec::new();
    for check in &skipped {
        let id = check["check_id"].as_str().expect("check_id");
        let reason = check["check_result"]["suppress_comment"]
            .as_str()
            .unwrap_or("");
        assert!(
            reason.len() > 20,
            "suppression of {id} gives no reason: {reason:?}"
        );
        let file = match check["resource"].as_str().unwrap_or("") {
            r if r.starts_with("DaemonSet.") => "deploy/kubernetes/runner-daemonset.yaml",
            r if r.starts_with("Deployment.") => "deploy/kubernetes/control-plane.yaml",
            other => panic!("a suppression on {other}, which this test does not know"),
        };
        // The annotation says why; a comment at the setting it concerns
        // points back at it.
        let source = std::fs::read_to_string(root().join(file)).expect("the manifest");
        assert!(
            source.contains(&format!("checkov {id}")),
            "{file} has no comment at the line {id} concerns"
        );
        seen.push(format!("{id} {}", check["resource"].as_str().unwrap_or("")));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "CKV_K8S_15 DaemonSet.moat-runner.moat-runner",
            "CKV_K8S_15 Deployment.moat.moat-control-plane",
            "CKV_K8S_31 DaemonSet.moat-runner.moat-runner",
            "CKV_K8S_8 DaemonSet.moat-runner.moat-runner",
            "CKV_K8S_9 DaemonSet.moat-runner.moat-runner",
        ],
        "the suppressions are exactly the ones reviewed"
    );
}

#[test]
fn runners_may_reach_only_the_control_plane_dns_and_public_addresses() {
    let text = std::fs::read_to_string(root().join("deploy/kubernetes/network-policies.yaml"))
        .expect("network-policies.yaml");
    let runner = text
        .split("\n---\n")
        .find(|doc| doc.contains("name: moat-runner\n  namespace: moat-runner"))
        .expect("the runner's policy");
    assert!(
        !runner.contains("ingress:"),
        "nothing may connect to a runner"
    );
    // The metadata address, the cluster's private ranges and loopback are
    // never egress destinations.
    for range in [
        "169.254.0.0/16",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "fe80::/10",
        "fc00::/7",
    ] {
        assert!(
            runner.contains(&format!("- {range}")),
            "{range} is not excepted"
        );
    }
    // The control plane calls the orgs' tools on public addresses only.
    let control = text
        .split("\n---\n")
        .find(|doc| doc.contains("name: moat-control-plane\n  namespace: moat\n"))
        .expect("the control plane's policy");
    for range in ["169.254.0.0/16", "10.0.0.0/8", "fe80::/10"] {
        assert!(
            control.contains(&format!("- {range}")),
            "{range} is not excepted for the control plane"
        );
    }
    for namespace in ["moat", "moat-runner"] {
        assert!(
            text.contains(&format!("name: default-deny\n  namespace: {namespace}\nspec:\n  podSelector: {{}}\n  policyTypes: [\"Ingress\", \"Egress\"]")),
            "{namespace} has no default deny"
        );
    }
}

/// The host ids the container's user namespace maps 0..65536 onto, as a
/// pod with `hostUsers: false` gets (a block of its own; not the suite's
/// MOAT_UID_RANGE, which root sandboxes use).
const POD_ID_BASE: u32 = 1_912_602_624;

/// A runc container shaped as the runner DaemonSet's pod: its security
/// context (uid 65532, no capabilities, no_new_privs, read-only root, the
/// shipped seccomp profile, procMount Unmasked: nothing masked), a user
/// namespace of its own, every other namespace, the cgroup file system
/// mounted read-only as a pod has it, and emptyDirs at /tmp and the state
/// directory. It runs `script` with `moat` at /opt/moat/moat and removes
/// itself, and its cgroup (under `moat/`), when dropped.
struct PodLikeContainer {
    id: String,
    bundle: tempfile::TempDir,
}

impl PodLikeContainer {
    fn new(seccomp: &Value) -> PodLikeContainer {
        let bundle = tempfile::tempdir().expect("bundle");
        make_world_accessible(bundle.path());
        let rootfs = bundle.path().join("rootfs");
        for dir in [
            "usr",
            "etc",
            "proc",
            "dev",
            "sys",
            "tmp",
            "var/lib/moat-runner",
            "opt/moat",
        ] {
            std::fs::create_dir_all(rootfs.join(dir)).expect("rootfs dir");
        }
        // Merged /usr, as Debian's images have it.
        for link in ["bin", "sbin", "lib", "lib64"] {
            std::os::unix::fs::symlink(format!("usr/{link}"), rootfs.join(link)).expect("symlink");
        }
        std::fs::write(rootfs.join("opt/moat/moat"), b"").expect("mount point");
        for dir in [
            rootfs.as_path(),
            &rootfs.join("opt"),
            &rootfs.join("opt/moat"),
        ] {
            make_world_accessible(dir);
        }
        let id = format!(
            "moat-test-{}",
            moat_core::random::new_id("").get(..12).unwrap_or("x")
        );
        let map = serde_json::json!([{"containerID": 0, "hostID": POD_ID_BASE, "size": 65536}]);
        // emptyDirs: directories of the host, owned by the pod's uid 65532
        // (as fsGroup makes them writable to it), bound read-write.
        let empty_dir = |name: &str, destination: &str| {
            let dir = bundle.path().join(name);
            std::fs::create_dir(&dir).expect("emptyDir");
            let owner = POD_ID_BASE + 65532;
            std::os::unix::fs::chown(&dir, Some(owner), Some(owner)).expect("chown emptyDir");
            serde_json::json!({"destination": destination, "type": "bind",
                               "source": dir.display().to_string(),
                               "options": ["rbind", "rw", "nosuid", "nodev"]})
        };
        let bind = |source: &str, destination: &str| {
            serde_json::json!({"destination": destination, "type": "bind", "source": source,
                               "options": ["rbind", "ro", "nosuid", "nodev"]})
        };
        let config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": 65532, "gid": 65532},
                "args": ["/bin/sh", "-c", "exec \"$0\" \"$@\""],
                "env": ["PATH=/usr/bin:/bin", "HOME=/tmp"],
                "cwd": "/tmp",
                "capabilities": {"bounding": [], "effective": [], "inheritable": [],
                                 "permitted": [], "ambient": []},
                "noNewPrivileges": true
            },
            "root": {"path": "rootfs", "readonly": true},
            "hostname": "moat-runner",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                 "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
                {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                 "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
                {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                 "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
                {"destination": "/sys", "type": "sysfs", "source": "sysfs",
                 "options": ["nosuid", "noexec", "nodev", "ro"]},
                {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                 "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
                empty_dir("tmp", "/tmp"),
                empty_dir("state", "/var/lib/moat-runner"),
                bind("/usr", "/usr"),
                bind("/etc", "/etc"),
                bind(MOAT, "/opt/moat/moat"),
            ],
            "linux": {
                "uidMappings": map,
                "gidMappings": map,
                "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                               {"type": "uts"}, {"type": "mount"}, {"type": "user"},
                               {"type": "cgroup"}],
                "cgroupsPath": format!("/moat/{id}"),
                "seccomp": seccomp,
                "maskedPaths": [],
                "readonlyPaths": []
            }
        });
        std::fs::write(bundle.path().join("config.json"), config.to_string()).expect("config.json");
        PodLikeContainer { id, bundle }
    }

    /// Runs `argv` in the container; its exit code, stdout and stderr.
    fn run(&self, argv: &[&str]) -> (i32, String, String) {
        let config_path = self.bundle.path().join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).expect("config"))
                .expect("json");
        let mut args = vec![
            Value::from("/bin/sh"),
            Value::from("-c"),
            Value::from("exec \"$0\" \"$@\""),
        ];
        args.extend(argv.iter().map(|a| Value::from(*a)));
        config["process"]["args"] = Value::from(args);
        std::fs::write(&config_path, config.to_string()).expect("config.json");
        let output = Command::new(RUNC)
            .args(["run", "--bundle"])
            .arg(self.bundle.path())
            .arg(&self.id)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("runc (Debian's runc, installed by tests/suite.sh)");
        let _ = Command::new(RUNC)
            .args(["delete", "--force", &self.id])
            .output();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

impl Drop for PodLikeContainer {
    fn drop(&mut self) {
        let _ = Command::new(RUNC)
            .args(["delete", "--force", &self.id])
            .output();
    }
}

const RUNC: &str = "/usr/sbin/runc";

/// `moat exec` inside the container: the report and events it wrote, and
/// its exit code.
fn exec_in_pod(container: &PodLikeContainer, args: &[&str]) -> (i32, Value, Vec<Value>, String) {
    let script = format!(
        "/opt/moat/moat exec --report /tmp/report.json --events /tmp/events.jsonl {} -- /usr/bin/true; \
         code=$?; echo '==report'; cat /tmp/report.json; echo; echo '==events'; cat /tmp/events.jsonl; exit $code",
        args.join(" ")
    );
    let (code, stdout, stderr) = container.run(&["/bin/sh", "-c", &script]);
    let report = stdout
        .split("==report\n")
        .nth(1)
        .and_then(|rest| rest.split("\n==events").next())
        .and_then(|json| serde_json::from_str(json.trim()).ok())
        .unwrap_or(Value::Null);
    let events = stdout
        .split("==events\n")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (code, report, events, format!("{stdout}\n{stderr}"))
}

#[test]
fn under_runc_with_the_daemonsets_security_context_a_sandbox_has_every_promised_layer() {
    let container = PodLikeContainer::new(&profile());
    // Who the runner is in there: uid 65532 of its own user namespace, no
    // capabilities, no_new_privs, the seccomp filter applied.
    let (code, status, stderr) = container.run(&[
        "/bin/sh",
        "-c",
        "grep -E '^(Uid|CapEff|NoNewPrivs|Seccomp):' /proc/self/status; cat /proc/self/uid_map; \
         ls -ld /tmp /var/lib/moat-runner; touch /tmp/x && echo touched",
    ]);
    assert_eq!(code, 0, "{status}{stderr}");
    for line in ["CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"] {
        assert!(status.contains(line), "{line} missing: {status}");
    }
    let mapped = status.lines().any(|l| {
        l.split_whitespace().collect::<Vec<_>>() == ["0", &POD_ID_BASE.to_string(), "65536"]
    });
    assert!(mapped, "{status}");
    assert!(
        status.lines().any(|l| l.starts_with("Uid:\t65532")),
        "{status}"
    );

    for network in [
        "--network off",
        "--network allowlist --allow-domain example.invalid",
    ] {
        let (code, report, events, output) =
            exec_in_pod(&container, &[network, "--without-cgroup-limits"]);
        assert_eq!(code, 0, "{network}: {output}");
        for layer in [
            "namespaces",
            "filesystem",
            "landlock",
            "seccomp",
            "privileges",
            "rlimits",
        ] {
            assert_eq!(
                report["enforcement"][layer]["status"], "enforced",
                "{network}: {layer}: {report}"
            );
        }
        // What a pod cannot give, said plainly: no cgroup of its own (the
        // pod's limits bound it), no host id of its own (unprivileged).
        assert_eq!(
            report["enforcement"]["cgroup"]["status"], "not_enforced",
            "{report}"
        );
        let detail = report["enforcement"]["cgroup"]["detail"]
            .as_str()
            .unwrap_or_default();
        assert!(
            detail.contains("declared: the deployment's limits bound this run"),
            "{detail}"
        );
        assert!(
            events.iter().any(|e| e["type"] == "sandbox.exec.finished"),
            "{events:#?}"
        );
    }
    // Without the declaration the cgroup layer fails closed, and says how.
    let (code, _, events, output) = exec_in_pod(&container, &["--network off"]);
    assert_eq!(code, 125, "{output}");
    let denied: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "sandbox.exec.denied")
        .collect();
    assert_eq!(denied.len(), 1, "{events:#?}");
    let reason = denied[0]["data"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("cgroup:"), "{reason}");
    assert!(output.contains("--without-cgroup-limits"), "{output}");
}

#[test]
fn under_runc_the_profile_that_refused_setns_breaks_every_sandbox() {
    let container = PodLikeContainer::new(&without_setns(&profile()));
    let (code, _, events, output) =
        exec_in_pod(&container, &["--network off", "--without-cgroup-limits"]);
    assert_eq!(code, 125, "{output}");
    let denied: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "sandbox.exec.denied")
        .collect();
    assert_eq!(denied.len(), 1, "{events:#?}");
    let reason = denied[0]["data"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("entering the sandbox's user namespace: Operation not permitted"),
        "{reason}"
    );
}

#[test]
fn both_systemd_units_verify_clean_on_this_machines_systemd() {
    let version = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .expect("systemd-analyze (Debian's systemd, installed by tests/suite.sh)");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    eprintln!("verifying with {}", version.lines().next().unwrap_or("?"));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut units = Vec::new();
    for unit in ["moat-runner.service", "moat-control-plane.service"] {
        // The binaries' installed paths, pointed at this build: verify checks
        // that ExecStart's program exists.
        let text = std::fs::read_to_string(root().join("deploy/systemd").join(unit)).expect("unit");
        let text = text
            .replace("/usr/local/lib/moat/moat-runner", MOAT)
            .replace("/usr/local/bin/moat", MOAT);
        let path = dir.path().join(unit);
        std::fs::write(&path, text).expect("unit copy");
        units.push(path);
    }
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .expect("systemd-analyze verify");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    assert!(
        said.trim().is_empty(),
        "systemd-analyze verify is not clean: {said}"
    );
}
