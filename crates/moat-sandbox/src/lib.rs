//! Moat's Linux launcher: a [`SandboxSpec`] in, a supervised, confined child
//! out, and a [`moat_core::SandboxReport`] saying what was really enforced.
//!
//! Layers, in the order they are applied: user, mount, pid, net, ipc, uts and
//! cgroup namespaces; a tmpfs root with read-only system binds, declared roots
//! and `pivot_root`; a host uid/gid of the run's own (see [`hostid`]); cgroup limits; rlimits; every
//! capability dropped and `no_new_privs`; Landlock; seccomp. Each step fails
//! closed unless the spec allows degrading, and the report says which held.

mod budget;
mod cgroup;
mod child;
mod confine;
pub mod error;
mod evidence;
pub mod helper;
pub mod host;
pub mod hostid;
mod ingress;
pub mod inherited;
mod launch;
mod launch_policy;
pub mod microvm;
mod mounts;
mod netns;
mod placement;
pub mod process;
mod seccomp;
pub mod spec;
mod supervise;
mod sys;

pub use cgroup::{remove_run_cgroups, settle_in_own_cgroup};
pub use error::{Layer, SetupError, SpecError};
pub use evidence::switch_kernel_audit;
pub use launch::{
    EGRESS_PORT, EgressHook, RunOutcome, SANDBOX_PATH, hold_interrupts, run, run_with_egress,
};
pub use launch_policy::LaunchPolicy;
pub use spec::{BindMount, ExposedPort, MAX_EXPOSED_PORTS, MIN_EXPOSED_PORT, SandboxSpec};
pub use supervise::OutputMode;
