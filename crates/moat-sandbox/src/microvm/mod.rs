//! The `microvm` workload class: each program in a disposable virtual
//! machine of its own.
//!
//! The host side builds (and caches) the guest's init image, finds out
//! which accelerator boots a guest here, and starts QEMU's `microvm`
//! machine as the program of an ordinary `namespace` sandbox: the jail. An
//! escape from the guest lands in that sandbox, with no host uid 0, no
//! network but the egress proxy's loopback port, and only the VM's files.
//! The guest's init is `moat` itself (see [`guest`]).
//!
//! Files are shared over virtio-9p: QEMU serves them from inside the jail
//! with no helper process (virtiofs needs a `virtiofsd` daemon beside the
//! emulator, a block image needs copying in and out), and the declared
//! roots keep the jail's idmapped mounts and read-only flags.

mod accel;
mod cache;
pub(crate) mod config;
pub mod guest;
mod initramfs;
mod qemu;
pub mod relay;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use moat_core::event_data::SandboxExecStarted;
use moat_core::{
    Accelerator, Event, EventData, EventSink, EventType, ExitStatus, Limits, SandboxMode,
    SandboxReport, VmReport, WorkloadClass,
};

use self::config::{
    GuestConfig, GuestDenial, GuestRoot, PASSED_PORT_PREFIX, PassedPort, SystemEntry,
};
use crate::error::{Layer, SetupError, SpecError};
use crate::launch::{EgressHook, RunOutcome, refused_report};
use crate::spec::{BindMount, SandboxSpec};
use crate::supervise::OutputMode;

/// The smallest guest accepted: the kernel, the unpacked init image and a
/// program must fit.
pub const MIN_MEMORY: u64 = 128 << 20;
/// What the emulator needs beyond the guest's memory (its own code and
/// heap, the translation cache under TCG, the kernel it loads), in the
/// jail's memory limit. Where that limit falls back to RLIMIT_AS (no
/// cgroup), it bounds address space, of which QEMU maps much more than it
/// uses: thread stacks, libraries, reserved regions (measured here: about
/// 500 MiB beyond a 512 MiB guest).
const EMULATOR_OVERHEAD: u64 = 1 << 30;

/// Where the pieces of a guest come from.
#[derive(Debug, Clone, Default)]
pub struct VmOptions {
    /// The `moat` binary: the guest's init, and the relay of each proxied
    /// connection. Must be static (it runs with no library in the guest).
    pub moat: PathBuf,
    /// The guest kernel; default the newest `/boot/vmlinuz-*` with its
    /// modules under `/lib/modules`.
    pub kernel: Option<PathBuf>,
    /// The guest kernel's modules directory; default
    /// `/lib/modules/<version of the kernel's file name>`.
    pub modules: Option<PathBuf>,
    /// The emulator; default `qemu-system-x86_64` on `PATH`.
    pub qemu: Option<PathBuf>,
    /// Software emulation (TCG) may stand in for KVM, without degrading
    /// any other layer (a manifest's `allowEmulation`). `allow_degraded`
    /// on the spec allows it too.
    pub allow_emulation: bool,
}

/// Runs `spec` in a fresh virtual machine and waits for it: the
/// `microvm` counterpart of [`crate::run_with_egress`], with the same
/// report, events and exit codes.
pub fn run(
    mut spec: SandboxSpec,
    vm: &VmOptions,
    output: OutputMode,
    sink: &mut dyn EventSink,
    egress: Option<&mut dyn EgressHook>,
) -> Result<RunOutcome, SpecError> {
    spec.validate()?;
    check_supported(&spec)?;
    if spec.network.uses_egress_proxy() != egress.is_some() {
        return Err(SpecError::UnsupportedNetwork(spec.network));
    }
    let started = Instant::now();
    let run_id = spec.run_id.clone();
    let emit = |sink: &mut dyn EventSink, data: EventData| {
        sink.emit(Event::of(
            data,
            moat_core::time::now_stamp(),
            run_id.clone(),
        ))
    };
    emit(sink, EventData::SandboxExecStarted(started_data(&spec)));
    let (report, stdout, stderr) = match Prepared::new(&spec, vm) {
        Err(error) => {
            let mut report = refused_report(&spec, error, started);
            report.class = WorkloadClass::Microvm;
            (report, Vec::new(), Vec::new())
        }
        Ok(prepared) => {
            let jail = prepared.jail_spec(&spec);
            let mut jail_events = JailEvents { sink };
            let outcome = crate::launch::run_with_egress(jail, output, &mut jail_events, egress)?;
            let (report, denied) = prepared.report(&spec, outcome.report, started);
            for denial in denied {
                emit(
                    sink,
                    crate::launch::syscall_denied(&denial.syscall, denial.arch, denial.nr),
                );
            }
            (report, outcome.stdout, outcome.stderr)
        }
    };
    crate::launch::emit_ending(
        &mut |data| emit(sink, data),
        &report,
        spec.limits.timeout_ms,
        "virtual machine",
    );
    Ok(RunOutcome {
        report,
        stdout,
        stderr,
    })
}

/// What the class cannot give yet, refused before anything starts rather
/// than quietly given less.
fn check_supported(spec: &SandboxSpec) -> Result<(), SpecError> {
    let refuse = |what| Err(SpecError::NotInMicrovm(what));
    if spec.mode == SandboxMode::DangerFullAccess {
        return refuse("danger-full-access (the guest has no host root to write)");
    }
    if spec.root_view == moat_core::RootView::HostRo {
        return refuse("the host-ro root view (the guest sees /usr and /etc only)");
    }
    if spec.network == moat_core::NetworkMode::Full {
        return refuse("--network full (the guest reaches nothing but the egress proxy)");
    }
    if spec.network == moat_core::NetworkMode::IngressOnly {
        return refuse(
            "--network ingress-only (exposed ports are reached through the namespace \
             sandbox's network namespace; a guest has its own kernel's)",
        );
    }
    if spec.limits.max_write_bytes.is_some() {
        return refuse("a storage budget (max-write) yet");
    }
    // A descriptor stays on the host: QEMU relays a socket's bytes to a
    // port the guest hands the program; nothing else crosses.
    if spec.pass_fds.iter().any(|fd| {
        use std::os::fd::AsRawFd as _;
        !crate::sys::is_unix_stream(fd.as_raw_fd())
    }) {
        return refuse(
            "a passed descriptor other than a Unix stream socket (each reaches the guest as a \
             virtio-serial port QEMU relays from the socket)",
        );
    }
    if spec.stdin_data.is_some() {
        return refuse("bytes on stdin (the program's stdin is empty)");
    }
    // The guest's init keeps these for itself (and removes /sys and /root).
    const GUEST_RESERVED: &[&str] = &["/sys", "/run", "/root", "/init", "/modules"];
    if spec
        .mounts
        .iter()
        .any(|m| GUEST_RESERVED.iter().any(|r| m.inside.starts_with(r)))
    {
        return refuse("a root at /sys, /run, /root, /init or /modules (the guest's init's)");
    }
    if spec.mounts.iter().any(|m| !m.host.is_dir()) {
        return refuse("a file as a root (9p shares directories: declare its directory)");
    }
    if spec.limits.memory_bytes < MIN_MEMORY {
        return refuse("less than 128 MiB of memory (the guest kernel needs it)");
    }
    Ok(())
}

/// The namespace class's record of the start, naming this class.
fn started_data(spec: &SandboxSpec) -> SandboxExecStarted {
    SandboxExecStarted {
        class: WorkloadClass::Microvm,
        ..crate::launch::started_data(spec)
    }
}

/// The jail's events go through, but for its start, end and timeout: those
/// are the emulator's, and the run's own are emitted for the program.
struct JailEvents<'a> {
    sink: &'a mut dyn EventSink,
}

impl EventSink for JailEvents<'_> {
    fn emit(&mut self, event: Event) {
        match event.event_type {
            EventType::SandboxExecStarted
            | EventType::SandboxExecFinished
            | EventType::SandboxExecDenied
            | EventType::ProcessTimeout => {}
            _ => self.sink.emit(event),
        }
    }
}

/// The emulator, the guest kernel and the init image, found and cached.
struct GuestParts {
    cache: cache::Cache,
    qemu: String,
    kernel: cache::Cached,
    initramfs: cache::Cached,
}

impl GuestParts {
    fn find(vm: &VmOptions) -> Result<GuestParts, SetupError> {
        let fail = |what: String| SetupError::new(Layer::Microvm, what);
        let qemu = match &vm.qemu {
            Some(path) => path.clone(),
            None => find_on_path("qemu-system-x86_64").ok_or_else(|| {
                fail(
                    "qemu-system-x86_64 is not installed (Debian: apt-get install \
                     qemu-system-x86)"
                        .into(),
                )
            })?,
        };
        let kernel_path = match &vm.kernel {
            Some(path) => path.clone(),
            None => newest_kernel().ok_or_else(|| {
                fail(
                    "no guest kernel: none of /boot/vmlinuz-* has its modules under \
                     /lib/modules (Debian: apt-get install linux-image-amd64), and none was \
                     given"
                        .into(),
                )
            })?,
        };
        let modules = match &vm.modules {
            Some(dir) => dir.clone(),
            None => modules_dir_of(&kernel_path).ok_or_else(|| {
                fail(format!(
                    "{}: cannot tell the kernel's version from its file name \
                     (vmlinuz-VERSION): give its modules directory",
                    kernel_path.display()
                ))
            })?,
        };
        let cache = cache::Cache::open().map_err(|e| fail(format!("the VM cache: {e}")))?;
        let kernel = cache
            .kernel(&kernel_path)
            .map_err(|e| fail(format!("guest kernel: {e}")))?;
        let initramfs = cache
            .initramfs(&vm.moat, &modules)
            .map_err(|e| fail(format!("guest init image: {e}")))?;
        // Booted as is when it cannot be unpacked; its hash stays the
        // kernel's either way.
        let kernel = cache::Cached {
            path: cache.uncompressed(&kernel).unwrap_or(kernel.path),
            sha256: kernel.sha256,
        };
        Ok(GuestParts {
            cache,
            qemu: qemu.to_string_lossy().into_owned(),
            kernel,
            initramfs,
        })
    }
}

/// The accelerator guests would run under here, and why not KVM when it
/// is not: what a runner offering the class says of its host. Boots a probe
/// guest the first time (remembered in the cache, as for a run).
pub fn accelerator(
    vm: &VmOptions,
    id_range: Option<crate::hostid::IdRange>,
) -> Result<(Accelerator, Option<String>), SetupError> {
    let parts = GuestParts::find(vm)?;
    let mut spec = SandboxSpec::new(
        format!("vm-probe-{}", moat_core::random::hex(8)),
        vec!["/bin/true".into()],
    );
    spec.id_range = id_range;
    Ok(
        match accel::choose(
            &parts.cache,
            &spec,
            &vm.moat,
            &parts.qemu,
            &parts.kernel,
            &parts.initramfs,
        ) {
            accel::Choice::Kvm => (Accelerator::Kvm, None),
            accel::Choice::Tcg(reason) => (Accelerator::Tcg, Some(reason)),
        },
    )
}

/// Everything made ready before the emulator starts.
struct Prepared {
    qemu: String,
    kernel: cache::Cached,
    initramfs: cache::Cached,
    accelerator: Accelerator,
    degraded: Option<String>,
    state: cache::StateDir,
    kvm: Option<cache::KvmNode>,
    system: Vec<SystemEntry>,
    roots: Vec<GuestRoot>,
    memory_mib: u64,
    vcpus: u32,
    moat: PathBuf,
    /// The distinct sockets passed to the program, each with the
    /// descriptors it stands at there.
    passed: Vec<(Arc<OwnedFd>, Vec<i32>)>,
}

/// The distinct sockets among `spec.pass_fds` (the same one may stand at
/// several descriptors), in the order they first appear.
fn passed_sockets(spec: &SandboxSpec) -> Vec<(Arc<OwnedFd>, Vec<i32>)> {
    let mut sockets: Vec<(Arc<OwnedFd>, Vec<i32>)> = Vec::new();
    for (at, fd) in (3..).zip(&spec.pass_fds) {
        match sockets.iter_mut().find(|(s, _)| Arc::ptr_eq(s, fd)) {
            Some((_, fds)) => fds.push(at),
            None => sockets.push((fd.clone(), vec![at])),
        }
    }
    sockets
}

impl Prepared {
    fn new(spec: &SandboxSpec, vm: &VmOptions) -> Result<Prepared, SetupError> {
        let fail = |what: String| SetupError::new(Layer::Microvm, what);
        let GuestParts {
            cache,
            qemu,
            kernel,
            initramfs,
        } = GuestParts::find(vm)?;
        // The kernel unpacks the image while holding it: twice its size, and
        // room for the kernel and a program.
        let image_size = std::fs::metadata(&initramfs.path).map_or(0, |m| m.len());
        let needed = (2 * image_size + (160 << 20)).max(MIN_MEMORY);
        if spec.limits.memory_bytes < needed {
            return Err(fail(format!(
                "a guest with this init image ({} MiB) needs at least {} MiB of memory; \
                 give --memory {}M or more",
                image_size >> 20,
                needed.div_ceil(1 << 20),
                needed.div_ceil(1 << 20)
            )));
        }
        let (accelerator, degraded) =
            match accel::choose(&cache, spec, &vm.moat, &qemu, &kernel, &initramfs) {
                accel::Choice::Kvm => (Accelerator::Kvm, None),
                accel::Choice::Tcg(reason) if spec.allow_degraded || vm.allow_emulation => {
                    (Accelerator::Tcg, Some(reason))
                }
                accel::Choice::Tcg(reason) => {
                    return Err(fail(format!(
                        "hardware virtualization is not usable here ({reason}); \
                     --allow-degraded (or a manifest's allowEmulation) runs the guest under \
                     QEMU's software emulation (TCG), much slower"
                    )));
                }
            };
        let roots = spec
            .mounts
            .iter()
            .enumerate()
            .map(|(i, m)| GuestRoot {
                tag: format!("r{i}"),
                inside: m.inside.to_string_lossy().into_owned(),
                writable: spec.is_writable(m),
            })
            .collect();
        let owner = spec
            .mounts
            .iter()
            .find(|m| spec.is_writable(m))
            .and_then(|m| std::fs::metadata(&m.host).ok())
            .map(|meta| {
                use std::os::unix::fs::MetadataExt;
                (meta.uid(), meta.gid())
            });
        let state = cache
            .state_dir(&spec.run_id, owner)
            .map_err(|e| fail(format!("the run's state directory: {e}")))?;
        let kvm = match accelerator {
            Accelerator::Kvm => Some(
                cache
                    .kvm_node()
                    .map_err(|e| fail(format!("a KVM device node for the jail: {e}")))?,
            ),
            Accelerator::Tcg => None,
        };
        let memory_mib = spec.limits.memory_bytes >> 20;
        let vcpus = spec
            .limits
            .cpu_millis
            .map_or(1, |m| u32::try_from(m.div_ceil(1000)).unwrap_or(1).max(1));
        Ok(Prepared {
            qemu,
            kernel,
            initramfs,
            accelerator,
            degraded,
            state,
            kvm,
            system: system_entries(),
            roots,
            memory_mib,
            vcpus,
            moat: vm.moat.clone(),
            passed: passed_sockets(spec),
        })
        .and_then(|p| {
            p.write_config(spec)?;
            Ok(p)
        })
    }

    fn write_config(&self, spec: &SandboxSpec) -> Result<(), SetupError> {
        let config = GuestConfig {
            argv: spec.argv.clone(),
            env: crate::child::program_env(spec),
            cwd: spec.effective_cwd().to_string_lossy().into_owned(),
            system: self.system.clone(),
            roots: self.roots.clone(),
            proxy: spec.network.uses_egress_proxy(),
            timeout_ms: spec.limits.timeout_ms,
            tmp_size_bytes: spec.limits.tmp_size_bytes,
            open_files: spec.limits.open_files,
            pids: spec.limits.pids,
            file_size_bytes: spec.limits.file_size_bytes,
            passed: self
                .passed
                .iter()
                .enumerate()
                .map(|(k, (_, fds))| PassedPort {
                    port: format!("{PASSED_PORT_PREFIX}{k}"),
                    fds: fds.clone(),
                })
                .collect(),
        };
        self.state
            .write_config(&config)
            .map_err(|e| SetupError::new(Layer::Microvm, format!("the guest's configuration: {e}")))
    }

    fn machine(&self, proxy: bool) -> qemu::Machine<'_> {
        qemu::Machine {
            qemu: &self.qemu,
            accelerator: self.accelerator,
            memory_mib: self.memory_mib,
            vcpus: self.vcpus,
            system: &self.system,
            roots: &self.roots,
            proxy,
            passed: self.passed.len(),
            probe: false,
        }
    }

    /// The namespace sandbox QEMU runs in.
    fn jail_spec(&self, spec: &SandboxSpec) -> SandboxSpec {
        let proxy = spec.network.uses_egress_proxy();
        let mut jail = SandboxSpec::new(spec.run_id.clone(), self.machine(proxy).argv());
        jail.mode = SandboxMode::WorkspaceWrite;
        jail.network = spec.network;
        jail.allow_degraded = spec.allow_degraded;
        jail.without_cgroup = spec.without_cgroup;
        jail.id_range = spec.id_range;
        jail.launch_policy = spec.launch_policy.clone();
        jail.stdin_null = true;
        // At 3, 4, ...: QEMU's `-chardev socket,fd=N`.
        jail.pass_fds = self.passed.iter().map(|(fd, _)| fd.clone()).collect();
        jail.kvm = self.kvm.as_ref().map(|k| k.node.clone());
        jail.tcp_on_loopback = proxy;
        // The guest ends the program at its timeout; the jail's is the
        // backstop, with time to boot. Its CPU rlimit follows from it, and
        // QEMU burns a CPU-second per second per busy vCPU, plus its own.
        let backstop = spec
            .limits
            .timeout_ms
            .saturating_add(accel::boot_allowance_ms(self.accelerator))
            .saturating_mul(u64::from(self.vcpus) + 1)
            .min(crate::spec::MAX_TIMEOUT_MS);
        jail.limits = Limits {
            timeout_ms: backstop,
            memory_bytes: spec.limits.memory_bytes.saturating_add(EMULATOR_OVERHEAD),
            // QEMU's threads: main, RCU, one per vCPU, and a pool of up to
            // 64 workers (9p requests); one relay process per proxied
            // connection.
            pids: 128 + u64::from(self.vcpus) * 2 + if proxy { 64 } else { 0 },
            cpu_millis: spec.limits.cpu_millis,
            max_output_bytes: spec.limits.max_output_bytes,
            tmp_size_bytes: 1 << 20,
            // The guest holds the program to it; QEMU writes no bigger file.
            file_size_bytes: spec.limits.file_size_bytes,
            ..Limits::default()
        };
        // The declared roots first: the jail acts as the owner of the first
        // writable one, as the program will in the guest.
        for (i, mount) in spec.mounts.iter().enumerate() {
            jail.mounts.push(BindMount {
                host: mount.host.clone(),
                inside: Path::new(qemu::ROOTS).join(i.to_string()),
                writable: spec.is_writable(mount),
            });
        }
        let mut add = |host: &Path, inside: &str, writable: bool| {
            jail.mounts.push(BindMount {
                host: host.to_path_buf(),
                inside: PathBuf::from(inside),
                writable,
            })
        };
        add(self.state.path(), qemu::STATE, true);
        add(&self.kernel.path, qemu::KERNEL, false);
        add(&self.initramfs.path, qemu::INITRD, false);
        add(&self.moat, qemu::RELAY, false);
        jail
    }

    /// The run's report: the jail's (what confined the emulator), with the
    /// program's exit and the syscalls refused to it from the guest's
    /// status; and those refusals, for their events.
    fn report(
        &self,
        spec: &SandboxSpec,
        mut report: SandboxReport,
        started: Instant,
    ) -> (SandboxReport, Vec<GuestDenial>) {
        let mut denied = Vec::new();
        report.class = WorkloadClass::Microvm;
        report.run_id = spec.run_id.clone();
        let status = self.state.status();
        let mut vm = VmReport {
            accelerator: self.accelerator,
            degraded: self.degraded.clone(),
            memory_bytes: self.memory_mib << 20,
            vcpus: self.vcpus,
            kernel_sha256: self.kernel.sha256.clone(),
            initramfs_sha256: self.initramfs.sha256.clone(),
            guest_layers: Vec::new(),
            boot_ms: None,
        };
        let jail_ended_it = report.setup_error.is_some()
            || report.timed_out
            || report.interrupted
            || report.oom_killed;
        match status {
            Some(status) if !jail_ended_it && !plausible(&status) => {
                report.exit = ExitStatus::NotStarted;
                report.exit_code = 125;
                report.setup_error = Some(
                    "microvm: the guest reported an impossible status (an exit code or signal \
                     out of range): it is not trusted"
                        .into(),
                );
            }
            Some(status) if !jail_ended_it => {
                vm.guest_layers = status.layers;
                vm.boot_ms = status.boot_ms;
                for denial in &status.denied {
                    report.denied_syscalls.push(moat_core::SyscallDenial {
                        syscall: denial.syscall.clone(),
                        count: denial.count,
                    });
                    report.violations.push(moat_core::Violation {
                        layer: "seccomp".into(),
                        access: "syscall".into(),
                        object: Some(denial.syscall.clone()),
                        count: denial.count,
                    });
                }
                denied = status.denied;
                report.timed_out = status.timed_out;
                report.exit = status.exit;
                report.exit_code = exit_code(status.exit, status.timed_out);
                if let Some(error) = status.error {
                    report.setup_error =
                        Some(format!("microvm: guest init: {}", printable(&error)));
                }
            }
            Some(_) | None if jail_ended_it => {}
            _ => {
                let console = self.state.console_tail();
                let emulator = describe_exit(report.exit);
                report.exit = ExitStatus::NotStarted;
                report.exit_code = 125;
                report.setup_error = Some(format!(
                    "microvm: the virtual machine ended without the program's status (the \
                     emulator {emulator}); the guest console ended with: {console}"
                ));
            }
        }
        report.wall_ms = started.elapsed().as_millis() as u64;
        report.vm = Some(vm);
        (report, denied)
    }
}

/// Whether the guest's status could be true: its init is the program's
/// neighbour, and what it says is checked before it is believed.
fn plausible(status: &config::GuestStatus) -> bool {
    match status.exit {
        ExitStatus::Exited { code } => (0..=255).contains(&code),
        ExitStatus::Signaled { signal } => (1..=64).contains(&signal),
        ExitStatus::ExecFailed { errno } => (1..=4095).contains(&errno),
        ExitStatus::NotStarted => true,
    }
}

/// Guest-written text made safe to print: control characters (a terminal's
/// escape sequences) become `?`, and its length is bounded.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .take(4096)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn exit_code(exit: ExitStatus, timed_out: bool) -> i32 {
    if timed_out {
        return 124;
    }
    match exit {
        ExitStatus::Exited { code } => code,
        ExitStatus::Signaled { signal } => 128 + signal,
        ExitStatus::ExecFailed { errno } if errno == libc::ENOENT => 127,
        ExitStatus::ExecFailed { .. } => 126,
        ExitStatus::NotStarted => 125,
    }
}

fn describe_exit(exit: ExitStatus) -> String {
    match exit {
        ExitStatus::Exited { code } => format!("exited {code}"),
        ExitStatus::Signaled { signal } => format!("killed by signal {signal}"),
        ExitStatus::NotStarted => "never started".into(),
        ExitStatus::ExecFailed { errno } => format!("could not be executed (errno {errno})"),
    }
}

/// The guest's `/usr`, `/etc` and the merged-/usr links, as the jail has them.
fn system_entries() -> Vec<SystemEntry> {
    let mut entries = vec![
        SystemEntry::Share {
            name: "usr".into(),
            tag: "usr".into(),
        },
        SystemEntry::Share {
            name: "etc".into(),
            tag: "etc".into(),
        },
    ];
    for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let path = Path::new("/").join(name);
        match std::fs::read_link(&path) {
            Ok(target) => entries.push(SystemEntry::Link {
                name: name.into(),
                target: target.to_string_lossy().into_owned(),
            }),
            Err(_) if path.is_dir() => entries.push(SystemEntry::Share {
                name: name.into(),
                tag: name.into(),
            }),
            Err(_) => {}
        }
    }
    entries
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The newest `/boot/vmlinuz-VERSION` whose modules are installed.
fn newest_kernel() -> Option<PathBuf> {
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| modules_dir_of(p).is_some_and(|m| m.join("modules.dep").is_file()))
        .collect();
    kernels.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    kernels.pop()
}

fn modules_dir_of(kernel: &Path) -> Option<PathBuf> {
    let name = kernel.file_name()?.to_str()?;
    let version = name.strip_prefix("vmlinuz-")?;
    Some(Path::new("/lib/modules").join(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_passed_at_two_descriptors_is_one_port() {
        let (a, _) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let (b, _) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let (a, b) = (Arc::new(OwnedFd::from(a)), Arc::new(OwnedFd::from(b)));
        let mut spec = SandboxSpec::new("r", vec!["/bin/true".into()]);
        spec.pass_fds = vec![a.clone(), a.clone(), b.clone()];
        let sockets = passed_sockets(&spec);
        assert_eq!(sockets.len(), 2);
        assert!(Arc::ptr_eq(&sockets[0].0, &a) && Arc::ptr_eq(&sockets[1].0, &b));
        assert_eq!((&sockets[0].1, &sockets[1].1), (&vec![3, 4], &vec![5]));
        // A pipe is no socket: it cannot cross into a guest.
        let (read, _write) = std::io::pipe().expect("pipe");
        spec.pass_fds = vec![Arc::new(OwnedFd::from(read))];
        assert!(matches!(
            check_supported(&spec),
            Err(SpecError::NotInMicrovm(_))
        ));
        spec.pass_fds = vec![a];
        spec.limits.memory_bytes = MIN_MEMORY;
        assert!(check_supported(&spec).is_ok());
    }

    #[test]
    fn guest_text_loses_its_control_characters_and_is_bounded() {
        assert_eq!(printable("ok \x1b]0;pwned\x07 done"), "ok ?]0;pwned? done");
        assert_eq!(printable(&"x".repeat(10_000)).len(), 4096);
    }

    #[test]
    fn a_status_out_of_range_is_not_believed() {
        let status = |exit| config::GuestStatus {
            exit,
            timed_out: false,
            boot_ms: None,
            layers: Vec::new(),
            denied: Vec::new(),
            error: None,
        };
        assert!(plausible(&status(ExitStatus::Exited { code: 3 })));
        assert!(!plausible(&status(ExitStatus::Exited { code: 300 })));
        assert!(!plausible(&status(ExitStatus::Signaled {
            signal: i32::MAX
        })));
        assert!(plausible(&status(ExitStatus::Signaled { signal: 9 })));
    }
}
