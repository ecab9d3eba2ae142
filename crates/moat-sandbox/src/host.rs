//! What this host can give a sandbox, as a runner tells its control plane.

use moat_core::host::HostFeatures;

/// The kernel, its Landlock ABI and the cgroup hierarchy per-run limits
/// would use. Hardware virtualization is left `false`: only booting a
/// guest tells ([`crate::microvm::accelerator`]).
pub fn host_features() -> HostFeatures {
    let cgroup = if crate::cgroup::made_before_clone() {
        "v2"
    } else if std::path::Path::new("/sys/fs/cgroup/memory").is_dir() {
        // A hybrid host: v1 controllers (the unified tree has none).
        "v1"
    } else {
        "none"
    };
    HostFeatures {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|r| r.trim().to_owned())
            .unwrap_or_default(),
        landlock_abi: crate::confine::kernel_abi(),
        cgroup: cgroup.to_owned(),
        hardware_virtualization: false,
        accelerator: None,
        emulation_reason: None,
    }
}
