//! The launcher: plans a run, clones the sandbox, finishes its setup from the
//! outside (id maps, idmapped roots, cgroup), supervises it and writes the
//! report. See docs/sandbox.md for the sequence.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use moat_core::event_data::{
    NetworkDenied, ProcessTimeout, SandboxDangerFullAccess, SandboxExecDenied, SandboxExecFinished,
    SandboxExecStarted, SandboxRoot, SandboxSyscallDenied, SandboxViolation,
};
use moat_core::{
    Enforcement, Event, EventData, EventSink, ExitStatus, LayerReport, NetworkMode, OutputReport,
    SandboxMode, SandboxReport, SyscallDenial, Violation, WorkloadClass,
};

use crate::cgroup::{self, RunCgroup};
use crate::child::{self, ChildFds, ChildPlan, Message};
use crate::confine;
use crate::error::{Layer, SetupError, SpecError};
use crate::evidence::{AuditLog, Tracker};
use crate::hostid::{Identity, identity, write_id_maps};
use crate::ingress;
use crate::mounts::IdmappedRoots;
use crate::netns;
use crate::placement::Placement;
use crate::spec::SandboxSpec;
use crate::supervise::{self, Denial, OutputMode, Stream, Watched};
use crate::sys::{self, Forked};

/// `PATH` inside the sandbox.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The port, on the sandbox's own loopback, where the egress proxy listens in
/// the `proxy-only` and `allowlist` network modes.
pub const EGRESS_PORT: u16 = 3128;

/// The egress proxy, as the launcher sees it in the proxy network modes.
pub trait EgressHook {
    /// Takes the listening socket that init made on `127.0.0.1:EGRESS_PORT`
    /// in the sandbox's network namespace and starts serving it (accepted
    /// connections come from the sandbox; the proxy's own leave from wherever
    /// it runs). An `Err` aborts the run before the program starts.
    fn serve(&mut self, listener: OwnedFd) -> Result<(), String>;
    /// Called once the sandbox is gone: stops serving and returns the proxy's
    /// events, which the launcher records before `sandbox.exec.finished`.
    fn finish(&mut self) -> Result<Vec<Event>, String>;
}

/// What a run produced.
#[derive(Debug)]
pub struct RunOutcome {
    pub report: SandboxReport,
    /// Captured output ([`OutputMode::Capture`] only), at most the cap.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Runs `spec` in a fresh sandbox and waits for it.
///
/// Returns `Err` only when the spec itself is wrong (nothing was started).
/// Every other failure — a layer that cannot be applied, a program that
/// cannot be executed — is reported in the outcome (exit code 125, 126, 127)
/// and in the events. The caller must be single-threaded.
pub fn run(
    spec: SandboxSpec,
    output: OutputMode,
    sink: &mut dyn EventSink,
) -> Result<RunOutcome, SpecError> {
    run_with_egress(spec, output, sink, None)
}

/// [`run`], for the network modes that go through the egress proxy
/// (`proxy-only`, `allowlist`): `egress` receives the proxy's listening socket.
pub fn run_with_egress(
    mut spec: SandboxSpec,
    output: OutputMode,
    sink: &mut dyn EventSink,
    mut egress: Option<&mut dyn EgressHook>,
) -> Result<RunOutcome, SpecError> {
    spec.validate()?;
    if spec.network.uses_egress_proxy() != egress.is_some() {
        return Err(SpecError::UnsupportedNetwork(spec.network));
    }
    let started = Instant::now();
    let mut events = Emitter {
        sink,
        run_id: spec.run_id.clone(),
    };
    events.emit(EventData::SandboxExecStarted(started_data(&spec)));
    if spec.mode == SandboxMode::DangerFullAccess {
        events.emit(EventData::SandboxDangerFullAccess(
            SandboxDangerFullAccess {
                warning: "the host root is writable from the sandbox".into(),
                mode: Some(spec.mode),
                network: None,
                sandbox_run_id: None,
                runner_id: None,
                runner_hash: None,
                manifest_hash: None,
            },
        ));
    }
    if spec.network == NetworkMode::Full {
        events.emit(EventData::SandboxDangerFullAccess(SandboxDangerFullAccess {
            warning: "the sandbox shares the host's network: no proxy, no allowlist, no record of connections".into(),
            mode: None,
            network: Some(spec.network),
            sandbox_run_id: None,
            runner_id: None,
            runner_hash: None,
            manifest_hash: None,
        }));
    }
    let mut state = RunState::new(&spec);
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let result = launch(
        &spec,
        output,
        &mut events,
        &mut state,
        Buffers {
            stdout: &mut stdout,
            stderr: &mut stderr,
            egress: egress.as_deref_mut(),
        },
    );
    if let Some(hook) = egress {
        match hook.finish() {
            Ok(recorded) => recorded.into_iter().for_each(|e| events.sink.emit(e)),
            Err(e) => events.emit(EventData::NetworkDenied(NetworkDenied {
                detail: Some(format!("the egress proxy's records were lost: {e}")),
                ..NetworkDenied::default()
            })),
        }
    }
    let report = state.into_report(&spec, result, started);
    emit_ending(
        &mut |data| events.emit(data),
        &report,
        spec.limits.timeout_ms,
        "process tree",
    );
    Ok(RunOutcome {
        report,
        stdout,
        stderr,
    })
}

/// The event of a syscall the seccomp layer refused (with EPERM).
pub(crate) fn syscall_denied(name: &str, arch: u32, nr: i32) -> EventData {
    EventData::SandboxSyscallDenied(SandboxSyscallDenied {
        syscall: name.to_owned(),
        arch: format!("0x{arch:x}"),
        nr,
        layer: "seccomp".into(),
        errno: "EPERM".into(),
        sandbox_run_id: None,
        runner_id: None,
        runner_hash: None,
        manifest_hash: None,
    })
}

/// The events that close a run, after the program's own: its refusal (a
/// setup error), its timeout (what was `killed`), and its report.
pub(crate) fn emit_ending(
    emit: &mut dyn FnMut(EventData),
    report: &SandboxReport,
    timeout_ms: u64,
    killed: &str,
) {
    if let Some(error) = &report.setup_error {
        emit(EventData::SandboxExecDenied(SandboxExecDenied {
            reason: error.clone(),
            sandbox_run_id: None,
            runner_id: None,
            runner_hash: None,
            manifest_hash: None,
        }));
    }
    if report.timed_out {
        emit(EventData::ProcessTimeout(ProcessTimeout {
            timeout_ms,
            killed: killed.into(),
            sandbox_run_id: None,
            runner_id: None,
            runner_hash: None,
            manifest_hash: None,
        }));
    }
    emit(EventData::SandboxExecFinished(SandboxExecFinished {
        report: report.clone(),
        sandbox_run_id: None,
        runner_id: None,
        runner_hash: None,
        manifest_hash: None,
    }));
}

/// The report of a run refused before anything was started (the
/// `microvm` class's own preparation failed).
pub(crate) fn refused_report(
    spec: &SandboxSpec,
    error: SetupError,
    started: Instant,
) -> SandboxReport {
    RunState::new(spec).into_report(spec, Err(error), started)
}

struct Emitter<'a> {
    sink: &'a mut dyn EventSink,
    run_id: String,
}

impl Emitter<'_> {
    fn emit(&mut self, data: EventData) {
        self.sink.emit(Event::of(
            data,
            moat_core::time::now_stamp(),
            self.run_id.clone(),
        ));
    }
}

/// Arguments are not recorded: they may carry data the caller considers secret.
pub(crate) fn started_data(spec: &SandboxSpec) -> SandboxExecStarted {
    let roots = spec
        .mounts
        .iter()
        .map(|m| SandboxRoot {
            // Lossy: a path that is not UTF-8 is still recorded, readably.
            inside: m.inside.to_string_lossy().into_owned(),
            writable: spec.is_writable(m),
        })
        .collect();
    SandboxExecStarted {
        program: spec.argv.first().cloned().unwrap_or_default(),
        argc: u64::try_from(spec.argv.len()).unwrap_or(u64::MAX),
        mode: spec.mode,
        network: spec.network,
        root_view: spec.root_view,
        roots,
        limits: spec.limits.clone(),
        class: WorkloadClass::Namespace,
        sandbox_run_id: None,
        runner_id: None,
        runner_hash: None,
        manifest_hash: None,
    }
}

/// What the run learned, layer by layer, as it went.
struct RunState {
    enforcement: Enforcement,
    landlock_reached: bool,
    exit: Option<ExitStatus>,
    exec_errno: Option<i32>,
    timed_out: bool,
    interrupted: bool,
    denied: Vec<SyscallDenial>,
    /// Landlock's refusals, from the audit log.
    refused: Vec<Violation>,
    bytes_written: Option<u64>,
    write_budget_reached: bool,
    peak_pids: Option<u64>,
    stdout: OutputReport,
    stderr: OutputReport,
    cpu_ms: u64,
    peak_memory_bytes: u64,
    oom_killed: bool,
    pids_limit_hit: bool,
}

impl RunState {
    fn new(spec: &SandboxSpec) -> Self {
        let not_reached = || LayerReport::not_enforced("not reached");
        RunState {
            enforcement: Enforcement {
                mode: spec.mode,
                network: spec.network,
                root_view: spec.root_view,
                host_uid: 0,
                host_gid: 0,
                host_identity: not_reached(),
                launch_policy: not_reached(),
                namespaces: not_reached(),
                filesystem: not_reached(),
                landlock: not_reached(),
                landlock_abi: confine::kernel_abi(),
                seccomp: not_reached(),
                evidence: not_reached(),
                storage: storage_planned(spec),
                privileges: not_reached(),
                cgroup: not_reached(),
                rlimits: not_reached(),
                memory: cgroup::report::not_reached(),
                pids: cgroup::report::not_reached(),
            },
            landlock_reached: false,
            exit: None,
            exec_errno: None,
            timed_out: false,
            interrupted: false,
            denied: Vec::new(),
            refused: Vec::new(),
            bytes_written: None,
            write_budget_reached: false,
            peak_pids: None,
            stdout: OutputReport::default(),
            stderr: OutputReport::default(),
            cpu_ms: 0,
            peak_memory_bytes: 0,
            oom_killed: false,
            pids_limit_hit: false,
        }
    }

    fn into_report(
        mut self,
        spec: &SandboxSpec,
        result: Result<(), SetupError>,
        started: Instant,
    ) -> SandboxReport {
        let setup_error = result.err();
        if spec.limits.max_write_bytes.is_some()
            && self.bytes_written.is_none()
            && self.exit.is_some()
            && spec.mounts.iter().any(|m| spec.is_writable(m))
        {
            // The program ran, and init was stopped before it could merge.
            self.enforcement.storage = LayerReport::degraded(
                "what the program wrote was NOT merged into its roots: the run was stopped \
                 (timeout, interrupt or the launcher's end) before init could merge it",
            );
        }
        if !self.landlock_reached {
            for layer in [
                &mut self.enforcement.rlimits,
                &mut self.enforcement.privileges,
            ] {
                *layer = LayerReport::not_enforced("not reached");
            }
            cgroup::report::floors_not_reached(&mut self.enforcement.memory);
            cgroup::report::floors_not_reached(&mut self.enforcement.pids);
        }
        let exit = match (&setup_error, self.exec_errno, self.exit) {
            (Some(_), _, _) => ExitStatus::NotStarted,
            (None, Some(errno), _) => ExitStatus::ExecFailed { errno },
            (None, None, Some(exit)) => exit,
            (None, None, None) => ExitStatus::NotStarted,
        };
        let exit_code = match exit {
            _ if setup_error.is_some() => 125,
            _ if self.timed_out => 124,
            ExitStatus::Exited { code } => code,
            ExitStatus::Signaled { signal } => 128 + signal,
            ExitStatus::ExecFailed { errno } if errno == libc::ENOENT => 127,
            ExitStatus::ExecFailed { .. } => 126,
            ExitStatus::NotStarted => 125,
        };
        SandboxReport {
            run_id: spec.run_id.clone(),
            exit,
            exit_code,
            wall_ms: started.elapsed().as_millis() as u64,
            cpu_ms: self.cpu_ms,
            peak_memory_bytes: self.peak_memory_bytes,
            timed_out: self.timed_out,
            oom_killed: self.oom_killed,
            pids_limit_hit: self.pids_limit_hit,
            interrupted: self.interrupted,
            stdout: self.stdout,
            stderr: self.stderr,
            violations: self
                .refused
                .into_iter()
                .chain(self.denied.iter().map(|d| Violation {
                    layer: "seccomp".into(),
                    access: "syscall".into(),
                    object: Some(d.syscall.clone()),
                    count: d.count,
                }))
                .collect(),
            bytes_written: self.bytes_written,
            peak_pids: self.peak_pids,
            write_budget_reached: self.write_budget_reached,
            denied_syscalls: self.denied,
            launcher_peak_rss_kib: launcher_peak_rss_kib(),
            setup_error: setup_error.map(|e| e.to_string()),
            class: WorkloadClass::Namespace,
            vm: None,
            worker: None,
            enforcement: self.enforcement,
        }
    }
}

fn launcher_peak_rss_kib() -> u64 {
    // SAFETY: rusage is plain old data for getrusage to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: usage is a valid rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_maxrss.max(0) as u64
}

/// Kills and reaps the clone unless the run reached its normal end.
struct ChildGuard {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    reaped: bool,
}

impl ChildGuard {
    /// Reaps the clone (init); returns its wait status and resource usage.
    fn reap(&mut self) -> (i32, libc::rusage) {
        let mut status = 0;
        // SAFETY: rusage is plain old data for wait4 to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: status and usage are valid; pid is our own child.
            let r = unsafe { libc::wait4(self.pid, &mut status, libc::__WALL, &mut usage) };
            if r >= 0 || sys::errno() != libc::EINTR {
                break;
            }
        }
        self.reaped = true;
        (status, usage)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = sys::pidfd_send_signal(&self.pidfd, libc::SIGKILL);
            self.reap();
        }
    }
}

/// Removes the run's cgroup whatever happens: explicitly at the end of a
/// run (where a failure is reported), or on drop if the run was cut short.
struct CgroupGuard(Option<Box<dyn RunCgroup>>);

impl CgroupGuard {
    fn get(&self) -> Option<&dyn RunCgroup> {
        self.0.as_deref()
    }

    fn get_mut(&mut self) -> Option<&mut (dyn RunCgroup + 'static)> {
        self.0.as_deref_mut()
    }

    fn remove(mut self) -> std::io::Result<()> {
        self.0.take().map_or(Ok(()), |cgroup| cgroup.remove())
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Some(cgroup) = self.0.take() {
            let _ = cgroup.remove();
        }
    }
}

/// Blocks the interrupting signals (so they reach our signalfd) and restores
/// the previous mask afterwards.
struct SignalGuard {
    previous: libc::sigset_t,
    fd: Option<OwnedFd>,
}

const INTERRUPTS: &[libc::c_int] = &[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Blocks SIGINT, SIGTERM, SIGHUP and SIGQUIT for the rest of the calling
/// (single-threaded) process. [`run`] receives them through a signalfd and
/// forwards them to the sandbox; a command-line tool calls this first so that
/// an interrupt arriving after a run cannot kill it before it has written the
/// report.
pub fn hold_interrupts() {
    // SAFETY: sigset_t is manipulated only through the libc helpers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in INTERRUPTS {
            libc::sigaddset(&mut set, *signal);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

impl SignalGuard {
    fn new() -> Self {
        // SAFETY: sigset_t values are plain old data manipulated only through
        // the libc helpers; signalfd returns a new descriptor or -1.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signal in INTERRUPTS {
                libc::sigaddset(&mut set, *signal);
            }
            libc::sigprocmask(libc::SIG_BLOCK, &set, &mut previous);
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
            SignalGuard {
                previous,
                fd: (fd >= 0).then(|| OwnedFd::from_raw_fd(fd)),
            }
        }
    }
}

impl SignalGuard {
    /// Takes any interrupt still pending (arrived after the supervision loop
    /// ended), so restoring the mask cannot kill the launcher before the
    /// report is written. Returns whether there was one.
    fn take_pending(&self) -> bool {
        let mut any = false;
        // SAFETY: sigset_t manipulated through the libc helpers; a zero
        // timeout makes sigtimedwait a non-blocking poll of pending signals.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signal in INTERRUPTS {
                libc::sigaddset(&mut set, *signal);
            }
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            while libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) > 0 {
                any = true;
            }
        }
        any
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in new().
        unsafe { libc::sigprocmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut()) };
    }
}

/// What a refused `connect(2)` was, by network mode.
fn connect_denial(network: NetworkMode) -> &'static str {
    match network {
        NetworkMode::IngressOnly => {
            "a TCP connection out of an ingress-only sandbox (it may only be connected to)"
        }
        _ => "a TCP connection that bypasses the egress proxy",
    }
}

fn io_err(layer: Layer, what: &str) -> impl FnOnce(std::io::Error) -> SetupError + '_ {
    move |e| SetupError::io(layer, what, e)
}

/// Where a run's output goes, and who takes the egress listener.
struct Buffers<'a, 'e> {
    stdout: &'a mut Vec<u8>,
    stderr: &'a mut Vec<u8>,
    egress: Option<&'a mut (dyn EgressHook + 'e)>,
}

fn launch(
    spec: &SandboxSpec,
    output: OutputMode,
    events: &mut Emitter<'_>,
    state: &mut RunState,
    buffers: Buffers<'_, '_>,
) -> Result<(), SetupError> {
    let Buffers {
        stdout: stdout_buf,
        stderr: stderr_buf,
        egress,
    } = buffers;
    let threads = sys::thread_count().map_err(io_err(Layer::Launcher, "counting threads"))?;
    if threads > 1 {
        return Err(SetupError::new(
            Layer::Launcher,
            "the launcher must be single-threaded when it clones the sandbox",
        ));
    }
    // Before anything is mounted, or even opened for mounting.
    state.enforcement.launch_policy = match spec.launch_policy.check(spec) {
        Ok(report) => report,
        Err(refused) => {
            state.enforcement.launch_policy =
                LayerReport::enforced(format!("refused the spec: {}", refused.message));
            return Err(refused);
        }
    };
    // Listening starts before the clone, so that no record of the run is missed.
    let mut audit = AuditLog::open(state.enforcement.landlock_abi);
    // SAFETY: plain id query.
    let launched_by_root = unsafe { libc::geteuid() } == 0;
    let mut fs_notes = Vec::new();
    let idmapped = if launched_by_root && !spec.mounts.is_empty() {
        match IdmappedRoots::prepare(spec) {
            Ok(roots) => roots,
            Err(e) if spec.allow_degraded => {
                fs_notes.push(format!("idmapped roots unavailable ({e}): plain binds"));
                IdmappedRoots::none()
            }
            Err(e) => return Err(e),
        }
    } else {
        IdmappedRoots::none()
    };
    let id = identity(spec, idmapped.owner)?;
    state.enforcement.host_uid = id.host.0;
    state.enforcement.host_gid = id.host.1;
    state.enforcement.host_identity = id.report.clone();
    let new_netns = spec.network != NetworkMode::Full;
    // Bound before anything is cloned: a path that exists refuses the run.
    let mut listeners = if spec.expose.is_empty() {
        None
    } else {
        Some(ingress::Listeners::bind(&spec.expose)?)
    };
    let mut forwarder_note = None;

    let pipe = |what| sys::pipe().map_err(io_err(Layer::Launcher, what));
    // A socket rather than a pipe: the go-ahead into the cgroup carries the
    // files through which init enters it.
    let (sync, init_sync) = sys::socketpair().map_err(io_err(Layer::Launcher, "sync socket"))?;
    let (status_read, status_write) = pipe("status pipe")?;
    let (stdout_read, stdout_write) = pipe("stdout pipe")?;
    let (stderr_read, stderr_write) = pipe("stderr pipe")?;
    let (notify_receive, notify_send) =
        sys::socketpair().map_err(io_err(Layer::Launcher, "notify socket"))?;
    if audit.is_ok()
        && let Err(e) = sys::set_passcred(notify_receive.as_raw_fd())
    {
        audit = Err(format!("cannot learn the program's pid: {e}"));
    }
    // The network namespace is made beside the clone, not by it (see
    // `netns`), and comes to init over this socket.
    let (netns_receive, netns_send) = if new_netns {
        let (receive, send) =
            sys::socketpair().map_err(io_err(Layer::Network, "network namespace socket"))?;
        (Some(receive), Some(send))
    } else {
        (None, None)
    };
    // Bytes for the program's stdin: written whole before the clone (they
    // fit in the pipe), the write end closed, so the program reads them and
    // then end of file.
    let stdin_read = match &spec.stdin_data {
        None => None,
        Some(data) => {
            let (read, write) = pipe("stdin pipe")?;
            let mut writer = std::fs::File::from(write);
            std::io::Write::write_all(&mut writer, data)
                .map_err(io_err(Layer::Launcher, "stdin pipe"))?;
            drop(writer);
            Some(read)
        }
    };
    let mut signals = SignalGuard::new();

    // On a unified (cgroup v2) host the run's cgroup is made now and init is
    // cloned into it (see `cgroup`); a failure here refuses before the clone.
    let (mut cgroup, refused_early) = if cgroup::made_before_clone() {
        match cgroup::create_for_clone(&spec.run_id, &spec.limits) {
            Ok(made) => (Some(CgroupGuard(Some(made))), None),
            Err(e) => (None, Some(cgroup_refused(spec, e)?)),
        }
    } else {
        (None, None)
    };
    let clone_into = cgroup
        .as_ref()
        .and_then(CgroupGuard::get)
        .and_then(|cg| cg.clone_target());
    let placement = Placement::plan();
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    let mut cloned_into = clone_into.is_some();
    let forked = match sys::clone3(flags as u64, clone_into) {
        // Linux before 5.7 has clone3 but not CLONE_INTO_CGROUP: init is
        // moved in after the clone instead.
        Err(e)
            if clone_into.is_some()
                && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::E2BIG)) =>
        {
            cloned_into = false;
            sys::clone3(flags as u64, None).map_err(io_err(Layer::Namespaces, "clone3"))?
        }
        Err(e) if clone_into.is_some() => {
            return Err(SetupError::io(
                Layer::Cgroup,
                "clone3 into the run's cgroup",
                e,
            ));
        }
        other => other.map_err(io_err(Layer::Namespaces, "clone3"))?,
    };
    let (pid, pidfd) = match forked {
        Forked::Child => child::init_main(ChildPlan {
            fds: ChildFds {
                sync: init_sync.as_raw_fd(),
                status_write: status_write.as_raw_fd(),
                stdout_write: stdout_write.as_raw_fd(),
                stderr_write: stderr_write.as_raw_fd(),
                notify_send: notify_send.as_raw_fd(),
                stdin_read: stdin_read.as_ref().map(|fd| fd.as_raw_fd()),
                pass: passed_fds(&spec.pass_fds),
                pass_len: spec.pass_fds.len(),
                netns_receive: netns_receive.as_ref().map(|fd| fd.as_raw_fd()),
                launcher_ends: [
                    &sync,
                    &status_read,
                    &stdout_read,
                    &stderr_read,
                    &notify_receive,
                ]
                .iter()
                .map(|fd| fd.as_raw_fd())
                .chain(signals.fd.as_ref().map(|fd| fd.as_raw_fd()))
                .chain(netns_send.as_ref().map(|fd| fd.as_raw_fd()))
                .chain(listeners.iter().flat_map(ingress::Listeners::raw_fds))
                // The host's audit log is the launcher's alone.
                .chain(audit.as_ref().ok().map(AuditLog::raw_fd))
                // The cgroup directory init was cloned into: of no use inside.
                .chain(clone_into)
                .collect(),
            },
            spec,
            idmapped: &idmapped,
            inside_uid: id.inside.0,
            inside_gid: id.inside.1,
            clear_groups: id.launched_by_root,
            placement: &placement,
            log_denials: audit.is_ok(),
        }),
        Forked::Parent { pid, pidfd } => {
            placement.keep_off_init_cpu();
            if let Some(cg) = cgroup.as_mut().and_then(CgroupGuard::get_mut) {
                cg.after_clone(cloned_into);
            }
            (pid, pidfd)
        }
    };
    drop((
        init_sync,
        status_write,
        stdout_write,
        stderr_write,
        notify_send,
        stdin_read,
        netns_receive,
    ));
    let mut guard = ChildGuard {
        pid,
        pidfd,
        reaped: false,
    };
    let mut status_lines = String::new();
    let result = setup_and_supervise(
        spec,
        output,
        events,
        state,
        SetupParts {
            id: &id,
            idmapped: &idmapped,
            guard: &mut guard,
            sync,
            status_read: &status_read,
            stdout_read,
            stderr_read,
            notify_receive,
            netns_send,
            cgroup,
            refused_early,
            placement: &placement,
            signals: signals.fd.take(),
            status_lines: &mut status_lines,
            stdout_buf,
            stderr_buf,
            egress,
            audit: &mut audit,
            listeners: listeners.as_mut(),
            forwarder_note: &mut forwarder_note,
        },
    );
    drop(listeners);
    if signals.take_pending() {
        state.interrupted = true;
    }
    let mut ns = vec!["user", "mount", "pid", "ipc", "uts", "cgroup"];
    let ingress_net;
    if spec.network.uses_egress_proxy() {
        ns.push("net (loopback only; the egress proxy listens at 127.0.0.1:3128)");
    } else if spec.network == NetworkMode::IngressOnly {
        let ports: Vec<String> = spec
            .expose
            .iter()
            .map(|e| format!("{} at {}", e.port, e.socket.display()))
            .collect();
        ingress_net = match (ports.is_empty(), &forwarder_note) {
            (true, _) => "net (loopback only; ingress-only with no port exposed)".to_owned(),
            (false, Some(confinement)) => format!(
                "net (loopback only; ingress-only: ports reached from the host through unix \
                 sockets, {}; {})",
                ports.join(", "),
                confinement.note
            ),
            (false, None) => format!(
                "net (loopback only; ingress-only: ports {} were to be exposed)",
                ports.join(", ")
            ),
        };
        ns.push(&ingress_net);
    } else if new_netns {
        ns.push("net (loopback only)");
    }
    let mut ns_detail = format!("new {} namespaces", ns.join(", "));
    if !new_netns {
        ns_detail.push_str("; the host network namespace is shared (--network full)");
    }
    // A forwarder confined less than fully (allowed by --allow-degraded)
    // is a degraded layer, not a footnote.
    let forwarder_degraded = forwarder_note.as_ref().is_some_and(|c| c.degraded);
    state.enforcement.namespaces = if forwarder_degraded {
        LayerReport::degraded(ns_detail)
    } else {
        LayerReport::enforced(ns_detail)
    };
    let mut fs = format!(
        "{} root on a read-only tmpfs, pivot_root, old root detached; fresh /proc; /dev with \
         null zero full random urandom; /tmp tmpfs {}",
        spec.root_view,
        moat_core::size::format_size(spec.limits.tmp_size_bytes)
    );
    for (i, m) in spec.mounts.iter().enumerate() {
        let how = if spec.is_writable(m) { "rw" } else { "ro" };
        let mapped = if idmapped.is_mapped(i) {
            ", idmapped"
        } else {
            ""
        };
        fs.push_str(&format!("; {} ({how}{mapped})", m.inside.display()));
    }
    if idmapped.root_owned_writable() {
        fs.push_str(
            "; a writable root is owned by host root: the program owns root's files in it \
             and in the read-only roots of root's (mapped alike)",
        );
    }
    for note in &fs_notes {
        fs.push_str("; ");
        fs.push_str(note);
    }
    state.enforcement.filesystem = if fs_notes.is_empty() {
        LayerReport::enforced(fs)
    } else {
        LayerReport::degraded(fs)
    };
    apply_messages(&status_lines, state, spec)?;
    result
}

struct SetupParts<'a, 'e> {
    id: &'a Identity,
    idmapped: &'a IdmappedRoots,
    guard: &'a mut ChildGuard,
    sync: OwnedFd,
    status_read: &'a OwnedFd,
    stdout_read: OwnedFd,
    stderr_read: OwnedFd,
    notify_receive: OwnedFd,
    netns_send: Option<OwnedFd>,
    /// The run's cgroup when it was made before the clone, or why it could
    /// not be (the run is degraded).
    cgroup: Option<CgroupGuard>,
    refused_early: Option<cgroup::CgroupError>,
    placement: &'a Placement,
    signals: Option<OwnedFd>,
    status_lines: &'a mut String,
    stdout_buf: &'a mut Vec<u8>,
    stderr_buf: &'a mut Vec<u8>,
    egress: Option<&'a mut (dyn EgressHook + 'e)>,
    /// The kernel's audit log, or why the evidence layer cannot read it.
    audit: &'a mut Result<AuditLog, String>,
    /// The host sockets of the exposed ports (`ingress-only`).
    listeners: Option<&'a mut ingress::Listeners>,
    /// How the ingress forwarder is confined, once it runs.
    forwarder_note: &'a mut Option<ingress::Confinement>,
}

fn setup_and_supervise(
    spec: &SandboxSpec,
    output: OutputMode,
    events: &mut Emitter<'_>,
    state: &mut RunState,
    parts: SetupParts<'_, '_>,
) -> Result<(), SetupError> {
    let SetupParts {
        id,
        idmapped,
        guard,
        sync,
        status_read,
        stdout_read,
        stderr_read,
        notify_receive,
        netns_send,
        mut cgroup,
        refused_early,
        placement,
        signals,
        status_lines,
        stdout_buf,
        stderr_buf,
        egress,
        audit,
        listeners,
        forwarder_note,
    } = parts;
    let now = Instant::now();
    let deadline = now
        .checked_add(std::time::Duration::from_millis(spec.limits.timeout_ms))
        .unwrap_or(now + std::time::Duration::from_secs(86_400 * 30));
    let mut forwarder = None;
    // Failures of the child before it reports are read from the status pipe
    // even when the launcher's own step fails afterwards.
    let outside = (|| {
        write_id_maps(guard.pid, id)?;
        // Opened before init changes its ids (and so stops being dumpable).
        let userns = if !idmapped.is_empty() || netns_send.is_some() {
            let file = std::fs::File::open(format!("/proc/{}/ns/user", guard.pid))
                .map_err(io_err(Layer::UserMapping, "opening the user namespace"))?;
            Some(OwnedFd::from(file))
        } else {
            None
        };
        if let Some(userns) = userns.as_ref().filter(|_| !idmapped.is_empty()) {
            idmapped.apply(spec, userns)?;
        }
        sys::write_all(sync.as_raw_fd(), b"M").map_err(io_err(Layer::Launcher, "sync"))?;
        if let (Some(to_init), Some(userns)) = (netns_send.as_ref(), &userns) {
            let netns = netns::make_for_init(userns, to_init, listeners.is_some())?;
            // Before init lets the program go: a forwarder that cannot run
            // refuses the run.
            if let (Some(listeners), Some(netns)) = (listeners, netns) {
                let ids = ingress::ForwarderIds {
                    uid: id.inside.0,
                    gid: id.inside.1,
                    clear_groups: id.launched_by_root,
                };
                let (started, confinement) =
                    ingress::start(listeners, userns, netns, ids, spec.allow_degraded)?;
                forwarder = Some(started);
                *forwarder_note = Some(confinement);
            }
        }
        let entry = place_in_cgroup(spec, guard.pid, state, &mut cgroup, refused_early)?;
        let token = if cgroup.is_some() { b'C' } else { b'N' };
        let raw: Vec<_> = entry.iter().map(|fd| fd.as_raw_fd()).collect();
        // With the count, so that init notices descriptors the kernel dropped.
        let count = u8::try_from(raw.len()).unwrap_or(u8::MAX);
        sys::send_with_fds(sync.as_raw_fd(), &[token, count], &raw)
            .map_err(io_err(Layer::Launcher, "sync"))?;
        drop(entry);
        // Setup is over: the launcher (and the egress proxy it may start)
        // gets all its CPUs back. Best effort: this only costs the launcher time.
        let _ = placement.restore();
        if let Some(handler) = egress {
            // init sends the listener before it starts the program.
            let listener = sys::recv_fd(notify_receive.as_raw_fd())
                .map_err(io_err(Layer::Network, "receiving the egress listener"))?
                .ok_or_else(|| SetupError::new(Layer::Network, "init sent no egress listener"))?;
            handler
                .serve(listener)
                .map_err(|e| SetupError::new(Layer::Network, e))?;
        }
        Ok(())
    })();
    // When a step above failed first (a no-op otherwise).
    let _ = placement.restore();
    if let Err(e) = outside {
        // Killed before it can see the hang-up: an init that read a closed
        // socket first (the sync one, or the one its network namespace
        // comes on) would report that its launcher went away or that no
        // namespace came, and that echo would be recorded in place of the
        // cause. Once the kill is sent, init dies on its next way back from
        // the kernel, so nothing it could write after the hang-up reaches
        // the status pipe.
        let _ = sys::pidfd_send_signal(&guard.pidfd, libc::SIGKILL);
        drop((sync, netns_send));
        guard.reap();
        read_status(status_read, status_lines);
        // Only now, with init gone from it, can the cgroup go.
        drop(cgroup);
        return Err(e);
    }
    drop(netns_send);
    let cap = spec.limits.max_output_bytes;
    let tcp = crate::child::tcp_rules(spec);
    // The sandbox's pid namespace (init's): a Landlock domain a program
    // stacks itself is the run's too.
    let mut tracker = Tracker::new(
        audit
            .as_ref()
            .ok()
            .and_then(|_| crate::evidence::pid_namespace_of(guard.pid.unsigned_abs())),
    );
    let mut stdout = Stream::new(stdout_read, output, 1, cap);
    let mut stderr = Stream::new(stderr_read, output, 2, cap);
    let supervision = supervise::supervise(
        Watched {
            pidfd: &guard.pidfd,
            init_done: &sync,
            stdout: &mut stdout,
            stderr: &mut stderr,
            notify_receive: Some(notify_receive),
            signals,
            deadline,
            tcp: tcp.as_ref(),
            audit: audit.as_mut().ok().map(|log| (log, &mut tracker)),
        },
        &mut |denial| match denial {
            Denial::Syscall { name, arch, nr } => events.emit(syscall_denied(name, arch, nr)),
            Denial::Bind { address } => events.emit(EventData::NetworkDenied(NetworkDenied {
                address: Some(address),
                reason: Some(moat_core::DenialReason::NetworkNotAllowed),
                detail: Some(
                    "a TCP bind to a port the ingress-only sandbox does not expose".into(),
                ),
                layer: Some("seccomp".into()),
                errno: Some("EACCES".into()),
                ..NetworkDenied::default()
            })),
            Denial::Connect { address } => events.emit(EventData::NetworkDenied(NetworkDenied {
                address: Some(address),
                reason: Some(moat_core::DenialReason::DirectConnection),
                detail: Some(connect_denial(spec.network).into()),
                layer: Some("seccomp".into()),
                errno: Some("EACCES".into()),
                ..NetworkDenied::default()
            })),
            Denial::Landlock(violation) => emit_violation(events, violation),
        },
    );
    drop(sync);
    if let Some(forwarder) = forwarder {
        let (records, problem) = forwarder.finish();
        for record in records {
            events.emit(EventData::NetworkIngress(record));
        }
        if let Some(e) = problem {
            events.emit(EventData::NetworkDenied(NetworkDenied {
                detail: Some(format!("the ingress forwarder's records were lost: {e}")),
                ..NetworkDenied::default()
            }));
        }
    }
    // Read while init finishes exiting: once it reported the program's end,
    // nothing else of the sandbox runs (see `child::end_the_rest`).
    let stats = cgroup.as_ref().and_then(|c| c.get()).map(|c| c.stats());
    let (status, usage) = guard.reap();
    read_status(status_read, status_lines);

    // After init is gone, so that every denial was made before the marker.
    state.enforcement.evidence = match audit.as_mut() {
        Ok(log) => {
            let flushed = log.flush(&mut tracker, &mut |v| emit_violation(events, v));
            evidence_report(&tracker, flushed)
        }
        Err(reason) => LayerReport::not_enforced(format!(
            "Landlock's refusals are not observed: {reason}; seccomp's are (user notification)"
        )),
    };
    state.refused = tracker.violations();
    state.timed_out = supervision.timed_out;
    state.interrupted = supervision.interrupted;
    state.denied = supervision
        .denied
        .into_iter()
        .map(|(syscall, count)| SyscallDenial {
            syscall: syscall.to_owned(),
            count,
        })
        .collect();
    for (report, stream, buf) in [
        (&mut state.stdout, &mut stdout, stdout_buf),
        (&mut state.stderr, &mut stderr, stderr_buf),
    ] {
        report.bytes = stream.kept;
        report.truncated = stream.truncated;
        *buf = std::mem::take(&mut stream.captured);
    }
    state.exit = Some(if libc::WIFEXITED(status) {
        ExitStatus::Exited {
            code: libc::WEXITSTATUS(status),
        }
    } else {
        ExitStatus::Signaled {
            signal: libc::WTERMSIG(status),
        }
    });
    let rusage_cpu_ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    state.cpu_ms = rusage_cpu_ms(usage.ru_utime) + rusage_cpu_ms(usage.ru_stime);
    state.peak_memory_bytes = usage.ru_maxrss.max(0) as u64 * 1024;
    if let Some(stats) = stats {
        if let Some(ns) = stats.cpu_ns {
            state.cpu_ms = ns / 1_000_000;
        }
        if let Some(peak) = stats.peak_memory_bytes {
            state.peak_memory_bytes = peak;
        }
        state.peak_pids = stats.peak_pids;
        state.oom_killed = stats.oom_kills > 0;
        state.pids_limit_hit = stats.pids_limit_hits > 0;
    }
    if let Some(cgroup) = cgroup
        && let Err(e) = cgroup.remove()
    {
        state.enforcement.cgroup.detail = format!(
            "{}; removing it failed: {e}",
            state.enforcement.cgroup.detail
        );
    }
    Ok(())
}

/// The storage layer before the run: no budget, or one waiting for the
/// program's end.
fn storage_planned(spec: &SandboxSpec) -> LayerReport {
    match spec.limits.max_write_bytes {
        None => LayerReport::not_enforced(
            "no storage budget (limits.maxWriteBytes, moat exec --max-write): writable roots \
             take what their filesystem has",
        ),
        Some(_) if !spec.mounts.iter().any(|m| spec.is_writable(m)) => {
            LayerReport::enforced("a storage budget, and no writable root to spend it on")
        }
        Some(_) => LayerReport::not_enforced("not reached"),
    }
}

fn emit_violation(events: &mut Emitter<'_>, violation: &Violation) {
    events.emit(EventData::SandboxViolation(SandboxViolation {
        layer: violation.layer.clone(),
        access: violation.access.clone(),
        object: violation.object.clone(),
        errno: if violation.access.starts_with("scope.") {
            "EPERM".into()
        } else {
            "EACCES".into()
        },
        message: violation.describe(),
        sandbox_run_id: None,
        runner_id: None,
        runner_hash: None,
        manifest_hash: None,
    }))
}

/// What the evidence layer could vouch for, once the run has ended.
fn evidence_report(tracker: &Tracker, flushed: bool) -> LayerReport {
    const WHAT: &str = "Landlock's refusals read from the kernel audit log (decoy credentials in \
                        /root), seccomp's by user notification";
    if !tracker.knows_payload() {
        LayerReport::degraded(format!(
            "{WHAT}; the program's pid never reached the launcher, so Landlock's records could \
             not be told from other runs'"
        ))
    } else if tracker.lost {
        LayerReport::degraded(format!(
            "{WHAT}; audit records were dropped while the run went on (socket overflow or \
             the kernel's backlog): the counts are a lower bound"
        ))
    } else if !flushed {
        LayerReport::degraded(format!(
            "{WHAT}; the audit log did not confirm the run's end within 500 ms: refusals made \
             just before it may be missing"
        ))
    } else {
        let mut detail = WHAT.to_owned();
        if tracker.nested {
            detail.push_str(
                "; with the refusals of Landlock domains the program stacked itself (recognised \
                 while their creator still ran)",
            );
        }
        if tracker.folded {
            detail.push_str(
                "; more distinct refusals than are listed: the rest are counted per access",
            );
        }
        LayerReport::enforced(detail)
    }
}

/// Refuses a run without cgroup limits, unless degrading was allowed or
/// the deployment was declared to bound runs instead (then the reason is
/// kept for the report).
fn cgroup_refused(
    spec: &SandboxSpec,
    e: cgroup::CgroupError,
) -> Result<cgroup::CgroupError, SetupError> {
    if spec.without_cgroup {
        return Ok(cgroup::CgroupError(format!(
            "{e}; declared: the deployment's limits bound this run, with the others it runs beside"
        )));
    }
    if spec.allow_degraded {
        return Ok(e);
    }
    Err(SetupError::new(
        Layer::Cgroup,
        format!(
            "{e} (where the deployment bounds runs instead, say so: moat exec \
             --without-cgroup-limits, or a manifest's cgroupLimits \"deployment\"; \
             --allow-degraded runs without whatever protection is missing)"
        ),
    ))
}

/// Creates the run's cgroup into `cgroup` (unless it was made before the
/// clone) and admits init (see [`RunCgroup::admit`]): the files returned go to
/// init with the `C` token. The cgroup stays with the caller, which removes it
/// once init is gone, whatever happens.
fn place_in_cgroup(
    spec: &SandboxSpec,
    pid: libc::pid_t,
    state: &mut RunState,
    cgroup: &mut Option<CgroupGuard>,
    refused_early: Option<cgroup::CgroupError>,
) -> Result<Vec<OwnedFd>, SetupError> {
    let limits = &spec.limits;
    let admitted = match refused_early {
        Some(e) => Err(e),
        None => (|| {
            if cgroup.is_none() {
                *cgroup = Some(CgroupGuard(Some(cgroup::create(
                    &spec.run_id,
                    limits,
                    pid,
                )?)));
            }
            cgroup
                .as_ref()
                .and_then(CgroupGuard::get)
                .ok_or_else(|| cgroup::CgroupError("internal: no cgroup".into()))?
                .admit(pid)
                .map_err(|e| cgroup::CgroupError(format!("attaching the sandbox: {e}")))
        })(),
    };
    let (report, entry) = match admitted {
        Ok(entry) => {
            let describe = cgroup
                .as_ref()
                .and_then(CgroupGuard::get)
                .map(|c| c.describe())
                .unwrap_or_default();
            (cgroup::report::with_cgroup(&describe, limits), entry)
        }
        Err(e) => {
            // init is not in a cgroup it could not be admitted to.
            *cgroup = None;
            let e = cgroup_refused(spec, e)?;
            (cgroup::report::with_floors(&e.0, limits), Vec::new())
        }
    };
    state.enforcement.cgroup = report.layer;
    state.enforcement.memory = report.memory;
    state.enforcement.pids = report.pids;
    Ok(entry)
}

/// Reads the status pipe to its end (every writer is gone once init is reaped).
fn read_status(fd: &OwnedFd, into: &mut String) {
    let mut buf = [0u8; 4096];
    loop {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 1000) } <= 0 {
            return;
        }
        match sys::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => into.push_str(&String::from_utf8_lossy(buf.get(..n).unwrap_or_default())),
        }
    }
}

fn apply_messages(lines: &str, state: &mut RunState, spec: &SandboxSpec) -> Result<(), SetupError> {
    let mut setup_error = None;
    for message in lines.lines().filter_map(Message::decode) {
        match message {
            Message::Setup(e) => {
                setup_error.get_or_insert(e);
            }
            Message::Exec(errno) => state.exec_errno = Some(errno),
            Message::Exited(code) => state.exit = Some(ExitStatus::Exited { code }),
            Message::Signaled(signal) => state.exit = Some(ExitStatus::Signaled { signal }),
            Message::Landlock(status, detail) => {
                state.landlock_reached = true;
                state.enforcement.landlock = LayerReport { status, detail };
                let limits = &spec.limits;
                state.enforcement.rlimits = LayerReport::enforced(format!(
                    "NOFILE {}, FSIZE {}, CORE 0, CPU {}s",
                    limits.open_files,
                    moat_core::size::format_size(limits.file_size_bytes),
                    limits.cpu_seconds_floor()
                ));
                state.enforcement.privileges = LayerReport::enforced(
                    "all capabilities dropped (bounding, ambient, effective, permitted, \
                     inheritable), securebits locked, no_new_privs",
                );
            }
            Message::Stored {
                written,
                full,
                failures,
            } => {
                state.bytes_written = Some(written);
                state.write_budget_reached = full;
                let limit = spec.limits.max_write_bytes.unwrap_or(0);
                let mut detail = format!(
                    "writable roots share a {} budget (a tmpfs below an overlay of each, merged \
                     into the roots when the program ended): {} written{}",
                    moat_core::size::format_size(limit),
                    moat_core::size::format_size(written),
                    if full {
                        "; the budget was used up: writes past it got ENOSPC"
                    } else {
                        ""
                    }
                );
                state.enforcement.storage = if failures.is_empty() {
                    LayerReport::enforced(detail)
                } else {
                    detail.push_str(&format!("; NOT merged: {failures}"));
                    LayerReport::degraded(detail)
                };
            }
            Message::Seccomp(notify) => {
                state.enforcement.seccomp = LayerReport::enforced(if notify {
                    "deny list with architecture check; denials reported to the launcher"
                } else {
                    "deny list with architecture check (EPERM; denials not observable here)"
                });
            }
        }
    }
    match setup_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The spec's passed descriptors as the payload places them (validated:
/// at most [`crate::spec::MAX_PASSED_FDS`]).
fn passed_fds(
    fds: &[std::sync::Arc<std::os::fd::OwnedFd>],
) -> [std::os::fd::RawFd; crate::spec::MAX_PASSED_FDS] {
    let mut raw = [-1; crate::spec::MAX_PASSED_FDS];
    for (slot, fd) in raw.iter_mut().zip(fds) {
        *slot = fd.as_raw_fd();
    }
    raw
}
