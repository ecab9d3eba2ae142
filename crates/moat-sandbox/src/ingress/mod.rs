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
//! namespaces, as the launcher's host uid: the program, as another uid in
//! its own pid namespace, can neither see nor signal it, and reaches it only
//! through the connections the runtime opens.
//!
//! One `network.ingress` event per connection (see [`relay`]) comes back to
//! the launcher when the sandbox has ended.

mod http_meta;
mod relay;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
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
    listener: UnixListener,
    ino: u64,
}

impl Listeners {
    /// Binds each exposed port's socket, readable and writable by the
    /// launcher's user only.
    pub(crate) fn bind(expose: &[ExposedPort]) -> Result<Listeners, SetupError> {
        let mut listeners = Listeners { bound: Vec::new() };
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
            let listener = UnixListener::bind(&exposed.socket).map_err(|e| fail("binding", e))?;
            let meta =
                std::fs::symlink_metadata(&exposed.socket).map_err(|e| fail("reading", e))?;
            listeners.bound.push(Bound {
                port: exposed.port,
                path: exposed.socket.clone(),
                listener,
                ino: meta.ino(),
            });
            std::fs::set_permissions(&exposed.socket, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| fail("restricting", e))?;
        }
        Ok(listeners)
    }

    pub(crate) fn raw_fds(&self) -> Vec<i32> {
        self.bound.iter().map(|b| b.listener.as_raw_fd()).collect()
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

/// The launcher's side of the forwarder's first message.
const READY: &str = "ready ";
const FAILED: &str = "failed ";

/// Forks the forwarder into the sandbox's network namespace. Returns once it
/// is confined and serving, with the description of its confinement. The
/// caller must be single-threaded.
pub(crate) fn start(
    listeners: &Listeners,
    userns: &OwnedFd,
    netns: OwnedFd,
    allow_degraded: bool,
) -> Result<(Forwarder, String), SetupError> {
    let (ours, theirs) =
        UnixStream::pair().map_err(|e| SetupError::io(Layer::Network, "forwarder socket", e))?;
    let ports: Vec<(u16, i32)> = listeners
        .bound
        .iter()
        .map(|b| (b.port, b.listener.as_raw_fd()))
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
            allow_degraded,
        })
    })?;
    drop(netns);
    let mut first = String::new();
    let read = BufReader::new(&ours).read_line(&mut first);
    let first = first.trim_end();
    match read {
        Ok(_) if first.starts_with(READY) => Ok((
            Forwarder {
                helper,
                control: ours,
            },
            first[READY.len()..].to_owned(),
        )),
        Ok(_) if first.starts_with(FAILED) => Err(SetupError::new(
            Layer::Network,
            format!("the ingress forwarder: {}", &first[FAILED.len()..]),
        )),
        Ok(_) => Err(SetupError::new(
            Layer::Network,
            "the ingress forwarder ended before it was ready",
        )),
        Err(e) => Err(SetupError::io(Layer::Network, "the ingress forwarder", e)),
    }
}

impl Forwarder {
    /// Stops the forwarder (the sandbox has ended) and returns the
    /// connections it relayed, at most [`MAX_EVENTS`].
    pub(crate) fn finish(self) -> Result<Vec<NetworkIngress>, String> {
        // End of file on its side is the signal to stop.
        let _ = self.control.shutdown(std::net::Shutdown::Write);
        let mut events = Vec::new();
        // Its records are at most MAX_EVENTS lines of a few hundred bytes.
        let bounded = std::io::Read::take(&self.control, (MAX_EVENTS as u64) * 1024);
        let reader = BufReader::new(bounded);
        for line in reader.lines() {
            let line = line.map_err(|e| format!("reading the forwarder's records: {e}"))?;
            if events.len() >= MAX_EVENTS {
                break;
            }
            let event: NetworkIngress = serde_json::from_str(&line)
                .map_err(|e| format!("a record of the forwarder does not parse: {e}"))?;
            events.push(event);
        }
        let code = self.helper.wait();
        if code != 0 {
            return Err(format!("the ingress forwarder exited with {code}"));
        }
        Ok(events)
    }
}

/// Writes one line to the launcher; the forwarder has nothing better to do
/// with a failure than to stop.
fn tell(control: &mut UnixStream, line: &str) -> std::io::Result<()> {
    control.write_all(line.as_bytes())?;
    control.write_all(b"\n")
}
