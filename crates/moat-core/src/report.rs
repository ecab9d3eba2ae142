//! What a sandboxed run did, and what was really enforced while it did it.
//!
//! Modelled on the `landlock` crate's `RestrictionStatus`: every layer says
//! whether it was fully enforced, degraded, or not enforced, and why.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mode::{NetworkMode, RootView, SandboxMode, WorkloadClass};

/// How a sandboxed program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ExitStatus {
    /// The program called `exit` (or returned from `main`).
    Exited { code: i32 },
    /// The program was killed by a signal.
    Signaled { signal: i32 },
    /// The sandbox could not be set up; the program never ran.
    NotStarted,
    /// The program could not be executed (not found, not executable).
    ExecFailed { errno: i32 },
}

/// How far a protection layer was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LayerStatus {
    /// Applied as requested.
    Enforced,
    /// Applied in part; `detail` says what is missing. Only with `allowDegraded`.
    Degraded,
    /// Not applied. Only with `allowDegraded`, when the mode does not ask for
    /// it, or (`hostIdentity` alone) when the launcher is not root.
    NotEnforced,
}

/// One layer of the sandbox and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LayerReport {
    pub status: LayerStatus,
    pub detail: String,
}

impl LayerReport {
    pub fn enforced(detail: impl Into<String>) -> Self {
        LayerReport {
            status: LayerStatus::Enforced,
            detail: detail.into(),
        }
    }

    pub fn degraded(detail: impl Into<String>) -> Self {
        LayerReport {
            status: LayerStatus::Degraded,
            detail: detail.into(),
        }
    }

    pub fn not_enforced(detail: impl Into<String>) -> Self {
        LayerReport {
            status: LayerStatus::NotEnforced,
            detail: detail.into(),
        }
    }

    /// What a report recorded before a layer existed says of it.
    pub fn not_recorded() -> Self {
        LayerReport::not_enforced("not recorded (the report predates this layer)")
    }

    pub fn is_enforced(&self) -> bool {
        self.status == LayerStatus::Enforced
    }
}

/// What enforces one resource limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LimitMechanism {
    /// The run's cgroup: the whole process tree together.
    Cgroup,
    /// `RLIMIT_DATA` of each process on its own (heap and private writable
    /// mappings; not file-backed mappings or the stack), without a cgroup.
    RlimitData,
    /// `RLIMIT_NPROC` of the sandbox's user, without a cgroup.
    RlimitNproc,
    /// Nothing bounds it.
    None,
}

/// How one resource limit was applied: by the run's cgroup (`enforced`), by
/// a per-process rlimit floor in its place (`degraded`), or not at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitReport {
    pub status: LayerStatus,
    pub mechanism: LimitMechanism,
    /// The limit applied: bytes for memory, processes for pids.
    pub limit: u64,
    pub detail: String,
}

/// The enforcement actually applied, layer by layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Enforcement {
    pub mode: SandboxMode,
    pub network: NetworkMode,
    pub root_view: RootView,
    /// Host uid the sandboxed program runs as (never 0).
    pub host_uid: u32,
    /// Host gid the sandboxed program runs as.
    pub host_gid: u32,
    /// Whether `hostUid`/`hostGid` belong to this run alone: enforced when a
    /// root launcher held them from Moat's block for the whole run; not
    /// enforced when an unprivileged launcher's program kept its user's ids
    /// (shared with that user's other runs and processes).
    pub host_identity: LayerReport,
    /// The declared roots checked against the launch policy (no system,
    /// credential or container-runtime path; no socket, FIFO or device
    /// inside). `not_enforced` when the operator overrode it: an escalation.
    /// Reports recorded before the policy existed have none.
    #[serde(default = "LayerReport::not_recorded")]
    pub launch_policy: LayerReport,
    /// user, mount, pid, net, ipc, uts and cgroup namespaces.
    pub namespaces: LayerReport,
    /// tmpfs root, read-only system binds, declared roots, fresh /proc, minimal /dev.
    pub filesystem: LayerReport,
    /// Landlock filesystem rules and scoping.
    pub landlock: LayerReport,
    /// Landlock ABI the kernel offered (0 = none).
    pub landlock_abi: u32,
    /// seccomp-bpf deny list.
    pub seccomp: LayerReport,
    /// Blocked-access evidence: whether the launcher could observe the
    /// refusals of the layers (Landlock's through the kernel audit log,
    /// seccomp's through user notification). `not_enforced` means
    /// `violations` may miss some, never that nothing was refused.
    #[serde(default = "LayerReport::not_recorded")]
    pub evidence: LayerReport,
    /// Capabilities dropped and `no_new_privs` set.
    pub privileges: LayerReport,
    /// The writable roots' storage budget (`limits.maxWriteBytes`).
    #[serde(default = "LayerReport::not_recorded")]
    pub storage: LayerReport,
    /// Cgroup limits (memory, pids, CPU).
    pub cgroup: LayerReport,
    /// rlimits (NOFILE, FSIZE, CORE, CPU).
    pub rlimits: LayerReport,
    /// What bounded the run's memory: its cgroup, else the `RLIMIT_DATA` floor.
    pub memory: LimitReport,
    /// What bounded the run's processes: its cgroup, else `RLIMIT_NPROC`.
    pub pids: LimitReport,
}

/// A syscall that the seccomp layer refused, and how often.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyscallDenial {
    pub syscall: String,
    pub count: u64,
}

/// One kind of access a layer refused inside the sandbox, as the launcher
/// observed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    /// `landlock` or `seccomp`.
    pub layer: String,
    /// What was attempted: Landlock's blocker (`fs.read_file`,
    /// `fs.write_file`, `net.connect_tcp`, `scope.signal`, ...) or `syscall`.
    pub access: String,
    /// What it was attempted on: a path, a port, a syscall's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// How often (records the kernel dropped under load are not counted).
    pub count: u64,
}

impl Violation {
    /// One line for people: `tried to open /root/.aws/credentials: denied
    /// (landlock fs.read_file)`.
    pub fn describe(&self) -> String {
        let attempt = match (self.access.as_str(), self.object.as_deref()) {
            ("syscall", Some(name)) => format!("called {name}"),
            (access, Some(object)) if access.starts_with("fs.read") => {
                format!("tried to read {object}")
            }
            ("fs.execute", Some(object)) => format!("tried to execute {object}"),
            ("fs.open", Some(object)) => format!("tried to open {object}"),
            ("net.resolve", Some(object)) => format!("tried to resolve {object}"),
            ("net.socket", Some(object)) => format!("tried to {object}"),
            (access, Some(object)) if access.starts_with("fs.") => {
                format!("tried to change {object}")
            }
            ("net.connect_tcp", Some(object)) => format!("tried to connect to {object}"),
            ("net.bind_tcp", Some(object)) => format!("tried to bind {object}"),
            (access, Some(object)) if access.starts_with("scope.") => {
                format!("tried to reach {object} outside the sandbox")
            }
            (_, Some(object)) => format!("tried {object}"),
            (access, None) => format!("tried {access}"),
        };
        let times = if self.count > 1 {
            format!(", {} times", self.count)
        } else {
            String::new()
        };
        format!("{attempt}: denied ({} {}){times}", self.layer, self.access)
    }
}

/// What one output stream produced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutputReport {
    /// Bytes kept (at most the cap).
    pub bytes: u64,
    /// The program wrote more than the cap; the stream was closed.
    pub truncated: bool,
}

/// The report of one sandboxed run. Written whether the program exits, is
/// killed, times out, or the launcher is interrupted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxReport {
    pub run_id: String,
    pub exit: ExitStatus,
    /// Exit status the `moat exec` command returns for this run.
    pub exit_code: i32,
    pub wall_ms: u64,
    /// User + system CPU time of the whole tree.
    pub cpu_ms: u64,
    /// Peak memory of the whole tree (cgroup), or of the largest process when
    /// cgroups were not available.
    pub peak_memory_bytes: u64,
    pub timed_out: bool,
    pub oom_killed: bool,
    /// A fork or clone was refused because the pids limit was reached.
    pub pids_limit_hit: bool,
    /// Most processes and threads of the tree alive at once (the run's
    /// cgroup's `pids.peak`; absent without a cgroup or where the kernel
    /// does not keep it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_pids: Option<u64>,
    /// The launcher was interrupted (SIGINT/SIGTERM/SIGHUP) and stopped the run.
    pub interrupted: bool,
    pub stdout: OutputReport,
    pub stderr: OutputReport,
    /// Syscalls the seccomp layer refused while the program ran.
    pub denied_syscalls: Vec<SyscallDenial>,
    /// Every refusal observed while the program ran, all layers (see
    /// `enforcement.evidence` for what could be observed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<Violation>,
    /// Bytes the program wrote into its writable roots, when they had a
    /// storage budget (rounded up to pages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_written: Option<u64>,
    /// The storage budget was used up: writes past it got `ENOSPC`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub write_budget_reached: bool,
    /// Peak resident memory of the launcher itself, in KiB.
    pub launcher_peak_rss_kib: u64,
    /// Why the sandbox could not be set up, naming the layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_error: Option<String>,
    /// The workload class the program ran under (absent: `namespace`).
    #[serde(default, skip_serializing_if = "WorkloadClass::is_namespace")]
    pub class: WorkloadClass,
    /// For the `microvm` class: the virtual machine the program ran in.
    /// `enforcement` is then what confined the emulator (the jailer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<VmReport>,
    /// For the `worker` class: the component and what bounded it.
    /// `enforcement` is then what confined the wasmtime process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerReport>,
    pub enforcement: Enforcement,
}

/// The WebAssembly component of a `worker` run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerReport {
    /// SHA-256 of the component's bytes.
    pub module_sha256: String,
    /// This run compiled it (no precompiled copy was at hand).
    pub compiled: bool,
    /// How the guest ended: `exited`, `timedOut`, `memoryExceeded` or
    /// `trapped`.
    pub ended: String,
    /// Why it trapped, when it did (the first lines of wasmtime's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trap: Option<String>,
    /// The guest's deadline and its linear-memory limit.
    pub timeout_ms: u64,
    pub memory_limit_bytes: u64,
    /// Most linear memory the guest held.
    pub peak_memory_bytes: u64,
    /// Microseconds from instantiation to the end of `run`.
    pub invocation_us: u64,
    /// What the guest has: `streams, clocks, random`; denied opens and
    /// sockets are in `violations`.
    pub granted: Vec<String>,
}

/// How a hardware-virtualized or emulated guest was run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Accelerator {
    /// The host's hardware virtualization (KVM).
    #[serde(rename = "kvm")]
    Kvm,
    /// QEMU's software emulation: slower, and allowed only when degrading
    /// was (KVM was not usable).
    #[serde(rename = "tcg")]
    Tcg,
}

impl Accelerator {
    pub fn as_str(self) -> &'static str {
        match self {
            Accelerator::Kvm => "kvm",
            Accelerator::Tcg => "tcg",
        }
    }
}

/// The virtual machine of a `microvm` run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmReport {
    pub accelerator: Accelerator,
    /// Why hardware virtualization was not used, when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    /// The guest's memory (the VM's size).
    pub memory_bytes: u64,
    pub vcpus: u32,
    /// SHA-256 of the guest kernel image and of the init image Moat built.
    pub kernel_sha256: String,
    pub initramfs_sha256: String,
    /// What the guest's init applied to the program, layer by layer.
    pub guest_layers: Vec<String>,
    /// Milliseconds from the emulator's start to the program's start, as
    /// the guest measured them (absent when the program never started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_ms: Option<u64>,
}
