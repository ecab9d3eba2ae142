#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The launch policy: declared roots that are, are under or hold a host
//! system, credential or container-runtime path, or that hold a socket, a
//! FIFO or a device, are refused before anything is mounted (exit 125,
//! layer `launch_policy`), as root and unprivileged; the operator's
//! allowlist exempts a path, and an override runs the spec but is recorded
//! as an escalation that `moat audit` lists.

mod common;

use std::os::unix::net::UnixListener;
use std::process::Command;

use common::{MOAT, Run, exec, exec_as, make_world_accessible, path_str};
use serde_json::{Value, json};

const NOBODY: u32 = 65534;

/// The run was refused by the launch policy, said so in one line, and
/// recorded the refusal; the program never ran.
fn assert_refused(run: &Run, naming: &str) {
    assert_eq!(run.code, 125, "{}\n{}", run.stderr, run.report);
    let said: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("launch_policy"))
        .collect();
    assert_eq!(said.len(), 1, "{}", run.stderr);
    assert!(said[0].contains(naming), "{}", run.stderr);
    assert!(!run.stdout.contains("reached"), "{}", run.stdout);
    let denied = run.events_of("sandbox.exec.denied");
    assert_eq!(denied.len(), 1, "{:#?}", run.events);
    let reason = denied[0]["data"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("launch_policy: "), "{reason}");
    assert!(reason.contains(naming), "{reason}");
    assert_eq!(run.report["exit"]["kind"], "notStarted", "{}", run.report);
    let layer = &run.report["enforcement"]["launchPolicy"];
    assert_eq!(layer["status"], "enforced", "{layer}");
    assert!(
        layer["detail"].as_str().unwrap().starts_with("refused"),
        "{layer}"
    );
    // Nothing past the policy was set up.
    assert_eq!(run.layer("namespaces"), "not_enforced", "{}", run.report);
}

/// A directory with a unix socket two levels down, listened on by this
/// test (so a connection would be seen).
fn dir_with_socket() -> (tempfile::TempDir, UnixListener, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    make_world_accessible(dir.path());
    let deep = dir.path().join("data/nested");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(dir.path().join("data/file.txt"), "x").unwrap();
    let socket = deep.join(format!("s-{}", common::token()));
    let listener = UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    (dir, listener, socket)
}

fn assert_nobody_connected(listener: &UnixListener) {
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "something connected to the socket"
    );
}

const TRY: [&str; 3] = ["/bin/sh", "-c", "echo reached"];

#[test]
fn a_root_holding_a_unix_socket_is_refused_as_root_and_unprivileged() {
    let (dir, listener, socket) = dir_with_socket();
    let data = dir.path().join("data");
    let bind = format!("{}:/data", data.display());
    let run = exec(&["--ro", &bind], &TRY);
    assert_refused(&run, "a unix socket");
    assert!(run.stderr.contains(path_str(&socket)), "{}", run.stderr);
    let run = exec_as(MOAT, &["--ro", &bind], &TRY, Some(NOBODY));
    assert_refused(&run, "a unix socket");
    // The same directory as --input, --output and --workspace.
    for flag in ["--input", "--output", "--workspace"] {
        let run = exec(&[flag, path_str(&data)], &TRY);
        assert_refused(&run, "a unix socket");
    }
    assert_nobody_connected(&listener);
    assert!(socket.exists());
}

#[test]
fn a_directory_the_launcher_cannot_list_refuses_the_root() {
    // Unprivileged: a directory of the user's own it may enter but not
    // list could hold a socket the program reaches by name.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    make_world_accessible(dir.path());
    let locked = dir.path().join("data/locked");
    std::fs::create_dir_all(&locked).unwrap();
    for path in [dir.path().join("data"), locked.clone()] {
        std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o100)).unwrap();
    let bind = format!("{}:/data", dir.path().join("data").display());
    let run = exec_as(MOAT, &["--ro", &bind], &TRY, Some(NOBODY));
    assert_refused(&run, "a directory the launcher cannot list");
    assert!(run.stderr.contains(path_str(&locked)), "{}", run.stderr);
}

#[test]
fn fifos_and_device_nodes_inside_a_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    make_world_accessible(dir.path());
    let fifo = dir.path().join("fifo-dir");
    std::fs::create_dir(&fifo).unwrap();
    let name = std::ffi::CString::new(path_str(&fifo.join("pipe"))).unwrap();
    // SAFETY: mkfifo on a path this test owns.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o666) }, 0);
    let run = exec(&["--ro", &format!("{}:/data", fifo.display())], &TRY);
    assert_refused(&run, "a FIFO");

    let device = dir.path().join("device-dir");
    std::fs::create_dir(&device).unwrap();
    let name = std::ffi::CString::new(path_str(&device.join("null"))).unwrap();
    // SAFETY: mknod of a character device (1:3, what /dev/null is) in a
    // directory this test owns; the mounts are nodev regardless.
    let made = unsafe { libc::mknod(name.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(made, 0, "mknod: {}", std::io::Error::last_os_error());
    let run = exec(&["--rw", &format!("{}:/data", device.display())], &TRY);
    assert_refused(&run, "a device node");
}

#[test]
fn system_paths_and_homes_are_refused_and_the_override_runs_them_as_an_escalation() {
    // The issue's spot-check: /etc would show /etc/shadow.
    let run = exec(&["--ro", "/etc:/hostetc"], &TRY);
    assert_refused(&run, "a host system path");
    for (bind, naming) in [
        ("/etc/ssl:/ssl", "under /etc"),
        ("/proc/sys:/p", "a host system path"),
        ("/sys/kernel:/k", "a host system path"),
        ("/run:/r", "a host system path"),
        ("/root:/home-of-root", "a user's home directory"),
    ] {
        let run = exec(&["--ro", bind], &TRY);
        assert_refused(&run, naming);
    }
    // What is none of those passes.
    let run = exec(&["--ro", "/usr/share/doc:/d"], &["/bin/true"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.layer("launchPolicy"), "enforced", "{}", run.report);

    let run = exec(
        &["--override-launch-policy", "--ro", "/etc:/hostetc"],
        &[
            "/bin/sh",
            "-c",
            "test -r /hostetc/os-release && echo reached",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    assert_eq!(run.stdout.trim(), "reached");
    assert!(
        run.stderr.contains("WARNING: --override-launch-policy"),
        "{}",
        run.stderr
    );
    let layer = &run.report["enforcement"]["launchPolicy"];
    assert_eq!(layer["status"], "not_enforced", "{layer}");
    assert!(
        layer["detail"].as_str().unwrap().starts_with("overridden"),
        "{layer}"
    );
    let finished = run.events_of("sandbox.exec.finished");
    assert_eq!(finished[0]["data"]["enforcement"]["launchPolicy"], *layer);
}

#[test]
fn the_operators_allowlist_exempts_a_path_and_the_report_names_it() {
    let (dir, listener, _socket) = dir_with_socket();
    let data = dir.path().join("data");
    let bind = format!("{}:/data", data.display());
    let run = exec(
        &["--launch-allow", path_str(dir.path()), "--ro", &bind],
        &["/bin/true"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.report);
    let layer = &run.report["enforcement"]["launchPolicy"];
    assert_eq!(layer["status"], "enforced", "{layer}");
    let detail = layer["detail"].as_str().unwrap();
    assert!(detail.contains("exempt"), "{detail}");
    assert!(detail.contains(path_str(&data)), "{detail}");
    // An allowlist entry elsewhere exempts nothing.
    let other = tempfile::tempdir().unwrap();
    let run = exec(
        &["--launch-allow", path_str(other.path()), "--ro", &bind],
        &TRY,
    );
    assert_refused(&run, "a unix socket");
    assert_nobody_connected(&listener);
}

#[test]
fn a_runner_started_with_the_override_is_audited_as_beyond_its_boundary() {
    use common::control::*;
    let dir = tempfile::tempdir().unwrap();
    let (setup, db, serve, acme) = sqlite_plane(dir.path());
    let _runner = Runner::start_with(
        &serve,
        &setup,
        &acme,
        "runner-override",
        &["--override-launch-policy"],
    );
    let audit = |run: &str| {
        let out = Command::new(MOAT)
            .args(["audit", run, "--json", "--db", &db])
            .output()
            .unwrap();
        let audit: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), audit)
    };
    create_run(&serve, &acme, "run-o");
    let (status, op) = post_op(
        &serve,
        &acme,
        "run-o",
        envelope(
            "1",
            "exec_argv",
            json!({"argv": ["/usr/bin/wc", "-c", "input/a.txt"]}),
        ),
    );
    assert_eq!(
        (status, op["state"].as_str()),
        (200, Some("succeeded")),
        "{op}"
    );
    let (code, audit) = audit("run-o");
    assert_eq!(code, Some(3), "{audit}");
    assert_eq!(audit["beyondDefaultBoundary"], true, "{audit}");
    let danger = audit["danger"].as_array().unwrap();
    assert!(
        danger
            .iter()
            .any(|d| d["what"] == "launch policy overridden" && d["opId"] == "1"),
        "{audit}"
    );
    assert_eq!(
        audit["enforcement"]["launchPolicy"]["status"], "not_enforced",
        "{audit}"
    );
}

/// A directory of host root's with a file only root may read and one
/// anyone may.
fn root_owned_dir() -> (tempfile::TempDir, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    make_world_accessible(dir.path());
    let secret = common::token();
    let file = dir.path().join("secret");
    std::fs::write(&file, &secret).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(dir.path().join("public"), "public\n").unwrap();
    (dir, secret)
}

#[test]
fn files_only_host_root_may_read_stay_unreadable_in_a_declared_root() {
    let (dir, secret) = root_owned_dir();
    let data = format!("{}:/data", path_str(dir.path()));
    let read = ["/bin/sh", "-c", "cat /data/public; cat /data/secret"];
    // Read-only, alone.
    let run = exec(&["--ro", &data], &read);
    assert!(run.stdout.contains("public"), "{}", run.stdout);
    assert!(!run.stdout.contains(&secret), "{}", run.stdout);
    assert!(run.stderr.contains("Permission denied"), "{}", run.stderr);
    let fs = run.report["enforcement"]["filesystem"]["detail"]
        .as_str()
        .unwrap();
    assert!(fs.contains("/data (ro)"), "{fs}");
    // Beside a writable root of another user's, which the sandbox user
    // becomes: still only what anyone may read.
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(work.path(), Some(1000), Some(1000)).unwrap();
    let rw = format!("{}:/work", path_str(work.path()));
    let write_and_read = [
        "/bin/sh",
        "-c",
        "echo made > /work/made; cat /data/public; cat /data/secret",
    ];
    let run = exec(&["--rw", &rw, "--ro", &data], &write_and_read);
    assert!(run.stdout.contains("public"), "{}", run.stdout);
    assert!(!run.stdout.contains(&secret), "{}", run.stdout);
    assert!(run.stderr.contains("Permission denied"), "{}", run.stderr);
    let made = std::fs::metadata(work.path().join("made")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&made), 1000);
    // Nothing was written where it was read from.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    // Beside a writable root of host root's (a root runner's workspace),
    // root's files are the program's, and the report says so.
    let owned = tempfile::tempdir().unwrap();
    let rw = format!("{}:/work", path_str(owned.path()));
    let run = exec(&["--rw", &rw, "--ro", &data], &read);
    let fs = run.report["enforcement"]["filesystem"]["detail"]
        .as_str()
        .unwrap();
    assert!(fs.contains("a writable root is owned by host root"), "{fs}");
}
