//! The seccomp deny list: each forbidden syscall fails with EPERM inside, and
//! the refusal reaches the launcher and is recorded as an event.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::*;

fn assert_denied(check: &str, syscall: &str) {
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let run = probe_run(&[], &[check]);
    assert_eq!(
        run.stdout.trim(),
        "errno=1",
        "{check}: {} {}",
        run.stdout,
        run.stderr
    );
    run.assert_syscall_denied_event(syscall);
    assert_eq!(
        std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        mounts_before,
        "{check} changed the host's mounts"
    );
    assert_all_layers_enforced(&run);
}

#[test]
fn ptrace_is_denied() {
    assert_denied("ptrace", "ptrace");
}

#[test]
fn mount_and_umount_are_denied() {
    assert_denied("mount", "mount");
    assert_denied("umount", "umount2");
}

#[test]
fn namespace_creation_is_denied() {
    assert_denied("unshare", "unshare");
    assert_denied("unshare-net", "unshare");
    assert_denied("setns", "setns");
    assert_denied("clone-newuser", "clone");
}

#[test]
fn clone3_is_steered_to_clone_where_flags_are_visible() {
    let run = probe_run(&[], &["clone3"]);
    assert_eq!(run.stdout.trim(), "errno=38", "ENOSYS: {}", run.stdout);
    // Ordinary process creation still works (libc falls back to clone).
    let shell = exec(&[], &["/bin/sh", "-c", "/bin/true & wait; echo forked"]);
    assert_eq!(shell.stdout.trim(), "forked");
}

#[test]
fn keyrings_are_denied() {
    assert_denied("keyctl", "keyctl");
    assert_denied("add_key", "add_key");
}

#[test]
fn bpf_io_uring_perf_and_userfaultfd_are_denied() {
    assert_denied("bpf", "bpf");
    assert_denied("io_uring", "io_uring_setup");
    assert_denied("perf_event_open", "perf_event_open");
    assert_denied("userfaultfd", "userfaultfd");
}

#[test]
fn chroot_and_pivot_root_are_denied() {
    assert_denied("chroot", "chroot");
    assert_denied("pivot_root", "pivot_root");
}

#[test]
fn packet_and_raw_sockets_are_denied() {
    assert_denied("packet-socket", "socket");
    assert_denied("raw-socket", "socket");
}

#[test]
fn the_x32_abi_cannot_bypass_the_filter() {
    let run = probe_run(&[], &["x32"]);
    assert_eq!(run.stdout.trim(), "errno=1", "{}", run.stdout);
    run.assert_syscall_denied_event("x32-abi");
}

#[test]
fn the_i386_entry_point_cannot_bypass_the_filter() {
    let run = probe_run(&[], &["int80"]);
    assert_eq!(run.stdout.trim(), "errno=1", "{}", run.stdout);
    run.assert_syscall_denied_event("i386-abi");
}

#[test]
fn vsock_is_denied() {
    assert_denied_socket("vsock");
}

fn assert_denied_socket(check: &str) {
    let run = probe_run(&[], &[check]);
    assert_eq!(run.stdout.trim(), "errno=1", "{check}: {}", run.stdout);
    run.assert_syscall_denied_event("socket");
}

/// TIOCSTI on a real terminal: the classic way out of a sandbox that shares
/// the launcher's tty is to push keystrokes into it.
#[test]
fn tiocsti_cannot_inject_into_the_launchers_terminal() {
    let pty = Pty::open();
    let slave = &pty.slave;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let mut args = vec![
        "exec".to_owned(),
        "--events".into(),
        events.display().to_string(),
    ];
    args.extend(with_probe());
    for check in ["tiocsti", "tiocsti-highbits"] {
        let output = std::process::Command::new(MOAT)
            .args(&args)
            .args(["--", "/probe/probe", check])
            .stdin(slave.try_clone().unwrap())
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "errno=1",
            "{check}"
        );
        let log = std::fs::read_to_string(&events).unwrap();
        assert!(log.contains("\"syscall\":\"ioctl\""), "{log}");
    }
    // Nothing was pushed into the terminal's input queue.
    let mut pending: libc::c_int = -1;
    // SAFETY: FIONREAD writes one int.
    unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(slave),
            libc::FIONREAD,
            &mut pending,
        )
    };
    drop(pty);
    assert_eq!(pending, 0);
}

/// The deny list inside a `microvm` guest: the checks above, in one boot,
/// each refused with EPERM (clone3 steered with ENOSYS) and recorded.
#[test]
fn the_deny_list_holds_inside_a_microvm_guest() {
    in_microvm(every_check_in_one_run);
}

fn every_check_in_one_run() {
    let checks = [
        ("ptrace", "ptrace"),
        ("mount", "mount"),
        ("umount", "umount2"),
        ("unshare", "unshare"),
        ("unshare-net", "unshare"),
        ("setns", "setns"),
        ("clone-newuser", "clone"),
        ("keyctl", "keyctl"),
        ("add_key", "add_key"),
        ("bpf", "bpf"),
        ("io_uring", "io_uring_setup"),
        ("perf_event_open", "perf_event_open"),
        ("userfaultfd", "userfaultfd"),
        ("chroot", "chroot"),
        ("pivot_root", "pivot_root"),
        ("packet-socket", "socket"),
        ("raw-socket", "socket"),
        ("vsock", "socket"),
        ("x32", "x32-abi"),
        ("int80", "i386-abi"),
    ];
    let script: Vec<String> = checks
        .iter()
        .map(|(check, _)| check)
        .chain(std::iter::once(&"clone3"))
        .map(|check| format!("echo \"{check}: $(/probe/probe {check})\""))
        .collect();
    let run = probe_script(&script.join("; "));
    assert_eq!(run.report["class"], "microvm", "{}", run.report);
    for (check, syscall) in checks {
        assert!(
            run.stdout.contains(&format!("{check}: errno=1\n")),
            "{check}: {}\n{}",
            run.stdout,
            run.stderr
        );
        run.assert_syscall_denied_event(syscall);
    }
    assert!(run.stdout.contains("clone3: errno=38\n"), "{}", run.stdout);
    assert_all_layers_enforced(&run);
}

/// `sh -c SCRIPT` with the probe at /probe.
fn probe_script(script: &str) -> Run {
    let args = with_probe();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    exec(&args, &["/bin/sh", "-c", script])
}
