//! What a runner's host can give, as it says at registration: the
//! workload classes it offers rest on these.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::report::Accelerator;

/// The host features behind a runner's workload classes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFeatures {
    /// `uname -r`.
    pub kernel: String,
    /// The Landlock ABI the kernel offers (0: none).
    pub landlock_abi: u32,
    /// `v2`, `v1` or `none`: the cgroup hierarchy per-run limits use.
    pub cgroup: String,
    /// A guest booted under KVM here (probed by booting one, not by
    /// finding `/dev/kvm`). `false` also when the microvm class was not
    /// asked for, and so not probed.
    pub hardware_virtualization: bool,
    /// The accelerator `microvm` guests run under, when the runner offers
    /// the class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
    /// Why hardware virtualization is not used, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulation_reason: Option<String>,
}
