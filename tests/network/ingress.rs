//! The `ingress-only` network mode: the program listens on the ports it
//! declares, the runtime reaches them through the unix sockets `moat exec`
//! prints, and nothing goes out.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::servers::*;
use super::common::*;
use super::{assert_no_request, denials, dump};
use serde_json::Value;

/// A `moat exec --network ingress-only` left running, with what it printed.
struct Serving {
    child: Child,
    /// The `curl --unix-socket ... http://localhost/` line moat printed.
    curl: String,
    socket: PathBuf,
    stderr: BufReader<std::process::ChildStderr>,
    dir: tempfile::TempDir,
}

impl Serving {
    /// Starts `python3 -m http.server PORT` over a workspace holding `file`,
    /// as `uid` (or root); its socket in a directory of the test's with
    /// `expose_dir`, else where moat makes one.
    fn start(port: u16, file: &str, uid: Option<u32>, moat: &str, expose_dir: bool) -> Serving {
        let dir = tempfile::tempdir().expect("tempdir");
        make_world_accessible(dir.path());
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).expect("ws");
        std::fs::write(ws.join(file), "served from the sandbox\n").expect("file");
        let sockets = dir.path().join("sockets");
        std::fs::create_dir(&sockets).expect("sockets");
        for path in [dir.path(), &ws, &sockets] {
            make_world_accessible(path);
            if let Some(uid) = uid {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
            }
        }
        let port_text = port.to_string();
        let mut command: Command = command_as(moat, uid);
        command.arg("exec");
        if uid.is_some() {
            // The machine's cgroups are not delegated to another user.
            command.arg("--without-cgroup-limits");
        }
        let mut child = command
            .args(["--network", "ingress-only", "--expose", &port_text])
            .args(expose_dir.then_some("--expose-dir"))
            .args(expose_dir.then_some(&sockets))
            .arg("--workspace")
            .arg(&ws)
            .arg("--events")
            .arg(dir.path().join("events.jsonl"))
            .arg("--report")
            .arg(dir.path().join("report.json"))
            .args(["--timeout", "2m", "--", "python3", "-m", "http.server"])
            .args([&port_text, "--directory", "/workspace"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("moat exec");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let mut printed = String::new();
        let mut curl = None;
        while curl.is_none() {
            let mut line = String::new();
            if stderr.read_line(&mut line).expect("stderr") == 0 {
                let _ = child.kill();
                panic!("moat exec ended before printing its socket:\n{printed}");
            }
            printed.push_str(&line);
            curl = line
                .strip_prefix("moat:")
                .map(str::trim)
                .filter(|l| l.starts_with("curl "))
                .map(str::to_owned);
        }
        let curl = curl.unwrap_or_default();
        let socket = PathBuf::from(
            curl.split_whitespace()
                .nth(2)
                .expect("curl --unix-socket PATH URL"),
        );
        assert!(
            printed.contains(&format!(
                "port {port} of the sandbox is at {}",
                socket.display()
            )),
            "{printed}"
        );
        // The socket is moat's user's alone from its first moment (moat
        // prints its path as the launcher starts, which then binds it).
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mode = std::fs::symlink_metadata(&socket)
            .expect("socket")
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        if expose_dir {
            assert_eq!(socket, sockets.join(format!("{port}.sock")), "{printed}");
        } else {
            // A directory of its own, only moat's user may enter.
            let made = socket.parent().expect("parent");
            let mode = std::fs::metadata(made).expect("socket dir").permissions();
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
                0o700
            );
        }
        Serving {
            child,
            curl,
            socket,
            stderr,
            dir,
        }
    }

    /// Runs `command` through a shell until it succeeds (the server inside
    /// takes a moment to listen); its stdout.
    fn until_served(&self, command: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("sh")
                .args(["-c", command])
                .output()
                .expect("sh");
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            assert!(
                Instant::now() < deadline,
                "never served: {command}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Interrupts moat (it forwards the interrupt, the server ends) and
    /// returns its events and report.
    fn stop(mut self) -> (Vec<Value>, Value, String, tempfile::TempDir) {
        // SIGINT to the pid of the child this test started (setpriv execs moat).
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-INT", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -INT {pid}");
        let status = self.child.wait().expect("wait");
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stderr, &mut rest);
        assert!(status.code().is_some(), "moat itself was killed: {rest}");
        let events = std::fs::read_to_string(self.dir.path().join("events.jsonl"))
            .expect("events")
            .lines()
            .map(|l| serde_json::from_str(l).expect("event"))
            .collect();
        let report = std::fs::read_to_string(self.dir.path().join("report.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        (events, report, rest, self.dir)
    }
}

fn ingress_events(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["type"] == "network.ingress")
        .collect()
}

fn serves_through_the_printed_socket(uid: Option<u32>, moat: &str, expose_dir: bool) {
    let port = free_port();
    let file = format!("page-{}.txt", moat_core::random::hex(6));
    let serving = Serving::start(port, &file, uid, moat, expose_dir);

    // The command moat printed, as printed: the directory listing.
    let listing = serving.until_served(&format!("{} --fail --silent --show-error", serving.curl));
    assert!(listing.contains(&file), "{listing}");
    // A file, asked with a query that must not reach the record.
    let socket = serving.socket.display().to_string();
    let body = serving.until_served(&format!(
        "curl --fail --silent --unix-socket {socket} 'http://localhost/{file}?token=canary'"
    ));
    assert_eq!(body, "served from the sandbox\n");
    let missing = Command::new("curl")
        .args([
            "--silent",
            "--output",
            "/dev/null",
            "--write-out",
            "%{http_code}",
        ])
        .args(["--unix-socket", &socket, "http://localhost/missing"])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&missing.stdout), "404");
    // The sandbox's port is not the host's: nothing listens there.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the sandbox's port {port} is reachable on the host's loopback"
    );
    let socket_path = serving.socket.clone();
    let (events, report, stderr, dir) = serving.stop();

    let ingress = ingress_events(&events);
    let served = ingress
        .iter()
        .find(|e| e["data"]["path"] == format!("/{file}").as_str())
        .unwrap_or_else(|| panic!("no network.ingress for /{file}: {events:#?}"));
    assert_eq!(served["data"]["port"], port);
    assert_eq!(served["data"]["method"], "GET");
    assert_eq!(served["data"]["status"], 200);
    assert!(served["data"]["bytesOut"].as_u64().unwrap_or(0) > 0);
    assert!(served["data"]["bytesIn"].as_u64().unwrap_or(0) > 0);
    assert!(
        ingress
            .iter()
            .any(|e| e["data"]["path"] == "/missing" && e["data"]["status"] == 404),
        "{events:#?}"
    );
    let text = serde_json::to_string(&events).unwrap_or_default();
    assert!(
        !text.contains("canary"),
        "a query reached the record: {text}"
    );
    assert!(
        !text.contains("served from the sandbox"),
        "a body reached the record"
    );
    assert_eq!(report["enforcement"]["network"], "ingress-only", "{stderr}");
    let ns = report["enforcement"]["namespaces"]["detail"]
        .as_str()
        .unwrap_or_default();
    assert!(
        ns.contains(&format!("{port} at {}", socket_path.display())),
        "{ns}"
    );
    assert!(ns.contains("forwarder"), "{ns}");
    // Nothing is left behind: the socket, and the directory moat made.
    assert!(!socket_path.exists());
    assert_eq!(
        socket_path.parent().is_some_and(Path::exists),
        expose_dir,
        "{stderr}"
    );
    drop(dir);
}

#[test]
fn an_exposed_port_is_served_through_the_socket_moat_prints() {
    serves_through_the_printed_socket(None, MOAT, false);
}

#[test]
fn an_exposed_port_is_served_through_the_socket_when_moat_is_unprivileged() {
    let copy = unprivileged_copy();
    let moat = copy.path().join("moat").display().to_string();
    serves_through_the_printed_socket(Some(65534), &moat, true);
}

#[test]
fn an_ingress_only_program_reaches_nothing_and_binds_only_its_ports() {
    let server = Server::http();
    let host_port = server.port;
    let exposed = free_port();
    let script = format!(
        r#"
import errno, socket
def attempt(what, f):
    try:
        f()
        print(what, "OK")
    except OSError as e:
        print(what, "FAILED", errno.errorcode.get(e.errno, e.errno))
    except Exception as e:
        print(what, "FAILED", type(e).__name__)
attempt("host", lambda: socket.create_connection(("127.0.0.1", {host_port}), 3))
attempt("outside", lambda: socket.create_connection(("192.0.2.1", 80), 3))
attempt("proxy", lambda: socket.create_connection(("127.0.0.1", 3128), 3))
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("bind-other", lambda: socket.socket().bind(("127.0.0.1", 9000)))
attempt("bind-any", lambda: socket.socket().bind(("127.0.0.1", 0)))
server = socket.socket(socket.AF_INET6)
attempt("bind-exposed", lambda: server.bind(("::", {exposed})))
server.listen()
# Its own port, by every loopback name: not even that.
attempt("self-v4", lambda: socket.create_connection(("127.0.0.1", {exposed}), 3))
attempt("self-v6", lambda: socket.create_connection(("::1", {exposed}), 3))
attempt("self-mapped", lambda: socket.create_connection(("::ffff:127.0.0.1", {exposed}), 3))
"#
    );
    let expose = exposed.to_string();
    let run = exec(
        &["--network", "ingress-only", "--expose", &expose],
        &["/usr/bin/python3", "-c", &script],
    );
    assert_eq!(run.code, 0, "{}", dump(&run));
    for line in [
        "host FAILED EACCES",
        "outside FAILED EACCES",
        "proxy FAILED EACCES",
        "dns FAILED",
        "udp FAILED EPERM",
        "bind-other FAILED EACCES",
        "bind-any FAILED EACCES",
        "bind-exposed OK",
        "self-v4 FAILED EACCES",
        "self-v6 FAILED EACCES",
        "self-mapped FAILED EACCES",
    ] {
        assert!(run.stdout.contains(line), "{line}{}", dump(&run));
    }
    // Each refusal is on the record, with its address.
    let refused: Vec<&str> = denials(&run, "direct_connection")
        .iter()
        .filter_map(|e| e["data"]["address"].as_str())
        .collect();
    for address in [
        format!("127.0.0.1:{host_port}"),
        "192.0.2.1:80".into(),
        "127.0.0.1:3128".into(),
        format!("127.0.0.1:{exposed}"),
        format!("[::1]:{exposed}"),
    ] {
        assert!(
            refused.contains(&address.as_str()),
            "{address}{}",
            dump(&run)
        );
    }
    let binds = denials(&run, "network_not_allowed");
    assert!(
        binds
            .iter()
            .any(|e| e["data"]["address"] == "127.0.0.1:9000"),
        "{}",
        dump(&run)
    );
    run.assert_syscall_denied_event("socket");
    assert_no_request(&server, &run);
    let landlock = run.report["enforcement"]["landlock"]["detail"]
        .as_str()
        .unwrap_or_default();
    assert!(
        landlock.contains(&format!(
            "no TCP connect and TCP bind only to port {exposed}"
        )),
        "{landlock}"
    );
}

#[test]
fn a_connection_to_a_port_nothing_listens_on_is_recorded_as_such() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port().to_string();
    let sockets = dir.path().display().to_string();
    let socket = dir.path().join(format!("{port}.sock"));
    // The program listens on nothing; a client tries meanwhile.
    let client = {
        let socket = socket.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !socket.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            Command::new("curl")
                .args(["--silent", "--max-time", "5", "--unix-socket"])
                .arg(&socket)
                .arg("http://localhost/")
                .output()
                .expect("curl")
        })
    };
    let run = exec(
        &[
            "--network",
            "ingress-only",
            "--expose",
            &port,
            "--expose-dir",
            &sockets,
        ],
        &["/bin/sleep", "2"],
    );
    let answer = client.join().expect("client");
    assert_eq!(run.code, 0, "{}", dump(&run));
    assert!(!answer.status.success(), "{answer:?}");
    let ingress = ingress_events(&run.events);
    assert_eq!(ingress.len(), 1, "{}", dump(&run));
    let detail = ingress[0]["data"]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!("nothing listens on port {port}")),
        "{detail}"
    );
    assert!(!socket.exists());
}

#[test]
fn the_sockets_directory_must_be_private_and_out_of_the_sandboxs_sight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    let inside = ws.join("ports");
    let open = dir.path().join("open");
    for path in [&ws, &inside, &open] {
        std::fs::create_dir(path).expect("dir");
    }
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&inside, &link).expect("symlink");
    let workspace = ws.display().to_string();
    let cases = [
        (inside.display().to_string(), "which the sandbox sees"),
        (open.display().to_string(), "writable by nobody else"),
        (link.display().to_string(), "not a link"),
    ];
    for (expose_dir, message) in &cases {
        let run = exec(
            &[
                "--network",
                "ingress-only",
                "--expose",
                "8000",
                "--expose-dir",
                expose_dir,
                "--workspace",
                &workspace,
            ],
            &["/bin/true"],
        );
        assert_ne!(run.code, 0, "{expose_dir}{}", dump(&run));
        assert!(run.stderr.contains(message), "{expose_dir}{}", dump(&run));
        for path in [&inside, &open] {
            assert_eq!(std::fs::read_dir(path).map(|d| d.count()).unwrap_or(1), 0);
        }
    }
}

#[test]
fn exposing_needs_ingress_only_and_an_unprivileged_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let expose_dir = dir.path().display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--expose", "8000"], "add it"),
        (
            &["--network", "allowlist", "--expose", "8000"],
            "--network ingress-only",
        ),
        (
            &["--network", "ingress-only", "--expose", "80"],
            "1024-65535",
        ),
        (
            &[
                "--network",
                "ingress-only",
                "--expose",
                "8000",
                "--expose",
                "8000",
            ],
            "exposed twice",
        ),
        (
            &["--network", "ingress-only", "--expose", "http"],
            "invalid value",
        ),
    ];
    for (args, message) in cases {
        let mut all = args.to_vec();
        all.extend(["--expose-dir", &expose_dir]);
        let run = exec(&all, &["/bin/true"]);
        assert_eq!(run.code, 2, "{args:?}{}", dump(&run));
        assert!(run.stderr.contains(message), "{args:?}{}", dump(&run));
        // Refused before anything was made.
        assert_eq!(
            std::fs::read_dir(dir.path())
                .map(|d| d.count())
                .unwrap_or(1),
            0,
            "{args:?}"
        );
    }
    let run = exec(
        &[
            "--class",
            "microvm",
            "--network",
            "ingress-only",
            "--expose",
            "8000",
            "--expose-dir",
            &expose_dir,
        ],
        &["/bin/true"],
    );
    assert_eq!(run.code, 2, "{}", dump(&run));
    assert!(run.stderr.contains("ingress-only"), "{}", dump(&run));
    assert_eq!(
        std::fs::read_dir(dir.path())
            .map(|d| d.count())
            .unwrap_or(1),
        0
    );
}
