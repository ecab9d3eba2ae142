//! The dispatcher: one envelope in, one result out, every step recorded.

mod browser_step;
mod exports;
mod worker_exec;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use moat_core::capability::{CapabilityClaims, CapabilityError};
use moat_core::event_data::{
    ArtifactCreated, CapabilityDenied, CapabilityGranted, CapabilityRequested, GrantedCapability,
    NetworkDenied, PathDenied,
};
use moat_core::op::{
    ArtifactListArgs, ArtifactReadArgs, ArtifactRef, ArtifactWriteArgs, ExecArgvArgs,
    HttpRequestArgs,
};
use moat_core::sign::PublicKey;
use moat_core::{
    DenialReason, Envelope, Event, EventData, EventSink, Manifest, NetworkMode, OpKind, OpResult,
    OpStatus, SandboxMode, WorkloadClass,
};
use moat_egress::{Egress, EgressConfig, FetchError};
use moat_ledger::{ArtifactRecord, Ledger};
use moat_sandbox::hostid::IdRange;
use serde_json::{Value, json};

use crate::collect::Snapshot;
use crate::exec;
use crate::lines::{Line, LineReader};
use crate::network;
use crate::store::ArtifactStore;
use crate::workspace::{PathError, Refusal, Staged, Workspace};

/// Longest accepted line.
pub const MAX_LINE: usize = 16 << 20;
/// Most operations whose events share one ledger commit.
const MAX_BATCH: usize = 256;
/// Default and largest `maxEntries` of `artifact_list`.
const MAX_ENTRIES: u64 = 10_000;

/// What the shell needs to start.
pub struct ShellConfig {
    /// A manifest already verified against the operator's trusted key.
    pub manifest: Manifest,
    pub manifest_hash: String,
    pub workspace: PathBuf,
    pub state: PathBuf,
    pub mode: SandboxMode,
    /// Identifies this shell session in events about lines that are not envelopes.
    pub session_id: String,
    /// Fixed answers for the egress proxy's resolver (`--resolve`).
    pub egress_hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Extra trusted roots (PEM) for `http_request` over HTTPS.
    pub egress_roots_pem: Option<Vec<u8>>,
    /// A managed runner: every operation must carry a capability signed by
    /// the manifest's control-plane key.
    pub require_capabilities: bool,
    /// The block of host ids each `exec_argv` sandbox takes one from, when
    /// the shell runs as root (`None`: the host's `moat` block).
    pub id_range: Option<IdRange>,
    /// The operator's exceptions to the launch policy, for every `exec_argv`.
    pub launch_policy: moat_sandbox::LaunchPolicy,
    /// How to start a `microvm` guest, when this shell offers the class
    /// (`None`: programs run in `namespace` sandboxes only, and an
    /// operation whose capability asks for more is refused).
    pub vm: Option<moat_sandbox::microvm::VmOptions>,
    /// Where an `ingress-only` operation's ports get their sockets, one
    /// per port (`None`: such an operation is refused). The runtime's
    /// own directory, out of every sandbox's sight.
    pub expose_dir: Option<PathBuf>,
}

/// Why the shell could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("workspace {path}: {source}")]
    Workspace {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state directory: {0}")]
    State(std::io::Error),
    #[error(transparent)]
    Ledger(#[from] moat_ledger::LedgerError),
    #[error("sandbox mode {0} is not in the manifest's sandboxModes")]
    Mode(SandboxMode),
    #[error("the manifest's networkPolicy: {0}")]
    Network(String),
    #[error("the manifest's controlPlanePublicKey: {0}")]
    ControlPlaneKey(moat_core::sign::SignError),
    #[error("workload class {0} is not in the manifest's workloadClasses")]
    Class(WorkloadClass),
}

// A shell is moved to and shared between threads (the MCP server, the fuzz
// target): whatever it holds must be Send.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Shell>();
};

pub struct Shell {
    config: ShellConfig,
    workspace: Workspace,
    store: ArtifactStore,
    ledger: Ledger,
    clock: fn() -> SystemTime,
    /// Files were written since the last commit and must be synced first.
    dirty: bool,
    /// Writes of the current batch, staged but not yet visible, with the
    /// batch position of their operation.
    pending: Vec<(usize, Staged)>,
    /// Operations of the current batch whose staged write could not be
    /// published: their results become errors at commit.
    failed: Vec<(usize, String)>,
    /// Position of the next operation in the current batch.
    position: usize,
    /// The run's egress proxy, started by the first operation that needs it.
    egress: Option<Egress>,
    /// Browser sessions by `sessionId`, kept across operations.
    browsers: std::collections::BTreeMap<String, crate::browser::Session>,
    /// The key capabilities must be signed with.
    control_plane_key: PublicKey,
    /// Nonces of the capabilities used, until they expire (replays refused).
    used_capabilities: HashMap<String, SystemTime>,
}

/// The per-operation context: ids and the events recorded so far.
struct Op {
    id: String,
    run_id: String,
    correlation_id: String,
    kind: Option<OpKind>,
    events: Vec<Event>,
    artifacts: Vec<ArtifactRecord>,
    /// Place in the current batch.
    position: usize,
}

/// An operation carried out, whose events are not committed yet.
struct Processed {
    result: OpResult,
    events: Vec<Event>,
    artifacts: Vec<ArtifactRecord>,
}

impl Op {
    fn event(&mut self, data: EventData) {
        self.events.push(Event {
            op_id: (!self.id.is_empty()).then(|| self.id.clone()),
            correlation_id: (!self.correlation_id.is_empty()).then(|| self.correlation_id.clone()),
            ..Event::of(data, now(), self.run_id.clone())
        });
    }
}

fn now() -> String {
    moat_core::time::now_stamp()
}

/// The outcome of an operation before it is recorded.
enum Outcome {
    Done {
        status: OpStatus,
        result: Value,
        message: Option<String>,
        artifacts: Vec<ArtifactRef>,
    },
    Denied(Refusal),
    /// An acting browser step not decided on what it would act on (or
    /// decided on another element than the page has now): nothing done.
    Unchecked(Box<moat_core::element::ElementFacts>),
    Failed(String),
}

impl From<Refusal> for Outcome {
    fn from(r: Refusal) -> Self {
        Outcome::Denied(r)
    }
}

impl From<PathError> for Outcome {
    fn from(e: PathError) -> Self {
        match e {
            PathError::Denied(r) => Outcome::Denied(r),
            PathError::Io(e) => Outcome::Failed(e.to_string()),
        }
    }
}

fn ok(result: Value) -> Outcome {
    Outcome::Done {
        status: OpStatus::Ok,
        result,
        message: None,
        artifacts: Vec::new(),
    }
}

/// An operation's arguments: an object of the op's shape, never an array of
/// its fields (which another reader, such as a policy, would not see as such).
fn args<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, Refusal> {
    moat_core::strict::from_value(value)
        .map_err(|e| Refusal::new(DenialReason::InvalidArgs, e.to_string()))
}

impl Shell {
    pub fn open(config: ShellConfig) -> Result<Self, ShellError> {
        if !config.manifest.sandbox_modes.contains(&config.mode) {
            return Err(ShellError::Mode(config.mode));
        }
        if config.vm.is_some() && !config.manifest.classes().contains(&WorkloadClass::Microvm) {
            return Err(ShellError::Class(WorkloadClass::Microvm));
        }
        let fs = &config.manifest.filesystem;
        let workspace = Workspace::open(
            &config.workspace,
            &fs.read_roots,
            &fs.write_roots,
            &config.state.join("staging"),
        )
        .map_err(|source| ShellError::Workspace {
            path: config.workspace.clone(),
            source,
        })?;
        for mode in [NetworkMode::Allowlist, NetworkMode::ProxyOnly] {
            let policy = network::exec_policy(&config.manifest, mode)
                .map_err(|r| ShellError::Network(r.message))?;
            policy
                .compile()
                .map_err(|e| ShellError::Network(e.to_string()))?;
        }
        let control_plane_key = PublicKey::from_base64(&config.manifest.control_plane_public_key)
            .map_err(ShellError::ControlPlaneKey)?;
        let store = ArtifactStore::open(&config.state).map_err(ShellError::State)?;
        let ledger = Ledger::open(&config.state.join("ledger.db"))?;
        // Nonces used before live in the ledger (looked up per operation):
        // nothing to read back at start but a prune of the expired ones.
        ledger.prune_capability_nonces(SystemTime::now())?;
        let used_capabilities = HashMap::new();
        Ok(Shell {
            config,
            workspace,
            store,
            ledger,
            clock: SystemTime::now,
            dirty: false,
            pending: Vec::new(),
            failed: Vec::new(),
            position: 0,
            egress: None,
            browsers: BTreeMap::new(),
            control_plane_key,
            used_capabilities,
        })
    }

    /// Verifies an operation's capability: signature, lifetime, binding to
    /// this very operation and policy, and first use.
    fn check_capability(
        &mut self,
        token: &str,
        envelope: &Envelope,
        kind: OpKind,
    ) -> Result<CapabilityClaims, CapabilityError> {
        let now = (self.clock)();
        let claims = CapabilityClaims::verify(token, &self.control_plane_key, now)?;
        claims.check_binding(
            &envelope.run_id,
            &envelope.id,
            kind,
            envelope,
            &self.config.manifest.policy_hash,
        )?;
        // Expired nonces can go: their capabilities no longer verify.
        let grace = moat_core::capability::CLOCK_SKEW;
        self.used_capabilities
            .retain(|_, expires| *expires + grace >= now);
        // This shell's own (its batch may not be committed yet), then every
        // use the ledger recorded: earlier shells, and other slots' shells.
        let recorded = self
            .ledger
            .capability_used(&claims.nonce)
            .map_err(|e| CapabilityError::Unavailable(e.to_string()))?;
        if self.used_capabilities.contains_key(&claims.nonce) || recorded {
            return Err(CapabilityError::Replayed);
        }
        let expires = humantime::parse_rfc3339(&claims.expires_at).unwrap_or(now);
        self.used_capabilities.insert(claims.nonce.clone(), expires);
        Ok(claims)
    }

    /// The class a program runs in, checked against the manifest and what
    /// this shell can start: a capability's class is never given less.
    fn offered(&self, kind: OpKind, class: WorkloadClass) -> Result<WorkloadClass, Refusal> {
        let manifest = &self.config.manifest;
        // Programs and browsers run in a class; the other operations are
        // the shell's own.
        if kind != OpKind::ExecArgv && kind != OpKind::BrowserStep {
            return Ok(class);
        }
        // A browser step's class is what its session must satisfy: the
        // weakest listed class that does (a step the control plane let
        // through to be looked at carries none but namespace).
        let class = match (kind, manifest.fit(class)) {
            (OpKind::BrowserStep, Some(fitted)) => fitted,
            _ => class,
        };
        if !manifest.classes().contains(&class) {
            return Err(Refusal::new(
                DenialReason::ClassNotAvailable,
                format!("workload class {class} is not in the manifest's workloadClasses"),
            ));
        }
        // Refused here too, before the capability is recorded as granted.
        // A worker's component is run by the shell itself (exec only).
        if !(class == WorkloadClass::Worker && kind == OpKind::ExecArgv) {
            vm_for(class, &self.config.vm)?;
        }
        Ok(class)
    }

    /// The run's egress proxy, forked on first use (the shell is single-threaded).
    /// How the run's egress proxies are configured.
    fn egress_config(&self) -> EgressConfig {
        EgressConfig {
            run_id: self.config.session_id.clone(),
            limits: network::egress_limits(&self.config.manifest.network_policy),
            hosts: self.config.egress_hosts.clone(),
            extra_roots_pem: self.config.egress_roots_pem.clone(),
            allow_degraded: false,
        }
    }

    fn egress(&mut self) -> Result<&mut Egress, String> {
        if self.egress.is_none() {
            let config = self.egress_config();
            self.egress = Some(crate::egress::start(config).map_err(|e| e.to_string())?);
        }
        self.egress
            .as_mut()
            .ok_or_else(|| "the egress proxy did not start".to_owned())
    }

    /// Replaces the clock (tests of expiry).
    pub fn set_clock(&mut self, clock: fn() -> SystemTime) {
        self.clock = clock;
    }

    pub fn workspace_path(&self) -> &Path {
        &self.workspace.path
    }

    /// Serves JSON lines until the input ends: one result line per line read.
    ///
    /// Operations whose lines are already buffered are carried out one after
    /// the other and their events committed together (group commit); no
    /// result is written before its events are durable.
    pub fn serve(&mut self, input: impl Read, mut output: impl Write) -> std::io::Result<()> {
        let mut reader = LineReader::new(input);
        let mut batch = Vec::new();
        while let Some(line) = reader.next_line(MAX_LINE)? {
            batch.push(self.process(line));
            if batch.len() >= MAX_BATCH || !reader.has_complete_line() {
                for result in self.commit(std::mem::take(&mut batch)) {
                    let mut text = serde_json::to_string(&result).unwrap_or_else(|e| {
                        format!("{{\"id\":\"\",\"status\":\"error\",\"message\":\"{e}\"}}")
                    });
                    // One write per line: the reader wakes once for it.
                    text.push('\n');
                    output.write_all(text.as_bytes())?;
                }
                output.flush()?;
            }
        }
        // The input ended: the run is over, and so are its browsers.
        self.close_browsers();
        Ok(())
    }

    /// Handles one line. Its events are durable in the ledger before this returns.
    pub fn handle(&mut self, line: Line) -> OpResult {
        let processed = self.process(line);
        let id = processed.result.id.clone();
        self.commit(vec![processed])
            .pop()
            .unwrap_or_else(|| OpResult::error(&id, "internal: no result"))
    }

    /// Makes the batch's staged writes durable and visible: one sync of
    /// every staged file (and artifact-store copy), then the renames, then an
    /// fsync of each directory renamed into.
    fn publish_pending(&mut self) -> std::io::Result<()> {
        if !std::mem::take(&mut self.dirty) {
            return Ok(());
        }
        let devices = self.workspace.sync()?;
        self.store.sync(&devices)?;
        let mut synced_dirs = Vec::new();
        for (position, staged) in std::mem::take(&mut self.pending) {
            match staged.publish() {
                Ok(()) => {
                    let (dir, id) = staged.directory();
                    if !synced_dirs.contains(&id) {
                        rustix::fs::fsync(dir)?;
                        synced_dirs.push(id);
                    }
                }
                Err(e) => self.failed.push((position, e.to_string())),
            }
        }
        Ok(())
    }

    /// Commits the events and artifact records of `batch` in one transaction.
    fn commit(&mut self, mut batch: Vec<Processed>) -> Vec<OpResult> {
        self.position = 0;
        if let Err(e) = self.publish_pending() {
            for (_, staged) in std::mem::take(&mut self.pending) {
                staged.abandon();
            }
            self.failed.clear();
            return batch
                .into_iter()
                .map(|p| OpResult::error(&p.result.id, format!("syncing written files: {e}")))
                .collect();
        }
        for (position, message) in std::mem::take(&mut self.failed) {
            if let Some(processed) = batch.get_mut(position) {
                let message = format!("the write could not be published: {message}");
                let run_id = processed
                    .events
                    .first()
                    .map(|e| e.run_id.clone())
                    .unwrap_or_default();
                let denied = CapabilityDenied {
                    op: Some(OpKind::ArtifactWrite.as_str().into()),
                    error: Some(message.clone()),
                    ..CapabilityDenied::default()
                };
                processed.events.push(Event {
                    op_id: Some(processed.result.id.clone()),
                    ..Event::of(EventData::CapabilityDenied(denied), now(), run_id)
                });
                processed.result = OpResult::error(&processed.result.id, message);
            }
        }
        let events: Vec<Event> = batch
            .iter()
            .flat_map(|p| p.events.iter().cloned())
            .collect();
        let artifacts: Vec<ArtifactRecord> = batch
            .iter()
            .flat_map(|p| p.artifacts.iter().cloned())
            .collect();
        match self.ledger.append_with_artifacts(&events, &artifacts) {
            Ok(_) => batch.into_iter().map(|p| p.result).collect(),
            // Without its record, an operation does not count as done.
            Err(e) => batch
                .into_iter()
                .map(|p| {
                    OpResult::error(
                        &p.result.id,
                        format!("the ledger could not record this operation: {e}"),
                    )
                })
                .collect(),
        }
    }

    fn process(&mut self, line: Line) -> Processed {
        let position = self.position;
        self.position += 1;
        self.process_at(line, position)
    }

    fn process_at(&mut self, line: Line, position: usize) -> Processed {
        let parsed: Result<Envelope, Refusal> = match &line {
            Line::TooLong { length } => Err(Refusal::new(
                DenialReason::InvalidEnvelope,
                format!("line of {length} bytes is longer than {MAX_LINE}"),
            )),
            Line::Text(bytes) => parse_envelope(bytes),
        };
        let mut op = Op {
            id: String::new(),
            run_id: self.config.session_id.clone(),
            correlation_id: String::new(),
            kind: None,
            events: Vec::new(),
            artifacts: Vec::new(),
            position,
        };
        if let Ok(envelope) = &parsed {
            op.id = envelope.id.clone();
            op.run_id = envelope.run_id.clone();
            op.correlation_id = envelope.correlation_id.clone();
            op.kind = OpKind::parse(&envelope.op);
        }
        let args_hash = parsed.as_ref().ok().map(moat_core::capability::args_hash);
        op.event(EventData::CapabilityRequested(CapabilityRequested {
            op: parsed.as_ref().map(|e| e.op.clone()).ok(),
            args_hash,
            manifest_hash: Some(self.config.manifest_hash.clone()),
            policy_hash: Some(self.config.manifest.policy_hash.clone()),
            mode: Some(self.config.mode),
            ..CapabilityRequested::default()
        }));
        let outcome = match &parsed {
            Err(refusal) => Outcome::Denied(refusal.clone()),
            Ok(envelope) => self.authorize_and_run(envelope, &mut op),
        };
        self.finish(op, outcome)
    }

    fn authorize_and_run(&mut self, envelope: &Envelope, op: &mut Op) -> Outcome {
        let Some(kind) = op.kind else {
            return Refusal::new(
                DenialReason::UnknownOp,
                format!("unknown operation `{}`", envelope.op),
            )
            .into();
        };
        let manifest = &self.config.manifest;
        if let Err(e) = manifest.check_time((self.clock)(), None) {
            return Refusal::new(DenialReason::ManifestExpired, e.to_string()).into();
        }
        if !manifest.allowed_ops.contains(&kind) {
            return Refusal::new(
                DenialReason::OpNotInManifest,
                format!("{} is not in the manifest's allowedOps", kind.as_str()),
            )
            .into();
        }
        // Without a capability, the weakest class the manifest lists.
        // Every class is at least namespace: the weakest listed one.
        let mut class = manifest.fit(WorkloadClass::Namespace).unwrap_or_default();
        let mut element = None;
        let granted = match &envelope.capability {
            Some(token) => match self.check_capability(token, envelope, kind) {
                Ok(claims) => {
                    class = claims.class;
                    element.clone_from(&claims.element);
                    CapabilityGranted {
                        op: Some(kind.as_str().into()),
                        capability: Some(GrantedCapability {
                            nonce: claims.nonce,
                            expires_at: claims.expires_at,
                        }),
                        class: (matches!(kind, OpKind::ExecArgv | OpKind::BrowserStep)
                            && !claims.class.is_namespace())
                        .then_some(claims.class),
                        ..CapabilityGranted::default()
                    }
                }
                Err(e) => {
                    return Refusal::new(DenialReason::CapabilityInvalid, e.to_string()).into();
                }
            },
            None if self.config.require_capabilities => {
                return Refusal::new(
                    DenialReason::CapabilityInvalid,
                    "this runner takes only operations that carry a capability from the control plane",
                )
                .into();
            }
            None => {
                // Without a capability, a delivery's worker component (an
                // `exec_argv` with `worker` bindings: a replay of one, or
                // a local shell's) runs in the worker class where the
                // manifest lists it: another shape, never a weaker one.
                if kind == OpKind::ExecArgv
                    && envelope.args.get("worker").is_some_and(|w| !w.is_null())
                    && manifest.classes().contains(&WorkloadClass::Worker)
                {
                    class = WorkloadClass::Worker;
                }
                CapabilityGranted {
                    op: Some(kind.as_str().into()),
                    class: (class == WorkloadClass::Worker).then_some(class),
                    ..CapabilityGranted::default()
                }
            }
        };
        let class = match self.offered(kind, class) {
            Ok(class) => class,
            Err(refusal) => return refusal.into(),
        };
        op.event(EventData::CapabilityGranted(granted));
        // Earlier writes of this batch become visible before anything else
        // looks at the workspace.
        if kind != OpKind::ArtifactWrite
            && let Err(e) = self.publish_pending()
        {
            return Outcome::Failed(format!("publishing earlier writes: {e}"));
        }
        let result = match kind {
            OpKind::ArtifactRead => args(&envelope.args).map(|a| self.read(a)),
            OpKind::ArtifactWrite => args(&envelope.args).map(|a| self.write(a, op)),
            OpKind::ArtifactList => args(&envelope.args).map(|a| self.list(a)),
            OpKind::ExecArgv => args(&envelope.args).map(|a| self.exec(envelope, a, op, class)),
            // Parsed by form, for errors that name the right fields.
            OpKind::HttpRequest if envelope.args.get("profile").is_some() => {
                args(&envelope.args).map(|a| self.http(envelope, HttpRequestArgs::Profile(a), op))
            }
            OpKind::HttpRequest => {
                args(&envelope.args).map(|a| self.http(envelope, HttpRequestArgs::Direct(a), op))
            }
            // Only a verified capability (the control plane's decision, or
            // `moat capability issue` with the trusted key) approves a step:
            // a free-form policyDecisionRef is the agent's own word.
            OpKind::BrowserStep if envelope.capability.is_none() => Err(Refusal::new(
                DenialReason::ApprovalRequired,
                "browser_step is high risk: it needs a capability signed with the trusted key \
                 (a control plane's, or `moat capability issue`); a policyDecisionRef is not one",
            )),
            OpKind::BrowserStep => args(&envelope.args)
                .map(|a| self.browser(envelope, a, op, element.as_deref(), class)),
        };
        result.unwrap_or_else(Outcome::Denied)
    }

    fn read(&mut self, a: ArtifactReadArgs) -> Outcome {
        let cap = self.config.manifest.limits.max_output_bytes;
        if a.max_bytes > cap {
            return Refusal::new(
                DenialReason::LimitExceeded,
                format!("maxBytes above the manifest's {cap}"),
            )
            .into();
        }
        match self.workspace.read(&a.path, a.max_bytes, a.offset) {
            Err(e) => e.into(),
            Ok(read) => {
                let (encoding, content) = match std::str::from_utf8(&read.bytes) {
                    Ok(text) => ("utf8", text.to_owned()),
                    Err(_) => ("base64", B64.encode(&read.bytes)),
                };
                ok(json!({
                    "path": a.path,
                    "size": read.size,
                    "sha256": read.sha256,
                    "offset": a.offset,
                    "returned": read.bytes.len(),
                    "truncated": read.truncated,
                    "encoding": encoding,
                    "content": content,
                }))
            }
        }
    }

    fn write(&mut self, a: ArtifactWriteArgs, op: &mut Op) -> Outcome {
        let bytes = match (&a.content, &a.content_base64) {
            (Some(text), None) => text.as_bytes().to_vec(),
            (None, Some(b64)) => match B64.decode(b64) {
                Ok(bytes) => bytes,
                Err(_) => {
                    return Refusal::new(DenialReason::InvalidArgs, "contentBase64 is not base64")
                        .into();
                }
            },
            _ => {
                return Refusal::new(
                    DenialReason::InvalidArgs,
                    "give exactly one of content and contentBase64",
                )
                .into();
            }
        };
        let cap = a.max_bytes.min(self.config.manifest.limits.file_size_bytes);
        if bytes.len() as u64 > cap {
            return Refusal::new(
                DenialReason::TooLarge,
                format!("{} bytes is above the limit of {cap}", bytes.len()),
            )
            .into();
        }
        let pending: Vec<&Staged> = self.pending.iter().map(|(_, s)| s).collect();
        let staged = match self.workspace.stage(&a.path, &bytes, a.overwrite, &pending) {
            Ok(staged) => staged,
            Err(e) => return e.into(),
        };
        self.dirty = true;
        self.pending.push((op.position, staged));
        match self.artifact(op, "file", &a.path, &bytes) {
            Ok(reference) => Outcome::Done {
                status: OpStatus::Ok,
                result: json!({"path": a.path, "size": bytes.len(), "sha256": reference.sha256}),
                message: None,
                artifacts: vec![reference],
            },
            Err(e) => Outcome::Failed(e),
        }
    }

    fn list(&mut self, a: ArtifactListArgs) -> Outcome {
        let max = a.max_entries.unwrap_or(1000).min(MAX_ENTRIES) as usize;
        match self.workspace.list(&a.path, a.recursive, max) {
            Err(e) => e.into(),
            Ok((entries, truncated)) => {
                ok(json!({"path": a.path, "entries": entries, "truncated": truncated}))
            }
        }
    }

    fn exec(
        &mut self,
        envelope: &Envelope,
        a: ExecArgvArgs,
        op: &mut Op,
        class: WorkloadClass,
    ) -> Outcome {
        let sandbox_id = format!(
            "op-{}",
            &moat_core::hash::sha256_hex(
                format!("{}\n{}\n{}", envelope.run_id, envelope.id, now()).as_bytes()
            )[..16]
        );
        // A worker's component runs in `moat-worker`'s sandbox
        // (`worker_exec.rs`); the rest of the way is a program's.
        let worker = class == WorkloadClass::Worker;
        if !worker && a.worker.is_some() {
            return Refusal::new(
                DenialReason::InvalidArgs,
                "worker: the bindings of a queue's delivery, for the worker class only",
            )
            .into();
        }
        let (plan, reader, cache) = if worker {
            match self.worker_plan(envelope, &a, sandbox_id) {
                Ok((plan, reader, cache)) => (plan, Some(reader), Some(cache)),
                Err(refusal) => return refusal.into(),
            }
        } else {
            let mut plan = match exec::plan(
                &self.config.manifest,
                &self.workspace,
                self.config.mode,
                envelope,
                &a,
                sandbox_id,
                self.config.expose_dir.as_deref(),
            ) {
                Ok(plan) => plan,
                Err(refusal) => return refusal.into(),
            };
            plan.spec.id_range = self.config.id_range;
            plan.spec.launch_policy = self.config.launch_policy.clone();
            (plan, None, None)
        };
        // What the program writes is judged against the exports, if any:
        // the workspace as it was before it ran is the baseline.
        let exports = self.config.manifest.exports.clone();
        let before = exports
            .as_ref()
            .map(|_| Snapshot::take(&self.workspace.path, &self.export_roots()));
        let degrade = exports::Degrade {
            allow_degraded: plan.spec.allow_degraded,
            without_cgroup: plan.spec.without_cgroup,
        };
        let mut sink = exec::Relabel {
            events: &mut op.events,
            run_id: &envelope.run_id,
            op_id: &envelope.id,
            correlation_id: &envelope.correlation_id,
        };
        let network = plan.spec.network;
        let policy = if network.uses_egress_proxy() {
            match network::exec_policy(&self.config.manifest, network) {
                Ok(policy) => Some(policy),
                Err(refusal) => return refusal.into(),
            }
        } else {
            None
        };
        // A worker's runtime is no VM guest: only a program asks for one.
        let vm = match reader {
            Some(_) => None,
            None => match vm_for(class, &self.config.vm) {
                Ok(vm) => vm.cloned(),
                Err(refusal) => return refusal.into(),
            },
        };
        let egress = match &policy {
            Some(policy) => match self.egress() {
                Ok(egress) => Some((egress, policy, envelope.id.as_str())),
                Err(e) => return Outcome::Failed(format!("egress proxy: {e}")),
            },
            None => None,
        };
        let run = match (reader, egress) {
            (Some(reader), egress) => exec::run_worker(plan, reader, &mut sink, egress),
            (None, Some((egress, policy, op_id))) => {
                exec::run_proxied(plan, &mut sink, egress, policy, op_id, vm.as_ref())
                    .map(|finished| (finished, None))
            }
            (None, None) => {
                exec::run(plan, &mut sink, vm.as_ref()).map(|finished| (finished, None))
            }
        };
        if let Some(cache) = cache.filter(|c| c.writable) {
            worker_exec::mark_filled(&cache.dir);
        }
        let (finished, effects) = match run {
            Ok(done) => done,
            Err(e) => return Outcome::Failed(e),
        };
        let mut artifacts = Vec::new();
        for (stream, bytes) in &finished.outputs {
            if bytes.len() > exec::INLINE_OUTPUT {
                let label = format!(
                    "{} {stream}",
                    a.argv.first().map(String::as_str).unwrap_or("")
                );
                match self.artifact(op, stream, &label, bytes) {
                    Ok(reference) => artifacts.push(reference),
                    Err(e) => return Outcome::Failed(e),
                }
            }
        }
        let mut result = finished.result;
        if let Some(effects) = effects {
            result["effects"] = json!(effects);
        }
        if let (Some(rules), Some(before)) = (&exports, &before) {
            result["exports"] = self.collect_exports(op, rules, before, degrade, &mut artifacts);
        }
        Outcome::Done {
            status: finished.status,
            result,
            message: finished.message,
            artifacts,
        }
    }

    fn http(&mut self, envelope: &Envelope, a: HttpRequestArgs, op: &mut Op) -> Outcome {
        let manifest = &self.config.manifest;
        let planned = match &a {
            HttpRequestArgs::Profile(p) => network::plan_profile(manifest, p, &self.store),
            HttpRequestArgs::Direct(d) => network::plan_direct(manifest, d),
        };
        let plan = match planned {
            Ok(plan) => plan,
            Err(refusal) => return refusal.into(),
        };
        let egress = match self.egress() {
            Ok(egress) => egress,
            Err(e) => return Outcome::Failed(format!("egress proxy: {e}")),
        };
        let (outcome, events) = match egress.fetch(&plan.policy, Some(&envelope.id), &plan.request)
        {
            Ok(answer) => answer,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        let mut sink = exec::Relabel {
            events: &mut op.events,
            run_id: &envelope.run_id,
            op_id: &envelope.id,
            correlation_id: &envelope.correlation_id,
        };
        for event in events {
            sink.emit(event);
        }
        let response = match outcome {
            Ok(response) => response,
            Err(FetchError {
                reason: Some(reason),
                message,
            }) => return Refusal::new(reason, message).into(),
            Err(FetchError {
                reason: None,
                message,
            }) => return Outcome::Failed(message),
        };
        let body = B64.decode(&response.body_base64).unwrap_or_default();
        let mut result = json!({
            "status": response.status,
            "headers": response.headers,
            "bodyBytes": body.len(),
            "truncated": response.truncated,
            "strippedHeaders": response.stripped_headers,
        });
        let mut artifacts = Vec::new();
        if body.len() > exec::INLINE_OUTPUT {
            let label = format!("{} {}", plan.request.method, plan.request.url);
            match self.artifact(op, "http_response", &label, &body) {
                Ok(reference) => {
                    result["bodyArtifact"] = reference.sha256.clone().into();
                    artifacts.push(reference);
                }
                Err(e) => return Outcome::Failed(e),
            }
        } else {
            match std::str::from_utf8(&body) {
                Ok(text) => result["body"] = text.into(),
                Err(_) => result["bodyBase64"] = response.body_base64.into(),
            }
        }
        Outcome::Done {
            status: OpStatus::Ok,
            result,
            message: None,
            artifacts,
        }
    }

    /// Stores bytes as an artifact, records it, and emits `artifact.created`.
    fn artifact(
        &mut self,
        op: &mut Op,
        kind: &str,
        label: &str,
        bytes: &[u8],
    ) -> Result<ArtifactRef, String> {
        let sha256 = self
            .store
            .put(bytes)
            .map_err(|e| format!("artifact store: {e}"))?;
        let record = ArtifactRecord {
            sha256: sha256.clone(),
            size: bytes.len() as u64,
            kind: kind.to_owned(),
            label: label.to_owned(),
            redaction: "none".into(),
            run_id: op.run_id.clone(),
            op_id: op.id.clone(),
            created_at: now(),
        };
        op.artifacts.push(record);
        op.event(EventData::ArtifactCreated(ArtifactCreated {
            sha256: sha256.clone(),
            size: bytes.len() as u64,
            kind: kind.to_owned(),
            label: label.to_owned(),
            runner_id: None,
            runner_hash: None,
            manifest_hash: None,
        }));
        Ok(ArtifactRef {
            sha256,
            size: bytes.len() as u64,
            kind: kind.to_owned(),
            label: label.to_owned(),
        })
    }

    /// Builds the result and the events of the outcome.
    fn finish(&mut self, mut op: Op, outcome: Outcome) -> Processed {
        let mut result = match outcome {
            Outcome::Done {
                status,
                result,
                message,
                artifacts,
            } => OpResult {
                id: op.id.clone(),
                status,
                result: Some(result),
                reason: None,
                message,
                event_type: None,
                artifacts,
            },
            Outcome::Denied(refusal) => {
                let path_reason = matches!(
                    refusal.reason,
                    DenialReason::AbsolutePath
                        | DenialReason::PathOutsideWorkspace
                        | DenialReason::SymlinkEscape
                        | DenialReason::WriteOutsideOutput
                );
                if path_reason {
                    op.event(EventData::PathDenied(PathDenied {
                        reason: refusal.reason,
                        message: refusal.message.clone(),
                        runner_id: None,
                        runner_hash: None,
                        manifest_hash: None,
                    }));
                }
                if refusal.reason == DenialReason::NetworkNotAllowed {
                    op.event(EventData::NetworkDenied(NetworkDenied {
                        reason: Some(refusal.reason),
                        message: Some(refusal.message.clone()),
                        ..NetworkDenied::default()
                    }));
                }
                op.event(EventData::CapabilityDenied(CapabilityDenied {
                    op: op.kind.map(|k| k.as_str().to_owned()),
                    reason: Some(refusal.reason),
                    message: Some(refusal.message.clone()),
                    ..CapabilityDenied::default()
                }));
                OpResult::denied(&op.id, refusal.reason, refusal.message)
            }
            Outcome::Unchecked(facts) => {
                let message = "this step acts on the element in result.element: it needs a \
                               capability decided on that element (the control plane decides \
                               on it; by hand: moat capability issue --element FINGERPRINT)";
                op.event(EventData::CapabilityDenied(CapabilityDenied {
                    op: op.kind.map(|k| k.as_str().to_owned()),
                    reason: Some(DenialReason::ElementUnchecked),
                    message: Some(message.into()),
                    element: Some((*facts).clone()),
                    ..CapabilityDenied::default()
                }));
                OpResult {
                    result: Some(json!({
                        "fingerprint": facts.fingerprint(),
                        "element": *facts,
                    })),
                    ..OpResult::denied(&op.id, DenialReason::ElementUnchecked, message)
                }
            }
            Outcome::Failed(message) => OpResult::error(&op.id, message),
        };
        result.event_type = op.events.last().map(|e| e.event_type.as_str().to_owned());
        Processed {
            result,
            events: op.events,
            artifacts: op.artifacts,
        }
    }
}

/// The guest options for a program of `class` (`None`: a namespace
/// sandbox). A class this shell cannot give is refused, never run weaker.
pub(super) fn vm_for(
    class: WorkloadClass,
    vm: &Option<moat_sandbox::microvm::VmOptions>,
) -> Result<Option<&moat_sandbox::microvm::VmOptions>, Refusal> {
    match (class, vm) {
        (WorkloadClass::Namespace, _) => Ok(None),
        (WorkloadClass::Microvm, Some(vm)) => Ok(Some(vm)),
        (WorkloadClass::Microvm, None) => Err(Refusal::new(
            DenialReason::ClassNotAvailable,
            "the operation must run in workload class microvm, which this runner does not \
             offer (start it with --class microvm)",
        )),
        (WorkloadClass::Worker, _) => Err(Refusal::new(
            DenialReason::ClassNotAvailable,
            "workload class worker runs WebAssembly components, not programs: a program \
             runs in namespace or microvm",
        )),
    }
}

/// Parses a line into an envelope, with the denial reasons of the protocol.
fn parse_envelope(bytes: &[u8]) -> Result<Envelope, Refusal> {
    let invalid = |m: String| Refusal::new(DenialReason::InvalidEnvelope, m);
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(invalid("an envelope is a JSON object".into()));
    };
    if object.contains_key("cmd") {
        return Err(Refusal::new(
            DenialReason::RawShellUnsupported,
            "shell command strings are not accepted; send a structured operation such as exec_argv",
        ));
    }
    moat_core::strict::from_value::<Envelope>(&value).map_err(|e| invalid(e.to_string()))
}
