//! Errors of the launcher.

use std::fmt;
use std::path::PathBuf;

/// A layer of the sandbox; setup failures name the layer that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Launcher,
    /// The spec's roots, checked against the launch policy before anything is mounted.
    LaunchPolicy,
    Namespaces,
    UserMapping,
    Filesystem,
    /// The writable roots' storage budget (`limits.maxWriteBytes`).
    Storage,
    Network,
    Cgroup,
    Rlimits,
    Privileges,
    Landlock,
    Seccomp,
    Exec,
    /// The `microvm` class: emulator, guest kernel, init image, accelerator.
    Microvm,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Launcher => "launcher",
            Layer::LaunchPolicy => "launch_policy",
            Layer::Namespaces => "namespaces",
            Layer::UserMapping => "user mapping",
            Layer::Filesystem => "filesystem",
            Layer::Storage => "storage",
            Layer::Network => "network",
            Layer::Cgroup => "cgroup",
            Layer::Rlimits => "rlimits",
            Layer::Privileges => "privileges",
            Layer::Landlock => "landlock",
            Layer::Seccomp => "seccomp",
            Layer::Exec => "exec",
            Layer::Microvm => "microvm",
        }
    }

    /// Reverse of [`Layer::as_str`], for messages that crossed the child pipe.
    pub(crate) fn from_name(name: &str) -> Layer {
        [
            Layer::Launcher,
            Layer::LaunchPolicy,
            Layer::Namespaces,
            Layer::UserMapping,
            Layer::Filesystem,
            Layer::Storage,
            Layer::Network,
            Layer::Cgroup,
            Layer::Rlimits,
            Layer::Privileges,
            Layer::Landlock,
            Layer::Seccomp,
            Layer::Exec,
            Layer::Microvm,
        ]
        .into_iter()
        .find(|layer| layer.as_str() == name)
        .unwrap_or(Layer::Launcher)
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A spec the caller got wrong. Nothing was started.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("no program given")]
    EmptyArgv,
    #[error(
        "a storage budget (max-write) cannot bound danger-full-access: the host's root is \
         writable directly"
    )]
    BudgetInDangerMode,
    #[error("run id `{0}` must be 1-64 characters of [A-Za-z0-9._-], not starting with `.`")]
    BadRunId(String),
    #[error("argument {index} contains a NUL byte")]
    NulInArgument { index: usize },
    #[error("environment variable `{0}` has an invalid name or value")]
    BadEnv(String),
    #[error("{path}: {reason}")]
    BadHostPath { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    BadInsidePath { path: PathBuf, reason: String },
    #[error("{0} is mounted twice")]
    DuplicateMount(PathBuf),
    #[error("cwd {0} is not an absolute path")]
    BadCwd(PathBuf),
    #[error("limit {name} must be between {min} and {max}")]
    LimitOutOfRange {
        name: &'static str,
        min: u64,
        max: u64,
    },
    #[error(
        "network mode {0} goes through the egress proxy: start the sandbox with one (and only then)"
    )]
    UnsupportedNetwork(moat_core::NetworkMode),
    #[error("{0}")]
    BadExpose(String),
    #[error("stdin bytes: at most {max} (they must fit in a pipe)")]
    StdinTooLarge { max: usize },
    #[error("at most {max} descriptors passed to the program, none of them 0, 1 or 2")]
    TooManyPassedFds { max: usize },
    #[error("the microvm class does not support {0}")]
    NotInMicrovm(&'static str),
}

/// Why a run could not be set up. The run never reached the program.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{layer}: {message}")]
pub struct SetupError {
    pub layer: Layer,
    pub message: String,
}

impl SetupError {
    pub fn new(layer: Layer, message: impl Into<String>) -> Self {
        SetupError {
            layer,
            message: message.into(),
        }
    }

    pub(crate) fn io(layer: Layer, what: impl fmt::Display, err: std::io::Error) -> Self {
        SetupError::new(layer, format!("{what}: {err}"))
    }
}
