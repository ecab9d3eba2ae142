//! The `ingress-only` network mode's way in: the runtime reaches the ports a
//! sandbox exposes through unix sockets on the host, and nothing else can.
//!
//! The launcher binds one unix socket per exposed port before the clone (a
//! path that exists, or cannot be bound, refuses the run). Once the sandbox's
//! network namespace exists, it forks the forwarder, a helper that joins the
//! sandbox's user and network namespaces (as the namespace helper does, see
//! `netns`), drops every capability, confines itself with Landlock (no file
//! at all; TCP connect only to the exposed ports, no bind) and then relays
//! each connection accepted on a socket to the program's port on the
//! sandbox's loopback. The forwarder stays in the host's mount and pid
//! namespaces, but as the program's own ids in the sandbox's user namespace
//! (the run's host uid when root launched it), without supplementary groups
//! or stderr: the program, in its own pid namespace with signals scoped,
//! can neither see nor signal it, and reaches it only through the
//! connections the runtime opens.
//!
//! One `network.ingress` event per connection (see [`relay`]) comes back to
//! the launcher when the sandbox has ended.

mod http_meta;
mod relay;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use moat_core::event_data::NetworkIngress;

use crate::error::{Layer, SetupError};
use crate::helper::{self, Helper};
use crate::spec::ExposedPort;

/// Most `network.ingress` events one sandbox records; the last says how
/// many connections came after it.
pub(crate) const MAX_EVENTS: usize = 10_000;

/// The host-side sockets of one sandbox. Dropping them removes their paths
/// (when they are still the sockets bound here).
#[derive(Debug)]
pub(crate) struct Listeners {
    bound: Vec<Bound>,
}

#[derive(Debug)]
struct Bound {
    port: u16,
    path: PathBuf,
    /// The launcher's copy, until the forwarder holds it (then closed, so
    /// that a forwarder gone early means refused connections, not hung ones).
    listener: Option<UnixListener>,
    ino: u64,
}

impl Listeners {
    /// Binds each exposed port's socket, readable and writable by the
    /// launcher's user only: made under a umask that leaves it mode 0600
    /// from its first moment (the launcher is single-threaded here, so the
    /// umask changes nobody else's files), never chmod'ed by path.
    pub(crate) fn bind(expose: &[ExposedPort]) -> Result<Listeners, SetupError> {
        let mut listeners = Listeners { bound: Vec::new() };
        // SAFETY: umask only sets a mask of this (single-threaded) process.
        let previous = unsafe { libc::umask(0o177) };
        let bound = (|| {
            for exposed in expose {
                let fail = |what: &str, e: std::io::Error| {
                    SetupError::io(
                        Layer::Network,
                        format!(
                            "{what} {} (port {})",
                            exposed.socket.display(),
                            exposed.port
                        ),
                        e,
                    )
                };
                let listener =
                    UnixListener::bind(&exposed.socket).map_err(|e| fail("binding", e))?;
                let meta =
                    std::fs::symlink_metadata(&exposed.socket).map_err(|e| fail("reading", e))?;
                listeners.bound.push(Bound {
                    port: exposed.port,
                    path: exposed.socket.clone(),
                    listener: Some(listener),
                    ino: meta.ino(),
                });
            }
            Ok(())
        })();
        // SAFETY: as above, putting the caller's mask back.
        unsafe { libc::umask(previous) };
        bound.map(|()| listeners)
    }

    pub(crate) fn raw_fds(&self) -> Vec<i32> {
        self.bound
            .iter()
            .filter_map(|b| b.listener.as_ref().map(|l| l.as_raw_fd()))
            .collect()
    }

    /// The forwarder holds the listeners now.
    fn handed_over(&mut self) {
        for bound in &mut self.bound {
            bound.listener = None;
        }
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for bound in &self.bound {
            // Only our own socket: something else may have replaced it.
            if let Ok(meta) = std::fs::symlink_metadata(&bound.path)
                && meta.file_type().is_socket()
                && meta.ino() == bound.ino
            {
                let _ = std::fs::remove_file(&bound.path);
            }
        }
    }
}

/// The running forwarder of one sandbox.
pub(crate) struct Forwarder {
    helper: Helper,
    control: UnixStream,
}

/// The forwarder's first message: serving, confined fully or (allowed by
/// `--allow-degraded`) less, or not.
const READY: &str = "ready ";
const READY_DEGRADED: &str = "degraded ";
const FAILED: &str = "failed ";

/// How the forwarder is confined, for the report.
pub(crate) struct Confinement {
    pub(crate) note: String,
    /// Landlock held only partly or not at all (`--allow-degraded`).
    pub(crate) degraded: bool,
}

/// Who the forwarder becomes in the sandbox's user namespace: the
/// program's own ids there (the run's host uid when root launched it), not
/// the launcher's; with `clear_groups`, no supplementary group either.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForwarderIds {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) clear_groups: bool,
}

/// Forks the forwarder into the sandbox's network namespace. Returns once it
/// is confined and serving, with how it is confined. The caller must be
/// single-threaded.
pub(crate) fn start(
    listeners: &mut Listeners,
    userns: &OwnedFd,
    netns: OwnedFd,
    ids: ForwarderIds,
    allow_degraded: bool,
) -> Result<(Forwarder, Confinement), SetupError> {
    let (ours, theirs) =
        UnixStream::pair().map_err(|e| SetupError::io(Layer::Network, "forwarder socket", e))?;
    let ports: Vec<(u16, i32)> = listeners
        .bound
        .iter()
        .filter_map(|b| b.listener.as_ref().map(|l| (b.port, l.as_raw_fd())))
        .collect();
    let mut keep = listeners.raw_fds();
    keep.extend([theirs.as_raw_fd(), userns.as_raw_fd(), netns.as_raw_fd()]);
    let (userns_fd, netns_fd) = (userns.as_raw_fd(), netns.as_raw_fd());
    let helper = helper::spawn_helper(&keep, move || {
        relay::forwarder_main(relay::ForwarderPlan {
            control: theirs,
            userns: userns_fd,
            netns: netns_fd,
            ports,
            ids,
            allow_degraded,
        })
    })?;
    drop(netns);
    listeners.handed_over();
    let mut first = String::new();
    let read = BufReader::new(&ours).read_line(&mut first);
    let first = first.trim_end();
    let ready = [(READY, false), (READY_DEGRADED, true)]
        .into_iter()
        .find_map(|(tag, degraded)| first.strip_prefix(tag).map(|note| (note, degraded)));
    match (read, ready) {
        (Ok(_), Some((note, degraded))) => Ok((
            Forwarder {
                helper,
                control: ours,
            },
            Confinement {
                note: note.to_owned(),
                degraded,
            },
        )),
        (Ok(_), None) if first.starts_with(FAILED) => Err(SetupError::new(
            Layer::Network,
            format!("the ingress forwarder: {}", &first[FAILED.len()..]),
        )),
        (Ok(_), None) => Err(SetupError::new(
            Layer::Network,
            "the ingress forwarder ended before it was ready",
        )),
        (Err(e), _) => Err(SetupError::io(Layer::Network, "the ingress forwarder", e)),
    }
}

impl Forwarder {
    /// Stops the forwarder (the sandbox has ended) and returns the
    /// connections it relayed, at most [`MAX_EVENTS`], and what went wrong
    /// with the rest, if anything did.
    pub(crate) fn finish(self) -> (Vec<NetworkIngress>, Option<String>) {
        // End of file on its side is the signal to stop.
        let _ = self.control.shutdown(std::net::Shutdown::Write);
        let mut events = Vec::new();
        let mut problem = None;
        // Its records are at most MAX_EVENTS lines of a few hundred bytes.
        let bounded = std::io::Read::take(&self.control, (MAX_EVENTS as u64) * 1024);
        for line in BufReader::new(bounded).lines() {
            let parsed = line
                .map_err(|e| format!("reading the forwarder's records: {e}"))
                .and_then(|line| {
                    serde_json::from_str::<NetworkIngress>(&line)
                        .map_err(|e| format!("a record of the forwarder does not parse: {e}"))
                });
            match parsed {
                Ok(event) if events.len() < MAX_EVENTS => events.push(event),
                Ok(_) => break,
                Err(e) => {
                    problem = Some(e);
                    break;
                }
            }
        }
        let code = self.helper.wait();
        if code != 0 && problem.is_none() {
            problem = Some(format!("the ingress forwarder exited with {code}"));
        }
        (events, problem)
    }
}

/// Writes one line to the launcher; the forwarder has nothing better to do
/// with a failure than to stop.
fn tell(control: &mut UnixStream, line: &str) -> std::io::Result<()> {
    control.write_all(line.as_bytes())?;
    control.write_all(b"\n")
}
