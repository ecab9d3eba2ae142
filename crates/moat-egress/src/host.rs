//! The proxy as a process of its own: [`serve_proxy`], its body, and
//! [`Egress`], the handle the (single-threaded) launcher or shell keeps on it.
//!
//! The proxy runs an async runtime, and the sandbox launcher must clone from
//! a single-threaded process; so the proxy is forked off once per run (by
//! whoever starts it: the fork and the confinement are the sandbox's
//! business, see `moat_shell::egress`) and driven over a unix socket: JSON
//! lines both ways, with each sandbox's listening socket attached to the
//! `serve` line that introduces it. Events are gathered in the proxy and
//! handed back when a listener is closed or a fetch returns, so the caller
//! records them in its own order.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use moat_core::Event;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::fetch::{FetchError, FetchRequest, FetchResponse};
use crate::gate::{Run, Scope};
use crate::policy::{EgressConfig, EgressPolicy, PolicyError};

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("egress policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("starting the egress proxy: {0}")]
    Start(String),
    #[error("talking to the egress proxy: {0}")]
    Channel(#[from] std::io::Error),
    #[error("the egress proxy answered: {0}")]
    Proxy(String),
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
enum Command {
    Serve {
        id: u64,
        policy: EgressPolicy,
        op_id: Option<String>,
    },
    Close {
        id: u64,
    },
    Fetch {
        id: u64,
        policy: EgressPolicy,
        op_id: Option<String>,
        request: FetchRequest,
    },
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Reply {
    id: u64,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    events: Vec<Event>,
    #[serde(default)]
    response: Option<FetchResponse>,
    #[serde(default)]
    refused: Option<FetchError>,
}

/// A sandbox listener being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served(u64);

/// The process a proxy runs in, as its starter keeps it: dropping it
/// must end the process. `Send`, so a shell holding one can move between
/// threads (the MCP server's, the fuzz target's).
pub trait ProxyProcess: Send {
    fn pid(&self) -> u32;
}

/// The handle on a running proxy process. Dropping it ends the proxy.
pub struct Egress {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    next: u64,
    process: Box<dyn ProxyProcess>,
}

impl Egress {
    /// The handle on a proxy that `process` runs ([`serve_proxy`] over the
    /// other end of `control`).
    pub fn over(
        control: UnixStream,
        process: Box<dyn ProxyProcess>,
    ) -> Result<Egress, EgressError> {
        let reader = BufReader::new(control.try_clone()?);
        Ok(Egress {
            stream: control,
            reader,
            next: 0,
            process,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    fn call(&mut self, command: &Command, fd: Option<&OwnedFd>) -> Result<Reply, EgressError> {
        let mut line =
            serde_json::to_vec(command).map_err(|e| EgressError::Proxy(e.to_string()))?;
        line.push(b'\n');
        let mut sent = 0;
        if let Some(fd) = fd {
            sent = crate::channel::send_with_fd(self.stream.as_fd(), &line, fd.as_fd())?;
        }
        self.stream.write_all(&line[sent..])?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(EgressError::Proxy("the proxy process is gone".into()));
        }
        let reply: Reply =
            serde_json::from_str(&answer).map_err(|e| EgressError::Proxy(e.to_string()))?;
        match reply.error {
            Some(error) => Err(EgressError::Proxy(error)),
            None => Ok(reply),
        }
    }

    /// Starts serving a sandbox's listener under `policy`.
    pub fn serve(
        &mut self,
        listener: OwnedFd,
        policy: &EgressPolicy,
        op_id: Option<&str>,
    ) -> Result<Served, EgressError> {
        policy.compile()?;
        self.next += 1;
        let id = self.next;
        let command = Command::Serve {
            id,
            policy: policy.clone(),
            op_id: op_id.map(str::to_owned),
        };
        self.call(&command, Some(&listener))?;
        Ok(Served(id))
    }

    /// Stops serving, cuts what is still open, and returns the events.
    pub fn close(&mut self, served: Served) -> Result<Vec<Event>, EgressError> {
        Ok(self.call(&Command::Close { id: served.0 }, None)?.events)
    }

    /// Makes one request under `policy`; returns the outcome and its events.
    #[allow(clippy::type_complexity)]
    pub fn fetch(
        &mut self,
        policy: &EgressPolicy,
        op_id: Option<&str>,
        request: &FetchRequest,
    ) -> Result<(Result<FetchResponse, FetchError>, Vec<Event>), EgressError> {
        policy.compile()?;
        self.next += 1;
        let command = Command::Fetch {
            id: self.next,
            policy: policy.clone(),
            op_id: op_id.map(str::to_owned),
            request: request.clone(),
        };
        let reply = self.call(&command, None)?;
        let outcome = match (reply.response, reply.refused) {
            (Some(response), _) => Ok(response),
            (None, Some(refused)) => Err(refused),
            (None, None) => return Err(EgressError::Proxy("an empty fetch reply".into())),
        };
        Ok((outcome, reply.events))
    }
}

/// What the proxy needs to read once it runs: the resolver's configuration
/// and the NSS modules getaddrinfo loads (its starter confines it to these,
/// read-only).
pub const PROXY_READABLE: &[&str] = &["/etc", "/usr", "/lib", "/lib64"];

/// The proxy's body: serves `control` (commands in, replies out) until
/// the other end closes; the process's exit code. Runs in a process of its
/// own, already confined by its starter.
pub fn serve_proxy(control: UnixStream, config: EgressConfig) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("moat egress: {e}");
            return 1;
        }
    };
    let run = Run::new(config);
    let handle = runtime.handle().clone();
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let worker = std::thread::Builder::new()
        .name("egress-control".into())
        .spawn(move || {
            control_loop(control, &handle, &run);
            let _ = done.send(());
        });
    if worker.is_err() {
        return 1;
    }
    runtime.block_on(async {
        let _ = finished.await;
    });
    0
}

struct Listening {
    closed: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    scope: Arc<Scope>,
}

/// Reads commands until the caller goes away.
fn control_loop(control: UnixStream, handle: &tokio::runtime::Handle, run: &Arc<Run>) {
    let mut pending: Vec<u8> = Vec::new();
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut listening: HashMap<u64, Listening> = HashMap::new();
    let mut writer = &control;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match crate::channel::recv_with_fds(control.as_fd(), &mut buf, &mut fds) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let reply = match serde_json::from_slice::<Command>(&line) {
                Ok(command) => execute(command, &mut fds, &mut listening, handle, run),
                Err(e) => Reply {
                    error: Some(format!("bad command: {e}")),
                    ..Reply::default()
                },
            };
            let mut out = serde_json::to_vec(&reply).unwrap_or_default();
            out.push(b'\n');
            if writer.write_all(&out).is_err() {
                return;
            }
        }
    }
}

fn execute(
    command: Command,
    fds: &mut Vec<OwnedFd>,
    listening: &mut HashMap<u64, Listening>,
    handle: &tokio::runtime::Handle,
    run: &Arc<Run>,
) -> Reply {
    let fail = |id, error: String| Reply {
        id,
        error: Some(error),
        ..Reply::default()
    };
    match command {
        Command::Serve { id, policy, op_id } => {
            let Some(fd) = (!fds.is_empty()).then(|| fds.remove(0)) else {
                return fail(id, "serve without a listener".into());
            };
            let policy = match policy.compile() {
                Ok(p) => p,
                Err(e) => return fail(id, e.to_string()),
            };
            let std_listener = std::net::TcpListener::from(fd);
            if let Err(e) = std_listener.set_nonblocking(true) {
                return fail(id, e.to_string());
            }
            let scope = Arc::new(Scope::new(run.clone(), policy, op_id));
            let (closed, watching) = watch::channel(false);
            let task_scope = scope.clone();
            let _guard = handle.enter();
            let listener = match tokio::net::TcpListener::from_std(std_listener) {
                Ok(l) => l,
                Err(e) => return fail(id, e.to_string()),
            };
            let task = handle.spawn(crate::proxy::serve(listener, task_scope, watching));
            listening.insert(
                id,
                Listening {
                    closed,
                    task,
                    scope,
                },
            );
            Reply {
                id,
                ..Reply::default()
            }
        }
        Command::Close { id } => {
            let Some(served) = listening.remove(&id) else {
                return fail(id, format!("no listener {id}"));
            };
            let _ = served.closed.send(true);
            let _ = handle.block_on(served.task);
            Reply {
                id,
                events: served.scope.take_events(),
                ..Reply::default()
            }
        }
        Command::Fetch {
            id,
            policy,
            op_id,
            request,
        } => {
            let policy = match policy.compile() {
                Ok(p) => p,
                Err(e) => return fail(id, e.to_string()),
            };
            let scope = Arc::new(Scope::new(run.clone(), policy, op_id));
            let task_scope = scope.clone();
            let task =
                handle.spawn(async move { crate::fetch::fetch(&task_scope, &request).await });
            let outcome = handle.block_on(task).unwrap_or_else(|e| {
                Err(FetchError {
                    reason: None,
                    message: e.to_string(),
                })
            });
            let (response, refused) = match outcome {
                Ok(r) => (Some(r), None),
                Err(e) => (None, Some(e)),
            };
            Reply {
                id,
                events: scope.take_events(),
                response,
                refused,
                ..Reply::default()
            }
        }
    }
}
