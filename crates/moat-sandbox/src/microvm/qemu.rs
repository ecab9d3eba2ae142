//! QEMU's command line for one guest: a `microvm` machine with no firmware
//! to speak of, no default devices, virtio-mmio only.

use moat_core::Accelerator;

use super::config::{
    CONFIG_TAG, GuestRoot, PASSED_PORT_PREFIX, PROXY_GUEST_ADDR, STATUS_PORT, STDERR_PORT,
    STDOUT_PORT, SystemEntry,
};

/// Where the jail mounts what the emulator uses.
pub(crate) const KERNEL: &str = "/vm/kernel";
pub(crate) const INITRD: &str = "/vm/initrd";
pub(crate) const STATE: &str = "/vm/state";
/// `moat` itself: `vm-qemu` starts QEMU, `vm-relay` each proxied connection.
pub(crate) const RELAY: &str = "/vm/moat";
pub(crate) const ROOTS: &str = "/vm/root";

/// The machine to start.
pub(crate) struct Machine<'a> {
    pub(crate) qemu: &'a str,
    pub(crate) accelerator: Accelerator,
    pub(crate) memory_mib: u64,
    pub(crate) vcpus: u32,
    pub(crate) system: &'a [SystemEntry],
    pub(crate) roots: &'a [GuestRoot],
    pub(crate) proxy: bool,
    /// How many sockets the jail passes QEMU (at 3, 4, ...), each relayed
    /// to the guest as the port `moat.fd.N`.
    pub(crate) passed: usize,
    /// Only proves that the accelerator boots a guest: no devices.
    pub(crate) probe: bool,
}

/// The host's TSC frequency as its kernel reports it (`cpu MHz`).
fn host_tsc_khz() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("cpu MHz"))?;
    let mhz: f64 = line.split(':').nth(1)?.trim().parse().ok()?;
    (mhz > 0.0).then(|| (mhz * 1000.0).round() as u64)
}

impl Machine<'_> {
    /// The jail's command line: `moat vm-qemu` (see
    /// [`super::relay::exec_qemu`]), then QEMU's.
    pub(crate) fn argv(&self) -> Vec<String> {
        let mut argv: Vec<String> = vec![RELAY.into(), "vm-qemu".into(), self.qemu.into()];
        let mut push = |items: &[&str]| argv.extend(items.iter().map(|s| (*s).to_owned()));
        // ISA serial for the kernel's console (what a failed boot said);
        // no RTC, no option ROMs.
        push(&["-M", "microvm,x-option-roms=off,rtc=off,isa-serial=on"]);
        match self.accelerator {
            // The host's CPU model; architectural capabilities hidden, as
            // KVM nested under another hypervisor aborts on reading them.
            Accelerator::Kvm => push(&["-accel", "kvm", "-cpu", "host,-arch-capabilities"]),
            // A bounded translation cache: QEMU's default reserves 1 GiB.
            Accelerator::Tcg => push(&["-accel", "tcg,tb-size=64", "-cpu", "max"]),
        }
        let memory = format!("{}M", self.memory_mib);
        let smp = self.vcpus.to_string();
        push(&["-m", &memory, "-smp", &smp]);
        push(&[
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-monitor",
            "none",
            "-no-reboot",
        ]);
        // QEMU's own seccomp filter, under the jail's: no obsolete calls, no
        // privilege changes, no scheduler or resource tweaks; spawning only
        // for the relay of each proxied connection, whose start (libslirp
        // calls setsid, which the privilege rule kills) leaves privilege
        // changes to the jail: one mapped uid, no capability,
        // no_new_privs, nothing to gain.
        let (spawn, elevate) = if self.proxy {
            ("allow", "allow")
        } else {
            ("deny", "deny")
        };
        let sandbox = format!(
            "on,obsolete=deny,elevateprivileges={elevate},spawn={spawn},resourcecontrol=deny"
        );
        push(&["-sandbox", &sandbox]);
        push(&["-kernel", KERNEL, "-initrd", INITRD]);
        let mut append =
            String::from("console=ttyS0 panic=-1 reboot=t quiet rdinit=/init moat_guest=1");
        if let (Accelerator::Tcg, Some(khz)) = (self.accelerator, host_tsc_khz()) {
            // Under emulation the guest's TSC is the host's, and measuring it
            // against the emulated PIT fails when the host is busy: the
            // kernel then has no clock to calibrate with and hangs. Tell it.
            append.push_str(&format!(" tsc_early_khz={khz}"));
        }
        if self.probe {
            append.push_str(" moat_probe=1");
            push(&["-append", &append, "-serial", "stdio"]);
            return argv;
        }
        push(&["-append", &append]);
        let console = format!("file:{STATE}/console");
        push(&["-serial", &console]);
        push(&["-device", "virtio-serial-device"]);
        // QEMU's stdout and stderr, copied by `moat vm-qemu`.
        for (fd, set) in [(super::relay::STDOUT_FD, 1), (super::relay::STDERR_FD, 2)] {
            let add = format!("fd={fd},set={set}");
            push(&["-add-fd", &add]);
        }
        // The program's stdout and stderr are QEMU's (the jail caps and
        // forwards them); the status a file the host reads.
        let ports = [
            (
                "out",
                "file,path=/dev/fdset/1,append=on".to_owned(),
                STDOUT_PORT,
            ),
            // Appending: QEMU refuses to truncate a descriptor set.
            (
                "err",
                "file,path=/dev/fdset/2,append=on".to_owned(),
                STDERR_PORT,
            ),
            ("status", format!("file,path={STATE}/status"), STATUS_PORT),
        ];
        for (id, backend, name) in ports {
            let chardev = format!("{backend},id={id}");
            let device = format!("virtserialport,chardev={id},name={name}");
            push(&["-chardev", &chardev, "-device", &device]);
        }
        // A socket the caller passed to the program stays on the host: QEMU
        // relays its bytes to a port the guest's init hands the program.
        for k in 0..self.passed {
            let chardev = format!("socket,id=pass{k},fd={}", 3 + k);
            let device = format!("virtserialport,chardev=pass{k},name={PASSED_PORT_PREFIX}{k}");
            push(&["-chardev", &chardev, "-device", &device]);
        }
        let mut share = |tag: &str, path: &str, writable: bool| {
            let ro = if writable { "" } else { ",readonly=on" };
            let fsdev = format!("local,id={tag},path={path},security_model=none{ro}");
            let device = format!("virtio-9p-device,fsdev={tag},mount_tag={tag}");
            push(&["-fsdev", &fsdev, "-device", &device]);
        };
        share(CONFIG_TAG, STATE, false);
        for entry in self.system {
            if let SystemEntry::Share { name, tag } = entry {
                share(tag, &format!("/{name}"), false);
            }
        }
        for (i, root) in self.roots.iter().enumerate() {
            share(&root.tag, &format!("{ROOTS}/{i}"), root.writable);
        }
        if self.proxy {
            // The user-mode network isolated from host and outside
            // (`restrict=on`): its only way anywhere is the forward of the
            // proxy's address, each connection relayed to the egress proxy
            // listening on the jail's loopback.
            let [a, b, c, d] = PROXY_GUEST_ADDR;
            let netdev = format!(
                "user,id=net0,restrict=on,ipv6=off,guestfwd=tcp:{a}.{b}.{c}.{d}:{port}-cmd:{RELAY} vm-relay {port}",
                port = crate::EGRESS_PORT
            );
            push(&[
                "-netdev",
                &netdev,
                "-device",
                "virtio-net-device,netdev=net0",
            ]);
        }
        argv
    }
}
