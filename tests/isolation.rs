//! What a sandboxed program can see of the host: environment, descriptors,
//! credentials, processes, hostname, IPC and network.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};

use common::*;

#[test]
fn environment_holds_nothing_of_the_launcher() {
    let secret = format!("sk-live-{}", token());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    let output = Command::new(MOAT)
        .env("MOAT_TEST_SECRET", &secret)
        .env("AWS_SECRET_ACCESS_KEY", &secret)
        .args(["exec", "--report"])
        .arg(&report)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "env; echo ---; tr '\\0' '\\n' < /proc/self/environ",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(!stdout.contains(&secret), "{stdout}");
    let names: Vec<&str> = stdout
        .lines()
        .filter(|l| *l != "---")
        .filter_map(|l| l.split_once('=').map(|(n, _)| n))
        .collect();
    for name in names {
        assert!(
            [
                "PATH", "HOME", "TMPDIR", "LANG", "RUN_ID", "PWD", "SHLVL", "_"
            ]
            .contains(&name),
            "unexpected variable {name}"
        );
    }
}

#[test]
fn env_flag_passes_only_the_named_variable() {
    let value = token();
    let output = Command::new(MOAT)
        .env("MOAT_TEST_PASS", &value)
        .env("MOAT_TEST_HIDDEN", &value)
        .args([
            "exec",
            "--env",
            "MOAT_TEST_PASS",
            "--env",
            "EXTRA=1",
            "--",
            "/usr/bin/env",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("MOAT_TEST_PASS={value}")),
        "{stdout}"
    );
    assert!(stdout.contains("EXTRA=1"));
    assert!(!stdout.contains("MOAT_TEST_HIDDEN"));
}

#[test]
fn only_standard_descriptors_are_open() {
    // Leak a descriptor into moat on purpose (close-on-exec cleared, so moat
    // really inherits it): it must not reach the program.
    let leaked = std::fs::File::open("/etc/hostname").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&leaked);
    // SAFETY: clearing FD_CLOEXEC on a descriptor this test owns.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    let run = probe_run(&[], &["fds"]);
    drop(leaked);
    assert_eq!(run.stdout.trim(), "0,1,2", "{}", run.stderr);
}

#[test]
fn no_capabilities_no_new_privs_seccomp_filter() {
    let run = exec(&[], &["/bin/cat", "/proc/self/status"]);
    let field = |name: &str| {
        run.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(str::trim)
            .unwrap_or("missing")
            .to_owned()
    };
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(caps), "0000000000000000", "{caps}");
    }
    assert_eq!(field("NoNewPrivs"), "1");
    assert_eq!(field("Seccomp"), "2");
    assert_all_layers_enforced(&run);
}

#[test]
fn the_host_uid_behind_the_sandbox_is_not_root() {
    let run = probe_run(&[], &["host-uid"]);
    let host_uid: u32 = run.stdout.trim().parse().expect("a mapped uid");
    assert_ne!(host_uid, 0);
    assert_eq!(run.report["enforcement"]["hostUid"], host_uid);
    // Seen from the host too: a sleeping program's real uid.
    let marker = format!(
        "4{}",
        &token()[..6].replace(|c: char| !c.is_ascii_digit(), "1")
    );
    let mut child = Command::new(MOAT)
        .args(["exec", "--timeout", "20s", "--", "/bin/sleep", &marker])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut uid_line = None;
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        let found = host_processes_with(&format!("sleep {marker}"));
        if let Some(line) = found.iter().find(|l| {
            l.split_once(": ")
                .is_some_and(|(_, cmd)| cmd.starts_with("/bin/sleep"))
        }) {
            let pid = line.split(':').next().unwrap();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            uid_line = status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .map(str::to_owned);
            break;
        }
    }
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    let uid_line = uid_line.expect("the sandboxed sleep was seen on the host");
    assert!(
        uid_line.split_whitespace().skip(1).all(|u| u != "0"),
        "{uid_line}"
    );
}

#[test]
fn host_processes_hostname_and_sysv_ipc_are_invisible() {
    // A SysV message queue on the host must not be visible inside.
    // SAFETY: msgget/msgctl on a private queue this test owns.
    let queue = unsafe { libc::msgget(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600) };
    assert!(queue >= 0);
    let run = exec(
        &[],
        &[
            "/bin/sh",
            "-c",
            "ls /proc | grep -c '^[0-9]'; hostname; cat /proc/sysvipc/msg | wc -l",
        ],
    );
    // SAFETY: removes the queue created above.
    unsafe { libc::msgctl(queue, libc::IPC_RMID, std::ptr::null_mut()) };
    let lines: Vec<&str> = run.stdout.lines().collect();
    let pids: u32 = lines[0].parse().unwrap();
    assert!(pids <= 6, "sandbox sees {pids} processes");
    assert_eq!(lines[1], "moat");
    assert_ne!(
        lines[1],
        std::fs::read_to_string("/etc/hostname").unwrap().trim()
    );
    assert_eq!(lines[2], "1", "only the header of /proc/sysvipc/msg");
}

#[test]
fn network_off_has_only_loopback_and_reaches_no_host_listener() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let abstract_name = format!("moat-test-{}", token());
    let abstract_listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&abstract_name).unwrap();
        UnixListener::bind_addr(&addr).unwrap()
    };
    abstract_listener.set_nonblocking(true).unwrap();

    let interfaces = exec(&[], &["/bin/cat", "/proc/net/dev"]);
    let names: Vec<&str> = interfaces
        .stdout
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(names, vec!["lo"], "{}", interfaces.stdout);

    let tcp = probe_run(&[], &["connect", &format!("127.0.0.1:{port}")]);
    assert_eq!(
        tcp.stdout.trim(),
        "errno=111",
        "ECONNREFUSED inside: {}",
        tcp.stdout
    );
    let unix = probe_run(&[], &["abstract", &abstract_name]);
    assert_eq!(unix.stdout.trim(), "errno=111", "{}", unix.stdout);

    // Nothing arrived on the host side.
    assert!(listener.accept().is_err());
    assert!(abstract_listener.accept().is_err());
    assert_eq!(tcp.report["enforcement"]["network"], "off");
}

#[test]
fn network_full_is_an_explicit_choice_and_reported() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let run = probe_run(
        &["--network", "full"],
        &["connect", &format!("127.0.0.1:{port}")],
    );
    assert_eq!(run.stdout.trim(), "ok", "{}", run.stderr);
    let mut stream = listener.accept().unwrap().0;
    let mut buf = Vec::new();
    let _ = stream.read_to_end(&mut buf);
    let detail = run.report["enforcement"]["namespaces"]["detail"]
        .as_str()
        .unwrap();
    assert!(
        detail.contains("host network namespace is shared"),
        "{detail}"
    );
}

/// init is the only process in the sandbox that ever held capabilities (in
/// the sandbox's user namespace, to build the root). The program must not be
/// able to reach into it, and by the time the program runs it holds none.
#[test]
fn the_program_cannot_take_over_init() {
    for (as_user, extra) in [(None, vec![]), (Some(65534), vec!["--allow-degraded"])] {
        let bin = tempfile::tempdir().unwrap();
        make_world_accessible(bin.path());
        for (from, name) in [(std::path::PathBuf::from(MOAT), "moat"), (probe(), "probe")] {
            let to = bin.path().join(name);
            std::fs::copy(from, &to).unwrap();
        }
        let moat = bin.path().join("moat");
        let probe_dir = format!("{}:/probe", bin.path().display());
        let mut args = vec!["--ro", probe_dir.as_str()];
        args.extend(&extra);
        for target in ["/proc/1/mem", "/proc/1/environ"] {
            let run = exec_as(
                moat.to_str().unwrap(),
                &args,
                &["/probe/probe", "open-rw", target],
                as_user,
            );
            assert_eq!(
                run.stdout.trim(),
                "errno=13",
                "{as_user:?} {target}: {}",
                run.stderr
            );
        }
        let caps = exec_as(
            moat.to_str().unwrap(),
            &args,
            &["/bin/sh", "-c", "sleep 0.2; /probe/probe init-caps"],
            as_user,
        );
        assert_eq!(
            caps.stdout.trim(),
            "0000000000000000",
            "{as_user:?}: {}",
            caps.stderr
        );
    }
}

#[test]
fn a_terminal_on_stdin_is_replaced_by_dev_null() {
    let pty = Pty::open();
    let output = Command::new(MOAT)
        .args(["exec", "--", "/usr/bin/readlink", "/proc/self/fd/0"])
        .stdin(pty.slave.try_clone().unwrap())
        .output()
        .unwrap();
    drop(pty);
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "/dev/null");
    // A pipe is passed on.
    let mut piped = Command::new(MOAT)
        .args(["exec", "--", "/bin/cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    piped
        .stdin
        .take()
        .unwrap()
        .write_all(b"through a pipe")
        .unwrap();
    let out = piped.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through a pipe");
}

/// The network namespace is made by a helper beside the sandbox and joined by
/// init, and init is pinned to a CPU of its own while it sets up: neither
/// shows. The program has a working loopback in a namespace that is not the
/// host's, and exactly the launcher's CPUs, whatever they are and whoever
/// launched it.
#[test]
fn the_program_gets_the_launchers_cpus_and_a_namespace_of_its_own() {
    let script = "grep Cpus_allowed_list /proc/self/status; readlink /proc/self/ns/net; \
                  python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen(); \
                  c=socket.create_connection(s.getsockname()); print(\"loopback ok\")'";
    let host_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    let own_cpus = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .unwrap()
        .to_owned();
    let check = |stdout: &str, cpus: &str| {
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 3, "{stdout}");
        assert_eq!(lines[0], cpus, "{stdout}");
        assert_ne!(lines[1], host_net.to_str().unwrap(), "{stdout}");
        assert!(lines[1].starts_with("net:["), "{stdout}");
        assert_eq!(lines[2], "loopback ok", "{stdout}");
    };

    let run = exec(&[], &["/bin/sh", "-c", script]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    check(&run.stdout, &own_cpus);

    let unprivileged = exec_as(
        MOAT,
        &["--allow-degraded"],
        &["/bin/sh", "-c", script],
        Some(65534),
    );
    assert_eq!(unprivileged.code, 0, "{}", unprivileged.stderr);
    check(&unprivileged.stdout, &own_cpus);

    // A launcher confined to one CPU pins nothing, and passes that CPU on.
    let output = Command::new("taskset")
        .args(["-c", "0", MOAT, "exec", "--", "/bin/sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    check(
        &String::from_utf8_lossy(&output.stdout),
        "Cpus_allowed_list:\t0",
    );
}
