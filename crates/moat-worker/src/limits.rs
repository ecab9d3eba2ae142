use std::time::Duration;

/// What one invocation may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLimits {
    /// Wall-clock deadline of the invocation, enforced by epoch
    /// interruption: the guest traps at the next tick past it.
    pub timeout: Duration,
    /// Bytes of linear memory the guest's memories may hold, all together.
    pub memory_bytes: u64,
    /// Bytes of stdout and of stderr kept (each); past it the stream is
    /// closed, as the namespace class closes a program's.
    pub max_output_bytes: u64,
}

impl Default for WorkerLimits {
    fn default() -> Self {
        WorkerLimits {
            timeout: Duration::from_secs(30),
            memory_bytes: 256 << 20,
            max_output_bytes: 1 << 20,
        }
    }
}
