//! What the host tells the guest's init, and what the init answers.
//!
//! The configuration travels as a file in a read-only 9p share that the
//! init unmounts before the program starts; the status comes back on a
//! virtio-serial port that only the init holds open.

use moat_core::ExitStatus;
use serde::{Deserialize, Serialize};

/// The 9p tag of the share holding [`CONFIG_FILE`].
pub(crate) const CONFIG_TAG: &str = "moat";
pub(crate) const CONFIG_FILE: &str = "config.json";
/// Names of the virtio-serial ports, as the guest sees them in
/// `/sys/class/virtio-ports/*/name`.
pub(crate) const STDOUT_PORT: &str = "moat.stdout";
pub(crate) const STDERR_PORT: &str = "moat.stderr";
pub(crate) const STATUS_PORT: &str = "moat.status";
/// The prefix of the ports that stand for descriptors passed to the
/// program: `moat.fd.0`, `moat.fd.1`, ...
pub(crate) const PASSED_PORT_PREFIX: &str = "moat.fd.";
/// The guest address where QEMU's user network hands connections to the
/// egress proxy (each one through `moat vm-relay` in the jail).
pub(crate) const PROXY_GUEST_ADDR: [u8; 4] = [10, 0, 2, 100];
pub(crate) const GUEST_ADDR: [u8; 4] = [10, 0, 2, 15];
/// What the init prints on the serial console when it was started only to
/// prove that the accelerator boots a guest.
pub(crate) const PROBE_MARKER: &str = "moat-vm-probe-ok";

/// One directory of the guest's root.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) enum SystemEntry {
    /// `/name` is a symbolic link to `target` (merged-/usr systems).
    Link { name: String, target: String },
    /// `/name` is the read-only 9p share `tag`.
    Share { name: String, tag: String },
}

/// A declared root, shared over 9p.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GuestRoot {
    pub(crate) tag: String,
    pub(crate) inside: String,
    pub(crate) writable: bool,
}

/// A socket the host passed to the program, reaching the guest as a
/// virtio-serial port: the init opens `port` and gives it to the program
/// at each of `fds` (one socket may stand at several, as a DevTools pipe's
/// reading 3 and writing 4 do).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PassedPort {
    pub(crate) port: String,
    pub(crate) fds: Vec<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GuestConfig {
    pub(crate) argv: Vec<String>,
    /// The whole environment of the program (already scrubbed by the host).
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cwd: String,
    pub(crate) system: Vec<SystemEntry>,
    pub(crate) roots: Vec<GuestRoot>,
    /// Whether the egress proxy is reachable (proxy network modes): the init
    /// then brings up the NIC and relays `127.0.0.1:3128` to it.
    pub(crate) proxy: bool,
    pub(crate) timeout_ms: u64,
    pub(crate) tmp_size_bytes: u64,
    pub(crate) open_files: u64,
    pub(crate) pids: u64,
    pub(crate) file_size_bytes: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) passed: Vec<PassedPort>,
}

/// A syscall the guest's seccomp layer refused, as the init observed it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GuestDenial {
    pub(crate) syscall: String,
    pub(crate) arch: u32,
    pub(crate) nr: i32,
    pub(crate) count: u64,
}

/// What the init reports once the program has ended (or could not start).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GuestStatus {
    pub(crate) exit: ExitStatus,
    pub(crate) timed_out: bool,
    /// Milliseconds of guest uptime when the program started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) boot_ms: Option<u64>,
    pub(crate) layers: Vec<String>,
    /// Syscalls refused inside, once per name with a count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) denied: Vec<GuestDenial>,
    /// Why the program could not be started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}
