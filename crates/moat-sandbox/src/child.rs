//! The two processes inside the sandbox.
//!
//! *init* is the clone itself: pid 1 of the new pid namespace. It waits for
//! the launcher to map its ids, builds the root, forks the program, then reaps
//! zombies and forwards signals until the program exits — at which point it
//! exits too, and the kernel kills whatever the program left behind.
//!
//! The *payload* is init's child: it confines itself (rlimits, capabilities,
//! Landlock, seccomp) and `execve`s the program. Both report to the launcher
//! over the status pipe in one-line messages (see [`Message`]).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use std::path::{Path, PathBuf};

use moat_core::{LayerStatus, NetworkMode, SandboxMode};

use crate::cgroup;
use crate::confine::{self, LandlockPlan, Rlimit, TcpRules};
use crate::error::{Layer, SetupError};
use crate::launch::{EGRESS_PORT, SANDBOX_PATH};
use crate::mounts::{IdmappedRoots, RootPlan};
use crate::netns;
use crate::placement::Placement;
use crate::seccomp::{self, SeccompPrograms};
use crate::spec::SandboxSpec;
use crate::sys;

/// Descriptors the child uses; the launcher's ends are closed first thing.
pub(crate) struct ChildFds {
    /// init's end of the sync socket: `M` and `C`/`N` (with the cgroup's
    /// entry files) come in; `D` goes out once the program has ended and
    /// nothing else of the sandbox runs.
    pub(crate) sync: RawFd,
    pub(crate) status_write: RawFd,
    pub(crate) stdout_write: RawFd,
    pub(crate) stderr_write: RawFd,
    pub(crate) notify_send: RawFd,
    /// The program's stdin, when the spec gives it bytes.
    pub(crate) stdin_read: Option<RawFd>,
    /// Descriptors the program gets as 3, 4, ... (`pass_len` of them): a
    /// fixed array, as the payload moves them between vfork and exec,
    /// where nothing may be allocated.
    pub(crate) pass: [RawFd; crate::spec::MAX_PASSED_FDS],
    pub(crate) pass_len: usize,
    /// Where the network namespace comes from, unless the run shares the
    /// host's (see [`crate::netns`]).
    pub(crate) netns_receive: Option<RawFd>,
    pub(crate) launcher_ends: Vec<RawFd>,
}

/// What the payload needs to confine itself and exec.
pub(crate) struct ExecPlan {
    pub(crate) argv: Vec<CString>,
    pub(crate) envp: Vec<CString>,
    /// Paths to try in order (the program, or each `PATH` entry joined with it).
    pub(crate) candidates: Vec<CString>,
    pub(crate) cwd: CString,
    pub(crate) rlimits: Vec<Rlimit>,
    pub(crate) landlock: LandlockPlan,
    pub(crate) seccomp: SeccompPrograms,
    /// Applied when the run has no cgroup, in place of its pids and memory
    /// limits: `RLIMIT_NPROC` and `RLIMIT_DATA` (per process, where the
    /// cgroup bounds the tree; see `cgroup::report`).
    pub(crate) floors: [Rlimit; 2],
    /// stdin is `/dev/null` whatever the launcher's is.
    pub(crate) stdin_null: bool,
    /// The writable roots' storage budget, merged by init at the end.
    pub(crate) budget: Option<crate::budget::Budget>,
}

/// Everything init starts from. The root and exec plans are computed by init
/// itself, in parallel with the launcher's own post-clone work.
pub(crate) struct ChildPlan<'a> {
    pub(crate) fds: ChildFds,
    pub(crate) spec: &'a SandboxSpec,
    pub(crate) idmapped: &'a IdmappedRoots,
    pub(crate) inside_uid: u32,
    pub(crate) inside_gid: u32,
    pub(crate) clear_groups: bool,
    pub(crate) placement: &'a Placement,
    /// The launcher reads the kernel's audit log: Landlock must log denials.
    pub(crate) log_denials: bool,
}

/// The program's whole environment: a few fixed names, the spec's own, and,
/// in the proxy network modes, the proxy's address under every usual name.
/// Nothing of the launcher's environment.
pub(crate) fn program_env(spec: &SandboxSpec) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), SANDBOX_PATH.into()),
        ("HOME".into(), "/tmp".into()),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    for (name, value) in &spec.env {
        match env.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value.clone(),
            None => env.push((name.clone(), value.clone())),
        }
    }
    env.retain(|(name, _)| name != "RUN_ID");
    env.push(("RUN_ID".into(), spec.run_id.clone()));
    if spec.network.uses_egress_proxy() {
        let proxy = format!("http://127.0.0.1:{EGRESS_PORT}");
        let no_proxy = "localhost,127.0.0.1,::1".to_owned();
        for (name, value) in [
            ("HTTP_PROXY", &proxy),
            ("HTTPS_PROXY", &proxy),
            ("ALL_PROXY", &proxy),
            ("NO_PROXY", &no_proxy),
        ] {
            for name in [name.to_owned(), name.to_ascii_lowercase()] {
                env.retain(|(n, _)| *n != name);
                env.push((name, value.clone()));
            }
        }
    }
    env
}

impl ExecPlan {
    fn from_spec(
        spec: &SandboxSpec,
        readable: Vec<PathBuf>,
        log_denials: bool,
    ) -> Result<ExecPlan, SetupError> {
        let bad = |what: &str| SetupError::new(Layer::Exec, format!("{what} contains a NUL byte"));
        let env = program_env(spec);
        let path = env
            .iter()
            .find(|(n, _)| n == "PATH")
            .map_or(SANDBOX_PATH.to_owned(), |(_, v)| v.clone());
        let program = spec.argv.first().map(String::as_str).unwrap_or_default();
        let candidates: Vec<PathBuf> = if program.contains('/') {
            vec![PathBuf::from(program)]
        } else {
            path.split(':')
                .filter(|dir| dir.starts_with('/'))
                .map(|dir| Path::new(dir).join(program))
                .collect()
        };
        let mut writable: Vec<PathBuf> = spec
            .mounts
            .iter()
            .filter(|m| spec.is_writable(m))
            .map(|m| m.inside.clone())
            .collect();
        writable.push(PathBuf::from("/tmp"));
        let limits = &spec.limits;
        let cpu = limits.cpu_seconds_floor();
        let tcp = tcp_rules(spec);
        let watch_connect = tcp.is_some();
        Ok(ExecPlan {
            argv: spec
                .argv
                .iter()
                .map(|a| CString::new(a.as_str()).map_err(|_| bad("an argument")))
                .collect::<Result<_, _>>()?,
            envp: env
                .iter()
                .map(|(n, v)| CString::new(format!("{n}={v}")).map_err(|_| bad("the environment")))
                .collect::<Result<_, _>>()?,
            candidates: candidates
                .iter()
                .map(|c| sys::cstring(c).map_err(|_| bad("the program path")))
                .collect::<Result<_, _>>()?,
            cwd: sys::cstring(&spec.effective_cwd()).map_err(|_| bad("the cwd"))?,
            rlimits: vec![
                rlimit(libc::RLIMIT_NOFILE, limits.open_files, limits.open_files),
                rlimit(
                    libc::RLIMIT_FSIZE,
                    limits.file_size_bytes,
                    limits.file_size_bytes,
                ),
                rlimit(libc::RLIMIT_CORE, 0, 0),
                rlimit(libc::RLIMIT_CPU, cpu, cpu + 1),
            ],
            landlock: LandlockPlan {
                writable,
                readable,
                log_denials,
                everything_writable: spec.mode == SandboxMode::DangerFullAccess,
                tcp,
                allow_degraded: spec.allow_degraded,
            },
            seccomp: seccomp::compile(
                spec.network.uses_egress_proxy() || spec.network == NetworkMode::IngressOnly,
                watch_connect,
                spec.network == NetworkMode::IngressOnly,
            )?,
            floors: [
                rlimit(libc::RLIMIT_NPROC, limits.pids, limits.pids),
                rlimit(libc::RLIMIT_DATA, limits.memory_bytes, limits.memory_bytes),
            ],
            stdin_null: spec.stdin_null,
            budget: None,
        })
    }
}

/// What Landlock allows of TCP, by network mode (see [`TcpRules`]).
pub(crate) fn tcp_rules(spec: &SandboxSpec) -> Option<TcpRules> {
    match spec.network {
        NetworkMode::ProxyOnly | NetworkMode::Allowlist if !spec.tcp_on_loopback => {
            Some(TcpRules {
                connect: vec![EGRESS_PORT],
                bind: Vec::new(),
            })
        }
        NetworkMode::IngressOnly => Some(TcpRules {
            connect: Vec::new(),
            bind: spec.expose.iter().map(|e| e.port).collect(),
        }),
        _ => None,
    }
}

fn rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Rlimit {
    Rlimit {
        resource,
        soft,
        hard,
    }
}

/// Lines on the status pipe, child → launcher.
pub(crate) enum Message {
    /// `E <layer>\t<message>`: setup failed; the program never ran.
    Setup(SetupError),
    /// `X <errno>`: `execve` failed.
    Exec(i32),
    /// `S e <code>` / `S s <signal>`: how the program ended.
    Exited(i32),
    Signaled(i32),
    /// `L <2|1|0>\t<detail>`: Landlock enforced, degraded or not.
    Landlock(LayerStatus, String),
    /// `C <1|0>`: seccomp installed with (1) or without (0) user notification.
    Seccomp(bool),
    /// `W <bytes> <1|0>\t<failures>`: what the program wrote under the
    /// storage budget, whether it used it up, and what could not be merged.
    Stored {
        written: u64,
        full: bool,
        failures: String,
    },
}

impl Message {
    fn encode(&self) -> String {
        let clean = |s: &str| s.replace(['\n', '\t'], " ");
        match self {
            Message::Setup(e) => format!("E {}\t{}\n", e.layer.as_str(), clean(&e.message)),
            Message::Exec(errno) => format!("X {errno}\n"),
            Message::Exited(code) => format!("S e {code}\n"),
            Message::Signaled(signal) => format!("S s {signal}\n"),
            Message::Landlock(status, detail) => {
                let level = match status {
                    LayerStatus::Enforced => 2,
                    LayerStatus::Degraded => 1,
                    LayerStatus::NotEnforced => 0,
                };
                format!("L {level}\t{}\n", clean(detail))
            }
            Message::Seccomp(notify) => format!("C {}\n", u8::from(*notify)),
            Message::Stored {
                written,
                full,
                failures,
            } => format!("W {written} {}\t{}\n", u8::from(*full), clean(failures)),
        }
    }

    pub(crate) fn decode(line: &str) -> Option<Message> {
        let (tag, rest) = line.split_once(' ')?;
        Some(match tag {
            "E" => {
                let (layer, message) = rest.split_once('\t')?;
                Message::Setup(SetupError::new(Layer::from_name(layer), message))
            }
            "X" => Message::Exec(rest.parse().ok()?),
            "S" => match rest.split_once(' ')? {
                ("e", code) => Message::Exited(code.parse().ok()?),
                ("s", signal) => Message::Signaled(signal.parse().ok()?),
                _ => return None,
            },
            "L" => {
                let (full, detail) = rest.split_once('\t')?;
                let status = match full {
                    "2" => LayerStatus::Enforced,
                    "1" => LayerStatus::Degraded,
                    _ => LayerStatus::NotEnforced,
                };
                Message::Landlock(status, detail.to_owned())
            }
            "C" => Message::Seccomp(rest == "1"),
            "W" => {
                let (counts, failures) = rest.split_once('\t')?;
                let (written, full) = counts.split_once(' ')?;
                Message::Stored {
                    written: written.parse().ok()?,
                    full: full == "1",
                    failures: failures.to_owned(),
                }
            }
            _ => return None,
        })
    }
}

fn send(fd: RawFd, message: &Message) {
    // Nothing useful can be done if the launcher is gone.
    let _ = sys::write_all(fd, message.encode().as_bytes());
}

fn exit(code: i32) -> ! {
    // SAFETY: _exit never returns and runs no destructors or atexit handlers,
    // which belong to the launcher process we were copied from.
    unsafe { libc::_exit(code) }
}

/// Entry point of the clone. Never returns.
pub(crate) fn init_main(plan: ChildPlan<'_>) -> ! {
    plan.placement.take_init_cpu();
    match init_setup(&plan) {
        Ok(exec) => init_run(&plan, exec),
        Err(e) => {
            send(plan.fds.status_write, &Message::Setup(e));
            exit(125)
        }
    }
}

fn wait_token(fd: RawFd, expected: &[u8]) -> Result<u8, SetupError> {
    wait_token_with_fds(fd, expected).map(|(token, _)| token)
}

/// A token from the launcher, with the descriptors that came with it.
fn wait_token_with_fds(fd: RawFd, expected: &[u8]) -> Result<(u8, Vec<OwnedFd>), SetupError> {
    let mut byte = [0u8; 1];
    let mut fds = Vec::new();
    match sys::recv_with_fds(fd, &mut byte, &mut fds) {
        Ok(1) if expected.contains(&byte[0]) => Ok((byte[0], fds)),
        Ok(1) => Err(SetupError::new(
            Layer::Launcher,
            "the launcher aborted the setup",
        )),
        Ok(_) => Err(SetupError::new(Layer::Launcher, "the launcher went away")),
        Err(e) => Err(SetupError::io(
            Layer::Launcher,
            "waiting for the launcher",
            e,
        )),
    }
}

fn init_setup(plan: &ChildPlan<'_>) -> Result<ExecPlan, SetupError> {
    for fd in &plan.fds.launcher_ends {
        // SAFETY: these are our copies of the launcher's pipe ends; closing them
        // only affects this process.
        unsafe { libc::close(*fd) };
    }
    // The sandbox is what the kernel kills first when memory runs out, not
    // the runner or the shell that launched it (the payload inherits it).
    // Raising one's own score needs no privilege.
    std::fs::write("/proc/self/oom_score_adj", "1000")
        .map_err(|e| SetupError::io(Layer::Launcher, "oom_score_adj", e))?;
    // Planning reads host metadata and small /etc files; it needs no ids yet.
    // Decoys only where attempts on them are observed: without the evidence
    // layer they would cost start-up time and show nothing.
    let root = RootPlan::new(
        plan.spec,
        (plan.inside_uid, plan.inside_gid),
        plan.idmapped,
        plan.log_denials,
    );
    let readable = if plan.log_denials {
        root.readable(plan.spec)
    } else {
        vec![PathBuf::from("/")]
    };
    let mut exec = ExecPlan::from_spec(plan.spec, readable, plan.log_denials)?;
    wait_token(plan.fds.sync, b"M")?;
    become_sandbox_user(plan)?;
    // After the id change (which resets it), so the sandbox dies with the launcher.
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(SetupError::io(
            Layer::Launcher,
            "PR_SET_PDEATHSIG",
            std::io::Error::last_os_error(),
        ));
    }
    exec.budget = root.build()?;
    // SAFETY: the name is a valid buffer of the given length.
    if unsafe { libc::sethostname(c"moat".as_ptr(), 4) } != 0 {
        return Err(SetupError::io(
            Layer::Namespaces,
            "sethostname",
            std::io::Error::last_os_error(),
        ));
    }
    if let Some(fd) = plan.fds.netns_receive {
        netns::join(fd)?;
        // SAFETY: our end of the socket; nothing more comes on it.
        unsafe { libc::close(fd) };
        // Here rather than in the helper: init has time to spare, the
        // launcher's side of the setup has not.
        netns::loopback_up().map_err(|e| SetupError::io(Layer::Network, "bringing up lo", e))?;
    }
    if plan.spec.network.uses_egress_proxy() {
        // Made here, in the sandbox's network namespace, and served by the
        // proxy outside: the program reaches it at 127.0.0.1 and nothing else.
        let listener = sys::tcp_listener_v4_loopback(EGRESS_PORT)
            .map_err(|e| SetupError::io(Layer::Network, "egress listener", e))?;
        sys::send_fd(plan.fds.notify_send, listener.as_raw_fd())
            .map_err(|e| SetupError::io(Layer::Network, "handing over the egress listener", e))?;
    }
    // `C`: the run's cgroup is ready, and init is in it or enters it now
    // through the files that came along; `N`: no cgroup (degraded), so the
    // pids and memory limits fall back to RLIMIT_NPROC and RLIMIT_DATA.
    let (token, entry) = wait_token_with_fds(plan.fds.sync, b"CN")?;
    // The launcher says how many files it sent: a message whose descriptors
    // the kernel dropped must not pass for "nothing to enter".
    let mut count = [0u8; 1];
    match sys::read(plan.fds.sync, &mut count) {
        Ok(1) if usize::from(count[0]) == entry.len() => {}
        _ => {
            return Err(SetupError::new(
                Layer::Cgroup,
                format!(
                    "{} of the run's cgroup files arrived ({} sent)",
                    entry.len(),
                    count[0]
                ),
            ));
        }
    }
    cgroup::enter(&entry)
        .map_err(|e| SetupError::io(Layer::Cgroup, "entering the run's cgroup", e))?;
    drop(entry);
    if token == b'N' {
        exec.rlimits.extend(exec.floors);
    }
    // Now that init is in the run's cgroup, make it our root.
    // SAFETY: unshare with a flag constant only.
    if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } != 0 {
        return Err(SetupError::io(
            Layer::Namespaces,
            "cgroup namespace",
            std::io::Error::last_os_error(),
        ));
    }
    // The program gets the launcher's CPU set, not init's setup pinning.
    plan.placement.restore()?;
    Ok(exec)
}

/// Switches to the sandbox's own uid/gid inside the user namespace, which the
/// launcher mapped to an unprivileged host id. Capabilities within the new
/// namespace survive the switch: they are dropped later, in the payload.
fn become_sandbox_user(plan: &ChildPlan<'_>) -> Result<(), SetupError> {
    let fail =
        |what: &str| SetupError::io(Layer::UserMapping, what, std::io::Error::last_os_error());
    let (uid, gid) = (plan.inside_uid, plan.inside_gid);
    // SAFETY: plain id syscalls.
    if unsafe { libc::setresgid(gid, gid, gid) } != 0 {
        return Err(fail("setresgid"));
    }
    // SAFETY: an empty group list with a null pointer is valid.
    if plan.clear_groups && unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(fail("setgroups"));
    }
    // SAFETY: plain id syscall.
    if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
        return Err(fail("setresuid"));
    }
    Ok(())
}

static PAYLOAD_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(signal: libc::c_int) {
    let pid = PAYLOAD_PID.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, signal) };
    }
}

const FORWARDED: &[libc::c_int] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Starts the payload with [`sys::vfork_run`]: init sleeps until the payload
/// has exec'd (or failed), so the payload usually runs on init's CPU.
fn spawn_payload(exec: &ExecPlan, fds: &ChildFds) -> std::io::Result<libc::pid_t> {
    sys::vfork_run(&mut || payload_main(exec, fds))
}

fn init_run(plan: &ChildPlan<'_>, exec: ExecPlan) -> ! {
    // init keeps full capabilities in the sandbox's user namespace until the
    // program is started: make sure the program cannot reach into it through
    // /proc/1/mem and friends (non-dumpable needs CAP_SYS_PTRACE over the
    // host's user namespace to attach).
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        let e = SetupError::io(
            Layer::Privileges,
            "PR_SET_DUMPABLE",
            std::io::Error::last_os_error(),
        );
        send(plan.fds.status_write, &Message::Setup(e));
        exit(125);
    }
    let pid = match spawn_payload(&exec, &plan.fds) {
        Ok(pid) => pid,
        Err(e) => {
            let e = SetupError::io(Layer::Launcher, "starting the program", e);
            send(plan.fds.status_write, &Message::Setup(e));
            exit(125);
        }
    };
    PAYLOAD_PID.store(pid, Ordering::Relaxed);
    // From here init only reaps and forwards signals: it needs no capability,
    // and gives them all up while the program runs.
    if let Err(e) = confine::drop_privileges() {
        // SAFETY: kill of our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        send(plan.fds.status_write, &Message::Setup(e));
        exit(125);
    }
    for fd in [
        plan.fds.stdout_write,
        plan.fds.stderr_write,
        plan.fds.notify_send,
    ] {
        // SAFETY: init's copies; the payload holds its own.
        unsafe { libc::close(fd) };
    }
    // SAFETY: installing a plain, async-signal-safe handler and unblocking the
    // signals the launcher blocked before the clone.
    unsafe {
        for signal in FORWARDED {
            libc::signal(*signal, forward_signal as *const () as libc::sighandler_t);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
    loop {
        let mut status = 0;
        // SAFETY: status is a valid int to fill.
        let reaped = unsafe { libc::waitpid(-1, &mut status, 0) };
        if reaped < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            exit(125);
        }
        if reaped != pid {
            continue; // an orphan re-parented to us
        }
        let (message, code) = if libc::WIFEXITED(status) {
            let code = libc::WEXITSTATUS(status);
            (Message::Exited(code), code)
        } else if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            (Message::Signaled(signal), 128 + signal)
        } else {
            continue;
        };
        PAYLOAD_PID.store(0, Ordering::Relaxed);
        end_the_rest();
        // Nothing of the program runs any more: what it wrote under the
        // budget reaches its roots now.
        if let Some(budget) = &exec.budget {
            let merged = budget.merge();
            send(
                plan.fds.status_write,
                &Message::Stored {
                    written: merged.written,
                    full: merged.full,
                    failures: merged.failures.join("; "),
                },
            );
        }
        send(plan.fds.status_write, &message);
        // The launcher's cue to finish its bookkeeping while init exits.
        let _ = sys::write_all(plan.fds.sync, b"D");
        exit(code);
    }
}

/// Kills and reaps whatever the program left behind (daemons, orphans), so
/// that when init reports the program's end it is the last process of the
/// sandbox: the launcher then reads the cgroup's counters while init's own
/// exit (its memory and the mount namespace torn down, a few hundred µs)
/// completes. Every process of the pid namespace descends from init
/// (orphans are re-parented to it), so no child left means no process left.
/// Without this, init's exit would kill them all the same.
fn end_the_rest() {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid int to fill.
        let reaped = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if reaped > 0 || (reaped < 0 && sys::errno() == libc::EINTR) {
            continue;
        }
        if reaped < 0 {
            return; // ECHILD: init is alone
        }
        // SAFETY: from pid 1, kill(-1) signals every other process of its
        // namespace, which all run as the one uid mapped into the sandbox (init
        // has no CAP_KILL by now; none is needed); then one blocking wait, as
        // they die. If nothing could be signalled, init's own exit kills them.
        unsafe {
            if libc::kill(-1, libc::SIGKILL) != 0 {
                return;
            }
            libc::waitpid(-1, &mut status, 0);
        }
    }
}

fn payload_main(exec: &ExecPlan, fds: &ChildFds) -> ! {
    // The status pipe may have to move out of the way of passed descriptors.
    let mut status = fds.status_write;
    match confine_and_exec(exec, fds, &mut status) {
        Ok(errno) => {
            send(status, &Message::Exec(errno));
            exit(if errno == libc::ENOENT { 127 } else { 126 })
        }
        Err(e) => {
            send(status, &Message::Setup(e));
            exit(125)
        }
    }
}

/// Puts the passed descriptors at 3, 4, ... (open across exec), first
/// moving each out of the range they land in, and the status pipe above it
/// too (`status` follows it). Returns the first descriptor left to close at
/// exec. Allocates nothing: it runs between vfork and exec.
fn place_passed(fds: &ChildFds, status: &mut RawFd) -> Result<u32, SetupError> {
    let n = fds.pass_len.min(fds.pass.len());
    // At most MAX_PASSED_FDS: no overflow.
    let first_free = 3 + n as RawFd;
    if n == 0 {
        return Ok(3);
    }
    let fail = |what: &str| SetupError::io(Layer::Launcher, what, std::io::Error::last_os_error());
    let mut moved: [RawFd; crate::spec::MAX_PASSED_FDS] = [-1; crate::spec::MAX_PASSED_FDS];
    for (slot, fd) in moved.iter_mut().zip(&fds.pass[..n]) {
        // SAFETY: duplicating a descriptor this process holds, above the
        // range; the copy is close-on-exec (only its final place survives).
        let high = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, first_free) };
        if high < 0 {
            return Err(fail("moving a passed descriptor"));
        }
        *slot = high;
    }
    if (3..first_free).contains(status) {
        // SAFETY: as above, for the status pipe.
        let high = unsafe { libc::fcntl(*status, libc::F_DUPFD_CLOEXEC, first_free) };
        if high < 0 {
            return Err(fail("moving the status pipe"));
        }
        *status = high;
    }
    for (target, high) in (3..first_free).zip(moved) {
        // SAFETY: dup2 onto a number in 3..first_free: whatever it held was
        // moved above or is of no use to the program (closed at exec anyway);
        // dup2 leaves the new descriptor open across exec.
        if unsafe { libc::dup2(high, target) } < 0 {
            return Err(fail("placing a passed descriptor"));
        }
    }
    Ok(first_free.unsigned_abs())
}

/// Returns only if every candidate failed to exec, with the most telling errno.
fn confine_and_exec(
    exec: &ExecPlan,
    fds: &ChildFds,
    status_fd: &mut RawFd,
) -> Result<i32, SetupError> {
    let fail = |layer, what: &str| SetupError::io(layer, what, std::io::Error::last_os_error());
    // SAFETY: setsid/dup2 on descriptors we own; resetting SIGPIPE and the
    // mask is what a fresh program expects (the launcher ignores SIGPIPE and
    // blocks the forwarded signals).
    unsafe {
        if libc::setsid() < 0 {
            return Err(fail(Layer::Launcher, "setsid"));
        }
        if libc::dup2(fds.stdout_write, 1) < 0 || libc::dup2(fds.stderr_write, 2) < 0 {
            return Err(fail(Layer::Launcher, "dup2"));
        }
        // stdin is passed on only when it is a pipe or a file, which the program
        // can just read; anything else (a terminal, a socket) could be written
        // to or controlled, past the output cap: the program gets /dev/null.
        let mut st: libc::stat = std::mem::zeroed();
        let kind = if libc::fstat(0, &mut st) == 0 {
            st.st_mode & libc::S_IFMT
        } else {
            0
        };
        if let Some(fd) = fds.stdin_read {
            if libc::dup2(fd, 0) < 0 {
                return Err(fail(Layer::Launcher, "stdin from the spec's bytes"));
            }
        } else if exec.stdin_null || (kind != libc::S_IFIFO && kind != libc::S_IFREG) {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            if null < 0 || libc::dup2(null, 0) < 0 {
                return Err(fail(Layer::Launcher, "stdin from /dev/null"));
            }
            libc::close(null);
        }
        // The Rust runtime ignores SIGPIPE; handlers reset themselves at exec,
        // and other ignored signals are the caller's choice, kept as `env` keeps them.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
    confine::apply_rlimits(&exec.rlimits)?;
    confine::drop_privileges()?;
    // SAFETY: cwd is NUL-terminated.
    if unsafe { libc::chdir(exec.cwd.as_ptr()) } != 0 {
        return Err(fail(
            Layer::Filesystem,
            &format!("chdir {}", exec.cwd.to_string_lossy()),
        ));
    }
    let (status, detail) = confine::apply_landlock(&exec.landlock)?;
    send(fds.status_write, &Message::Landlock(status, detail));
    install_seccomp(exec, fds)?;
    let keep_below = place_passed(fds, status_fd)?;
    sys::cloexec_from(keep_below).map_err(|e| SetupError::io(Layer::Launcher, "close_range", e))?;

    let mut argv: Vec<*const libc::c_char> = exec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = exec.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let mut best = libc::ENOENT;
    for candidate in &exec.candidates {
        // SAFETY: argv and envp are null-terminated arrays of NUL-terminated
        // strings that outlive the call.
        unsafe { libc::execve(candidate.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        let errno = sys::errno();
        if errno != libc::ENOENT && errno != libc::ENOTDIR {
            best = errno;
        }
    }
    Ok(best)
}

fn install_seccomp(exec: &ExecPlan, fds: &ChildFds) -> Result<(), SetupError> {
    let notify = match seccomp::install(&exec.seccomp.notify, true) {
        Ok(Some(listener)) => {
            let sent = sys::send_fd(fds.notify_send, listener);
            // SAFETY: the listener is ours; the launcher now holds its own copy.
            unsafe { libc::close(listener) };
            sent.map_err(|e| SetupError::io(Layer::Seccomp, "handing the listener over", e))?;
            true
        }
        Ok(None) => false,
        Err(_) => {
            // No user notification here: enforce the same list with plain EPERM.
            seccomp::install(&exec.seccomp.errno, false)
                .map_err(|e| SetupError::io(Layer::Seccomp, "installing the filter", e))?;
            false
        }
    };
    // SAFETY: the launcher's copy of the socket end stays open; ours is done.
    unsafe { libc::close(fds.notify_send) };
    send(fds.status_write, &Message::Seccomp(notify));
    Ok(())
}
