//! Which accelerator boots a guest here. Found by booting one (a `/dev/kvm`
//! that opens is not proof: a nested paravirtual KVM creates VMs but never
//! boots a stock kernel), once per emulator, kernel, init image and host
//! kernel, and remembered in the cache.

use std::path::{Path, PathBuf};

use moat_core::{Accelerator, Event, Limits, NetworkMode};

use super::cache::{Cache, Cached};
use super::config::PROBE_MARKER;
use super::qemu::{self, Machine};
use crate::spec::{BindMount, SandboxSpec};
use crate::supervise::OutputMode;

/// How long a guest may take to reach its init under KVM before KVM is
/// judged unusable.
const PROBE_TIMEOUT_MS: u64 = 8_000;

pub(crate) enum Choice {
    Kvm,
    /// Software emulation, and why KVM is not used.
    Tcg(String),
}

/// Time the jail allows, beyond the program's timeout, for the guest to
/// boot and power off.
pub(crate) fn boot_allowance_ms(accelerator: Accelerator) -> u64 {
    match accelerator {
        Accelerator::Kvm => 30_000,
        Accelerator::Tcg => 120_000,
    }
}

pub(crate) fn choose(
    cache: &Cache,
    spec: &SandboxSpec,
    moat: &Path,
    qemu: &str,
    kernel: &Cached,
    initramfs: &Cached,
) -> Choice {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        return Choice::Tcg(format!("/dev/kvm: {e}"));
    }
    let node = match cache.kvm_node() {
        Ok(node) => node,
        Err(e) => return Choice::Tcg(format!("a KVM device node for the jail: {e}")),
    };
    let mut key = moat_core::hash::Sha256Stream::new();
    // Not the init image's hash: what the probe needs of it (print, reboot)
    // does not change with each build.
    for part in [qemu, &kernel.sha256, &host_release()] {
        key.update(part.as_bytes());
        key.update(b"\0");
    }
    let key = key.finish();
    if let Some(found) = cache.probe_result(&key) {
        return parse(&found);
    }
    let (choice, lasting) = probe(spec, qemu, kernel, initramfs, moat, &node.node);
    // Only what would be found again is kept: a boot, or a guest that
    // never booted; not a jail that could not be set up this time.
    if lasting {
        let text = match &choice {
            Choice::Kvm => "kvm".to_owned(),
            Choice::Tcg(reason) => format!("tcg {reason}"),
        };
        cache.keep_probe_result(&key, &text);
    }
    choice
}

fn parse(text: &str) -> Choice {
    match text.split_once(' ') {
        None if text.trim() == "kvm" => Choice::Kvm,
        Some(("tcg", reason)) => Choice::Tcg(reason.to_owned()),
        _ => Choice::Tcg("an unreadable earlier probe result".into()),
    }
}

fn host_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()
}

/// Boots the guest under KVM, in a jail like a run's, to an init that
/// prints a marker and powers off; says whether the answer is one to keep.
fn probe(
    spec: &SandboxSpec,
    qemu: &str,
    kernel: &Cached,
    initramfs: &Cached,
    moat: &Path,
    kvm: &Path,
) -> (Choice, bool) {
    let machine = Machine {
        qemu,
        accelerator: Accelerator::Kvm,
        memory_mib: 128,
        vcpus: 1,
        system: &[],
        roots: &[],
        proxy: false,
        passed: 0,
        probe: true,
    };
    let mut jail = SandboxSpec::new(
        format!("kvm-probe-{}", moat_core::random::hex(8)),
        machine.argv(),
    );
    jail.network = NetworkMode::Off;
    jail.allow_degraded = spec.allow_degraded;
    jail.without_cgroup = spec.without_cgroup;
    jail.id_range = spec.id_range;
    jail.stdin_null = true;
    jail.kvm = Some(kvm.to_path_buf());
    jail.limits = Limits {
        timeout_ms: PROBE_TIMEOUT_MS,
        memory_bytes: 512 << 20,
        pids: 64,
        max_output_bytes: 64 << 10,
        ..Limits::default()
    };
    for (path, inside) in [
        (kernel.path.as_path(), qemu::KERNEL),
        (initramfs.path.as_path(), qemu::INITRD),
        (moat, qemu::RELAY),
    ] {
        jail.mounts.push(BindMount {
            host: path.to_path_buf(),
            inside: PathBuf::from(inside),
            writable: false,
        });
    }
    let mut events: Vec<Event> = Vec::new();
    let outcome = match crate::launch::run(jail, OutputMode::Capture, &mut events) {
        Ok(outcome) => outcome,
        Err(e) => {
            return (
                Choice::Tcg(format!("the KVM probe could not start: {e}")),
                false,
            );
        }
    };
    let said = String::from_utf8_lossy(&outcome.stdout);
    if said.contains(PROBE_MARKER) {
        return (Choice::Kvm, true);
    }
    if let Some(error) = outcome.report.setup_error {
        return (Choice::Tcg(format!("the KVM probe's jail: {error}")), false);
    }
    if outcome.report.timed_out {
        let choice = Choice::Tcg(format!(
            "a guest did not boot under KVM within {} s (a nested or paravirtual KVM that \
             runs only special guest kernels?)",
            PROBE_TIMEOUT_MS / 1000
        ));
        return (choice, true);
    }
    let stderr = String::from_utf8_lossy(&outcome.stderr);
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    let choice = Choice::Tcg(format!(
        "QEMU with KVM exited {} without booting the guest{}",
        outcome.report.exit_code,
        last.map(|l| format!(": {}", super::printable(l.trim())))
            .unwrap_or_default()
    ));
    (choice, true)
}
