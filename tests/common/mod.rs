#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Shared helpers of the sandbox test suite: run the real `moat` binary,
//! collect its report and events, plant and check canaries on the host.
#![allow(dead_code)]

pub mod control;
pub mod cotenancy;
pub mod scaleout;
pub mod servers;
pub mod up;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

pub const MOAT: &str = env!("CARGO_BIN_EXE_moat");

/// The attack probe (`examples/probe.rs`), built by `cargo test`.
pub fn probe() -> PathBuf {
    let path = Path::new(MOAT)
        .parent()
        .map(|dir| dir.join("examples").join("probe"))
        .unwrap_or_default();
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test` (which builds examples)",
        path.display()
    );
    path
}

/// Arguments that bind the probe read-only at /probe/probe.
pub fn with_probe() -> Vec<String> {
    let dir = probe().parent().map(Path::to_path_buf).unwrap_or_default();
    vec!["--ro".into(), format!("{}:/probe", dir.display())]
}

/// What one `moat exec` did, host side.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub report: Value,
    pub events: Vec<Value>,
}

impl Run {
    pub fn events_of(&self, event_type: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["type"] == event_type)
            .collect()
    }

    /// The seccomp layer's denial of `syscall` was recorded as an event.
    pub fn assert_syscall_denied_event(&self, syscall: &str) {
        let found = self
            .events_of("sandbox.syscall.denied")
            .iter()
            .any(|e| e["data"]["syscall"] == syscall);
        assert!(
            found,
            "no sandbox.syscall.denied event for {syscall}: {:#?}",
            self.events
        );
        let counted = self.report["deniedSyscalls"]
            .as_array()
            .is_some_and(|list| list.iter().any(|d| d["syscall"] == syscall));
        assert!(counted, "report does not count {syscall}: {}", self.report);
    }

    pub fn layer(&self, layer: &str) -> &str {
        self.report["enforcement"][layer]["status"]
            .as_str()
            .unwrap_or("missing")
    }
}

/// Holds an event to its type's schema (`moat_core::EventData`): every
/// event the end-to-end tests see passes through here.
pub fn check_event(event: &Value, whence: &str) {
    let kind: moat_core::EventType = serde_json::from_value(event["type"].clone())
        .unwrap_or_else(|e| panic!("{whence}: not an event type ({e}): {event}"));
    if let Err(e) = moat_core::EventData::parse(kind, &event["data"]) {
        panic!(
            "{whence}: a {} event not of its schema ({e}): {event}",
            kind.as_str()
        );
    }
}

/// One `microvm` guest at a time per test binary: two emulated machines on
/// two cores only make each slower, and a test checks that no emulator is
/// left once its run ended.
pub static ONE_VM: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    static IN_MICROVM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `test` with every `exec` of this thread in a `microvm` guest
/// (`--class microvm --allow-degraded`): the namespace class's attack tests
/// run again against the other boundary.
pub fn in_microvm(test: fn()) {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    IN_MICROVM.with(|c| c.set(true));
    let result = std::panic::catch_unwind(test);
    IN_MICROVM.with(|c| c.set(false));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    let emulators = host_processes_with("qemu-system-x86_64");
    assert!(emulators.is_empty(), "emulator left running: {emulators:?}");
}

/// Runs `moat exec ARGS -- PROGRAM...` with report and events captured.
pub fn exec(args: &[&str], program: &[&str]) -> Run {
    exec_as(MOAT, args, program, None)
}

pub fn exec_as(moat: &str, args: &[&str], program: &[&str], uid: Option<u32>) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    make_world_accessible(dir.path());
    if let Some(uid) = uid {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).expect("chown");
    }
    let report = dir.path().join("report.json");
    let events = dir.path().join("events.jsonl");
    let mut command = command_as(moat, uid);
    command.arg("exec");
    if IN_MICROVM.with(|c| c.get()) {
        command.args(["--class", "microvm", "--allow-degraded"]);
    }
    command
        .arg("--report")
        .arg(&report)
        .arg("--events")
        .arg(&events)
        .args(args)
        .arg("--")
        .args(program)
        .stdin(Stdio::null());
    let output = command.output().expect("running moat");
    let report = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let events = std::fs::read_to_string(&events)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("event is JSON"))
        .collect::<Vec<Value>>();
    for event in &events {
        check_event(event, "moat exec --events");
    }
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        report,
        events,
    }
}

/// `program`, run as `uid` (and gid) with no supplementary group when given.
pub fn command_as(program: &str, uid: Option<u32>) -> Command {
    match uid {
        Some(uid) => {
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
                program.into(),
            ]);
            c
        }
        None => Command::new(program),
    }
}

/// Runs the probe check `check [arg]` in a default sandbox plus `args`.
pub fn probe_run(args: &[&str], check: &[&str]) -> Run {
    let mut all: Vec<String> = with_probe();
    all.extend(args.iter().map(|s| s.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut program = vec!["/probe/probe"];
    program.extend_from_slice(check);
    exec(&all, &program)
}

/// `from` copied to `to` as an executable (mode 0755) by a child process.
/// A file this test process opened for writing could be inherited by a
/// program another test thread forks at that moment; exec'ing it would
/// then fail with ETXTBSY. A child's descriptors are gone once it exits.
pub fn install_executable(from: &Path, to: &Path) {
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(from)
        .arg(to)
        .status()
        .expect("running install");
    assert!(
        status.success(),
        "install {} {}",
        from.display(),
        to.display()
    );
}

/// The binary and the probe copied where an unprivileged user can run them.
pub fn unprivileged_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    make_world_accessible(dir.path());
    for (from, name) in [(PathBuf::from(MOAT), "moat"), (probe(), "probe")] {
        install_executable(&from, &dir.path().join(name));
    }
    dir
}

pub fn make_world_accessible(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// The kernel's audit (host-wide) switched on or off while held, as the
/// evidence layer's tests need it; put back as it was on drop. Tests of one
/// binary that hold it take turns.
pub struct AuditSetting {
    was: bool,
    _turn: std::sync::MutexGuard<'static, ()>,
}

static AUDIT_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl AuditSetting {
    pub fn set(on: bool) -> Self {
        let turn = AUDIT_TURN.lock().unwrap_or_else(|e| e.into_inner());
        let was = moat_sandbox::switch_kernel_audit(on)
            .expect("switching the kernel's audit (these tests run as root)");
        AuditSetting { was, _turn: turn }
    }
}

impl Drop for AuditSetting {
    fn drop(&mut self) {
        let _ = moat_sandbox::switch_kernel_audit(self.was);
    }
}

/// A unique token for canaries and process markers.
pub fn token() -> String {
    moat_core::random::hex(8)
}

/// A host file with a random name and random content outside every sandbox
/// root; removed on drop. `assert_intact` proves nothing touched it.
/// Planted under /var/tmp by default: unlike /tmp (always replaced by the
/// sandbox's own), /var/tmp would be visible if the host root leaked in.
pub struct Canary {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub content: String,
}

impl Canary {
    pub fn plant() -> Self {
        Self::plant_in("/var/tmp")
    }

    pub fn plant_in(parent: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("moat-canary-")
            .tempdir_in(parent)
            .expect("tempdir");
        make_world_accessible(dir.path());
        let path = dir.path().join(format!("canary-{}", token()));
        let content = format!("secret-{}", token());
        std::fs::write(&path, &content).expect("plant canary");
        Canary { dir, path, content }
    }

    pub fn assert_intact(&self) {
        let now = std::fs::read_to_string(&self.path).expect("canary still there");
        assert_eq!(now, self.content, "canary was modified");
        let entries = std::fs::read_dir(self.dir.path())
            .expect("canary dir")
            .count();
        assert_eq!(entries, 1, "something was created next to the canary");
    }
}

/// Host processes whose command line contains `marker`.
pub fn host_processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
    {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(marker) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// A workspace directory with one file, removed on drop.
pub fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("hello.txt"), "hello\n").expect("write");
    dir
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The finished event carries the report and says what was enforced.
pub fn assert_all_layers_enforced(run: &Run) {
    for layer in [
        "namespaces",
        "filesystem",
        "landlock",
        "seccomp",
        "privileges",
        "cgroup",
        "rlimits",
    ] {
        assert_eq!(run.layer(layer), "enforced", "{layer}: {}", run.report);
    }
    let finished = run.events_of("sandbox.exec.finished");
    assert_eq!(finished.len(), 1, "{:#?}", run.events);
}

/// A pseudo-terminal: the master descriptor (closed on drop) and the slave,
/// opened read-write, to hand to `moat` as a terminal.
pub struct Pty {
    master: i32,
    pub slave: std::fs::File,
}

impl Pty {
    pub fn open() -> Self {
        // SAFETY: standard pty allocation; the master is owned by the Pty.
        let (master, slave_path) = unsafe {
            let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
            assert!(master >= 0);
            assert_eq!(libc::grantpt(master), 0);
            assert_eq!(libc::unlockpt(master), 0);
            let name = std::ffi::CStr::from_ptr(libc::ptsname(master));
            (master, name.to_string_lossy().into_owned())
        };
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&slave_path)
            .expect("pty slave");
        Pty { master, slave }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        // SAFETY: closing the master this Pty opened.
        unsafe { libc::close(self.master) };
    }
}

/// Keys made with `moat manifest keygen` in `dir/keys`, and the template
/// manifest for them, edited by `edit`, signed into `dir/signed.json`.
/// Returns `(signed manifest, public key)`.
pub fn signed_manifest(
    dir: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> (PathBuf, PathBuf) {
    let moat = |args: &[&str]| Command::new(MOAT).args(args).output().expect("moat");
    let keys = dir.join("keys");
    assert!(
        moat(&["manifest", "keygen", "--out", path_str(&keys)])
            .status
            .success()
    );
    let public = keys.join("moat.pub");
    let template = moat(&["manifest", "template", "--public-key", path_str(&public)]);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&template.stdout).expect("template");
    edit(&mut manifest);
    let bare = dir.join("manifest.json");
    std::fs::write(&bare, manifest.to_string()).expect("write manifest");
    let signed = dir.join("signed.json");
    let key = keys.join("moat.key");
    let out = moat(&[
        "manifest",
        "sign",
        "--key",
        path_str(&key),
        "--out",
        path_str(&signed),
        path_str(&bare),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (signed, public)
}

/// A loopback port nothing listens on right now (for a server the test
/// starts by address).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Every file under `dir` that contains `needle`.
pub fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return hits;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            hits.extend(files_containing(&path, needle));
        } else if let Ok(bytes) = std::fs::read(&path)
            && bytes.windows(needle.len()).any(|w| w == needle)
        {
            hits.push(path.display().to_string());
        }
    }
    hits
}
