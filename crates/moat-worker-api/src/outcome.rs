use serde::{Deserialize, Serialize};

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum WorkerExit {
    /// `run` returned (or the guest called `exit`) with this status.
    Exited { code: u8 },
    /// The deadline passed; the guest was interrupted.
    TimedOut,
    /// A memory could not grow past the limit and the guest then failed.
    MemoryExceeded,
    /// The guest trapped (`unreachable`, a bad access, a host error).
    Trapped { message: String },
}

impl WorkerExit {
    /// The exit status `moat exec` reports, as the namespace class's are:
    /// the guest's own, 124 on timeout, 137 when memory ran out (the
    /// status an out-of-memory kill gives a process), 134 for a trap (an
    /// abort).
    pub fn status(&self) -> u8 {
        match self {
            WorkerExit::Exited { code } => *code,
            WorkerExit::TimedOut => 124,
            WorkerExit::MemoryExceeded => 137,
            WorkerExit::Trapped { .. } => 134,
        }
    }
}

/// Something the guest asked for and was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Denial {
    /// An open of a path (a worker has no filesystem).
    File { path: String },
    /// A socket bind or connect (a worker has no sockets).
    Socket { address: String, purpose: String },
}

/// The result of one invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub exit: WorkerExit,
    /// SHA-256 of the component's bytes.
    pub module_hash: String,
    /// Whether this invocation compiled the component (its first use on
    /// this host) rather than loading it precompiled.
    pub compiled: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub denials: Vec<Denial>,
    /// Every binding call, in order (at most 256; the rest counted).
    pub bindings: Vec<BindingUse>,
    #[serde(default)]
    pub bindings_dropped: u64,
    /// Largest total of linear memory the guest held.
    pub peak_memory_bytes: u64,
    /// Instantiation and run, without loading.
    pub duration_us: u64,
    /// The `kv` writes and `queue` sends it asked for. They travel apart
    /// from the outcome (`moat-worker --effects`): they may be far larger
    /// than a pipe's buffer.
    #[serde(skip)]
    pub effects: crate::Effects,
}

/// One binding call, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingUse {
    /// `inputs`, `outputs`, `http`.
    pub binding: String,
    /// `names`, `read`, `write`, `fetch`.
    pub call: String,
    /// The file's name; for `fetch`, the method and the URL without its
    /// query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub bytes: u64,
    /// `ok`, or the refusal: `not-granted`, `not-found`, `invalid-name`,
    /// `too-large`, `failed`.
    pub outcome: String,
}
