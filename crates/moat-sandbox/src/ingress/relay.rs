//! The forwarder's body: join the sandbox's network, confine, relay.
//!
//! Each accepted connection gets a thread (at most [`MAX_ACTIVE`] at once)
//! that connects to the program's port on the sandbox's loopback and copies
//! both ways; one `network.ingress` record per connection, kept here until
//! the launcher says the sandbox has ended.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moat_core::event_data::NetworkIngress;

use super::http_meta::{self, FirstLine};
use super::{FAILED, ForwarderIds, MAX_EVENTS, READY, READY_DEGRADED, tell};

/// Connections relayed at once; more are closed at once (and recorded).
const MAX_ACTIVE: usize = 128;

/// How long the sandbox's port has to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long relays still running when the sandbox ended get to finish.
const GRACE: Duration = Duration::from_secs(2);

pub(in crate::ingress) struct ForwarderPlan {
    pub(in crate::ingress) control: UnixStream,
    pub(in crate::ingress) userns: RawFd,
    pub(in crate::ingress) netns: RawFd,
    /// Each exposed port with its (inherited) host listener.
    pub(in crate::ingress) ports: Vec<(u16, RawFd)>,
    pub(in crate::ingress) ids: ForwarderIds,
    pub(in crate::ingress) allow_degraded: bool,
}

/// The forwarder process's whole life; its exit code.
pub(in crate::ingress) fn forwarder_main(plan: ForwarderPlan) -> i32 {
    let ForwarderPlan {
        mut control,
        userns,
        netns,
        ports,
        ids,
        allow_degraded,
    } = plan;
    let exposed: Vec<u16> = ports.iter().map(|(port, _)| *port).collect();
    let confined = enter(userns, netns, ids).and_then(|()| confine(&exposed, allow_degraded));
    let (fully, confined) = match confined {
        Ok(confined) => confined,
        Err(e) => {
            let _ = tell(&mut control, &format!("{FAILED}{e}"));
            return 1;
        }
    };
    let listeners: Vec<(u16, UnixListener)> = ports
        .into_iter()
        // SAFETY: each descriptor is a listening unix socket the launcher
        // bound and this process inherited; nothing else here owns it.
        .map(|(port, fd)| (port, unsafe { UnixListener::from_raw_fd(fd) }))
        .collect();
    let ready = if fully { READY } else { READY_DEGRADED };
    if tell(&mut control, &format!("{ready}{confined}")).is_err() {
        return 1;
    }
    let records = Arc::new(Records::default());
    serve(&control, &listeners, &records);
    // The sandbox has ended: its sockets are gone, so relays end quickly.
    let deadline = Instant::now() + GRACE;
    while records.active() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for line in records.take() {
        if tell(&mut control, &line).is_err() {
            return 1;
        }
    }
    0
}

/// Joins the sandbox's user namespace (for the rights over its network
/// namespace), then its network namespace; becomes the program's ids there
/// and gives up every capability; stderr goes to `/dev/null` (the
/// launcher's may be a terminal).
fn enter(userns: RawFd, netns: RawFd, ids: ForwarderIds) -> Result<(), String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: setns, setgroups, setresgid, setresuid, open and dup2 with
    // descriptors this process inherited or opened, ids and constants; the
    // process is single-threaded here (fresh fork, no thread started).
    unsafe {
        if libc::setns(userns, libc::CLONE_NEWUSER) != 0 {
            return Err(os("entering the sandbox's user namespace"));
        }
        if libc::setns(netns, libc::CLONE_NEWNET) != 0 {
            return Err(os("entering the sandbox's network namespace"));
        }
        libc::close(userns);
        libc::close(netns);
        if ids.clear_groups && libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(os("clearing supplementary groups"));
        }
        if libc::setresgid(ids.gid, ids.gid, ids.gid) != 0 {
            return Err(os("taking the program's gid"));
        }
        if libc::setresuid(ids.uid, ids.uid, ids.uid) != 0 {
            return Err(os("taking the program's uid"));
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null < 0 || libc::dup2(null, 2) < 0 {
            return Err(os("stderr to /dev/null"));
        }
        libc::close(null);
    }
    // setresuid cleared the capabilities only if it left uid 0 (in the
    // namespace); otherwise they are dropped now.
    if !crate::confine::holds_no_capability() {
        crate::confine::drop_privileges().map_err(|e| e.to_string())?;
    }
    if !crate::confine::holds_no_capability() {
        return Err("the forwarder still holds a capability".into());
    }
    Ok(())
}

/// Landlock: no file at all, TCP connect only to the exposed ports, no bind,
/// no signal or abstract socket outside itself; then seccomp. Returns
/// whether Landlock held fully, and the description for the report.
fn confine(ports: &[u16], allow_degraded: bool) -> Result<(bool, String), String> {
    use landlock::RulesetStatus;
    let status =
        crate::helper::restrict(&[], Some(ports), allow_degraded).map_err(|e| e.to_string())?;
    // Then seccomp (no_new_privs is set): nothing of what a relay never
    // does (change a file, signal or execute anything, other sockets).
    let filter = crate::seccomp::compile_forwarder().map_err(|e| e.to_string())?;
    crate::seccomp::install(&filter, false).map_err(|e| format!("seccomp: {e}"))?;
    let what = match status {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced if allow_degraded => {
            "partially enforced (kernel ABI too old)"
        }
        RulesetStatus::NotEnforced if allow_degraded => "not enforced (Landlock unavailable)",
        _ => return Err("Landlock cannot confine the forwarder on this kernel".into()),
    };
    Ok((
        status == RulesetStatus::FullyEnforced,
        format!(
            "the forwarder is in the sandbox's network namespace as the program's ids, with no \
             capability, a seccomp filter (no file change, signal, exec or other socket kind) \
             and Landlock (no file, TCP connect only to the exposed ports, no bind) {what}"
        ),
    ))
}

/// Accepts until the launcher closes its side of `control`.
fn serve(control: &UnixStream, listeners: &[(u16, UnixListener)], records: &Arc<Records>) {
    let mut polled: Vec<libc::pollfd> = std::iter::once(control.as_raw_fd())
        .chain(listeners.iter().map(|(_, l)| l.as_raw_fd()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `polled` is a valid array of pollfd of the given length.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, -1) };
        if n < 0 {
            if crate::sys::errno() == libc::EINTR {
                continue;
            }
            return;
        }
        // The launcher writes nothing after the first line's answer: any
        // readiness of `control` is its end of file.
        if polled[0].revents != 0 {
            return;
        }
        for (i, (port, listener)) in listeners.iter().enumerate() {
            if polled[i + 1].revents & libc::POLLIN == 0 {
                continue;
            }
            let client = match listener.accept() {
                Ok((client, _)) => client,
                Err(_) => {
                    // Out of descriptors, say: wait rather than spin.
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let port = *port;
            let Some(conn) = records.open(port) else {
                records.finish(refused(port, "too many connections at once"));
                continue;
            };
            let shared = Arc::clone(records);
            let spawned = std::thread::Builder::new()
                .name(format!("ingress-{port}"))
                .spawn(move || {
                    let record = relay(port, client, &conn);
                    shared.close(&conn);
                    shared.finish(record);
                });
            if spawned.is_err() {
                records.finish(refused(port, "the forwarder could not start a thread"));
            }
        }
    }
}

fn refused(port: u16, detail: &str) -> NetworkIngress {
    NetworkIngress {
        port,
        detail: Some(detail.into()),
        ..NetworkIngress::default()
    }
}

/// One connection, from the first byte to the last.
fn relay(port: u16, client: UnixStream, conn: &Conn) -> NetworkIngress {
    let server = match connect(port) {
        Ok(server) => server,
        Err(e) => {
            let mut record = conn.record();
            record.detail = Some(format!("nothing listens on port {port} ({e})"));
            return record;
        }
    };
    let copied = (client.try_clone(), server.try_clone());
    let (Ok(client_back), Ok(server_in)) = copied else {
        let mut record = conn.record();
        record.detail = Some("the forwarder ran out of descriptors".into());
        return record;
    };
    std::thread::scope(|scope| {
        // In: the runtime's bytes to the program.
        scope.spawn(|| {
            copy(&client, &server_in, &conn.bytes_in, &mut |line| {
                if let Some((method, path)) = http_meta::request_line(line) {
                    conn.set(|m| {
                        m.method = Some(method);
                        m.path = Some(path);
                    });
                }
            });
            let _ = server_in.shutdown(Shutdown::Write);
        });
        // Out: the program's answer.
        copy(&server, &client_back, &conn.bytes_out, &mut |line| {
            if let Some(status) = http_meta::status_line(line) {
                conn.set(|m| m.status = Some(status));
            }
        });
        // The program closed (or died): the runtime's side is done too, so
        // the other direction's read ends rather than waiting on the runtime.
        let _ = client_back.shutdown(Shutdown::Both);
    });
    conn.record()
}

/// The program's port on the sandbox's loopback, IPv4 first.
fn connect(port: u16) -> std::io::Result<TcpStream> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT).or_else(|first| {
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
        TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| first)
    })
}

/// Copies until end of file or an error, counting, and showing the first
/// line to `first_line`.
fn copy(
    mut from: impl Read,
    mut to: impl Write,
    count: &AtomicU64,
    first_line: &mut dyn FnMut(&[u8]),
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut first = FirstLine::default();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(line) = first.feed(&buf[..n]) {
            first_line(&line);
        }
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// One connection's figures, while it runs.
struct Conn {
    id: u64,
    port: u16,
    started: Instant,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    meta: Mutex<Meta>,
}

#[derive(Default)]
struct Meta {
    method: Option<String>,
    path: Option<String>,
    status: Option<u16>,
}

impl Conn {
    fn set(&self, change: impl FnOnce(&mut Meta)) {
        if let Ok(mut meta) = self.meta.lock() {
            change(&mut meta);
        }
    }

    fn record(&self) -> NetworkIngress {
        let mut record = NetworkIngress {
            port: self.port,
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..NetworkIngress::default()
        };
        if let Ok(meta) = self.meta.lock() {
            record.method.clone_from(&meta.method);
            record.path.clone_from(&meta.path);
            record.status = meta.status;
        }
        record
    }
}

/// Every connection's record, finished or still running.
#[derive(Default)]
struct Records {
    state: Mutex<RecordState>,
}

#[derive(Default)]
struct RecordState {
    next_id: u64,
    active: HashMap<u64, Arc<Conn>>,
    done: Vec<NetworkIngress>,
    /// Connections past [`MAX_EVENTS`], counted only.
    unrecorded: u64,
}

impl Records {
    fn open(&self, port: u16) -> Option<Arc<Conn>> {
        let mut state = self.state.lock().ok()?;
        if state.active.len() >= MAX_ACTIVE {
            return None;
        }
        state.next_id += 1;
        let conn = Arc::new(Conn {
            id: state.next_id,
            port,
            started: Instant::now(),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            meta: Mutex::new(Meta::default()),
        });
        state.active.insert(conn.id, Arc::clone(&conn));
        Some(conn)
    }

    fn close(&self, conn: &Conn) {
        if let Ok(mut state) = self.state.lock() {
            state.active.remove(&conn.id);
        }
    }

    fn finish(&self, record: NetworkIngress) {
        if let Ok(mut state) = self.state.lock() {
            if state.done.len() < MAX_EVENTS - 1 {
                state.done.push(record);
            } else {
                state.unrecorded += 1;
            }
        }
    }

    fn active(&self) -> usize {
        self.state.lock().map_or(0, |s| s.active.len())
    }

    /// Every record as a JSON line: those finished, then those still
    /// running (cut by the sandbox's end), then the count of the rest.
    fn take(&self) -> Vec<String> {
        let Ok(mut state) = self.state.lock() else {
            return Vec::new();
        };
        let mut records = std::mem::take(&mut state.done);
        let active = std::mem::take(&mut state.active);
        for conn in active.values() {
            let mut record = conn.record();
            record.detail = Some("still open when the sandbox ended".into());
            if records.len() < MAX_EVENTS - 1 {
                records.push(record);
            } else {
                state.unrecorded += 1;
            }
        }
        if state.unrecorded > 0
            && let Some(last) = records.last_mut()
        {
            last.unrecorded = Some(state.unrecorded);
        }
        records
            .iter()
            .filter_map(|r| serde_json::to_string(r).ok())
            .collect()
    }
}
