//! Resource limits applied to one sandboxed run.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Limits for one run. Cgroups enforce memory, pids and CPU share; rlimits are
/// the floor that always applies, cgroups or not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock limit; the whole process tree is killed when it passes.
    pub timeout_ms: u64,
    /// Memory ceiling for the whole tree (cgroup), in bytes.
    pub memory_bytes: u64,
    /// Most processes and threads alive at once (cgroup).
    pub pids: u64,
    /// CPU bandwidth in thousandths of a CPU (1500 = 1.5 CPUs); `None` = unlimited.
    pub cpu_millis: Option<u64>,
    /// Bytes of stdout and of stderr (each) kept; the stream is closed past it.
    pub max_output_bytes: u64,
    /// Size of the private `/tmp`.
    pub tmp_size_bytes: u64,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
    /// `RLIMIT_FSIZE`: largest file the program may write.
    pub file_size_bytes: u64,
    /// Bytes the program may write into its writable roots, all together
    /// (`None`: no budget). Past it, writes fail with `ENOSPC`; what was
    /// written reaches the roots when the program ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_write_bytes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: 30_000,
            memory_bytes: 512 << 20,
            pids: 256,
            cpu_millis: None,
            max_output_bytes: 1 << 20,
            tmp_size_bytes: 64 << 20,
            open_files: 1024,
            file_size_bytes: 4 << 30,
            max_write_bytes: None,
        }
    }
}

impl Limits {
    /// `RLIMIT_CPU` in seconds: the wall-clock limit, rounded up, plus one second, so
    /// a program that escapes the supervisor's clock still cannot spin forever.
    pub fn cpu_seconds_floor(&self) -> u64 {
        self.timeout_ms.div_ceil(1000).saturating_add(1)
    }
}
