//! The guest's init: `moat` as PID 1 of a `microvm` guest.
//!
//! It mounts what the host shared, loads the few modules it needs, starts
//! the program with the in-guest layers that make sense (a scrubbed
//! environment, the owner of its writable root as its uid and no
//! capability, `no_new_privs`, rlimits, the seccomp deny list, no `/sys`,
//! a read-only `/proc/sys`, a `/dev` of five nodes), waits for it within
//! its timeout, reports its status on a port only the init holds, and
//! ends the machine.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use moat_core::ExitStatus;

use super::config::{
    CONFIG_FILE, CONFIG_TAG, GUEST_ADDR, GuestConfig, GuestDenial, GuestStatus, PROBE_MARKER,
    PROXY_GUEST_ADDR, STATUS_PORT, STDERR_PORT, STDOUT_PORT, SystemEntry,
};
use super::initramfs::{MODULE_DIR, MODULE_ORDER};
use crate::sys::cvt;

/// Whether this process is the init of a guest Moat started: PID 1 with
/// the kernel parameter the host always passes.
pub fn is_guest_init() -> bool {
    std::process::id() == 1 && std::env::var_os("moat_guest").is_some_and(|v| v == "1")
}

/// Runs the guest and ends the machine. Never returns.
pub fn main() -> ! {
    let mut status_port: Option<File> = None;
    let status = match boot(&mut status_port) {
        Ok(Some(status)) => Some(status),
        Ok(None) => None,
        Err(error) => {
            // The console is the emulator's log, quoted by the host when no
            // status arrives.
            eprintln!("moat guest init: {error}");
            Some(GuestStatus {
                exit: ExitStatus::NotStarted,
                timed_out: false,
                boot_ms: None,
                layers: Vec::new(),
                denied: Vec::new(),
                error: Some(error),
            })
        }
    };
    if let (Some(port), Some(status)) = (status_port.as_mut(), status)
        && let Ok(mut line) = serde_json::to_vec(&status)
    {
        line.push(b'\n');
        // A virtio console write returns once the host has taken the bytes.
        let _ = port.write_all(&line);
    }
    // SAFETY: plain calls; `sync` flushes what the guest still holds.
    unsafe {
        libc::sync();
        // With `-no-reboot` a reboot ends QEMU at once, whatever the
        // machine's power-off support.
        libc::reboot(libc::RB_AUTOBOOT);
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn c(text: &str) -> Result<CString, String> {
    CString::new(text).map_err(|_| format!("{text:?} holds a NUL byte"))
}

fn mount(source: &str, target: &str, fstype: &str, flags: u64, data: &str) -> Result<(), String> {
    let (s, t, f, d) = (c(source)?, c(target)?, c(fstype)?, c(data)?);
    crate::sys::mount(&s, &t, &f, flags as libc::c_ulong, Some(&d))
        .map_err(|e| format!("mounting {fstype} {source} on {target}: {e}"))
}

fn boot(status_port: &mut Option<File>) -> Result<Option<GuestStatus>, String> {
    let nodev = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount("proc", "/proc", "proc", nodev, "")?;
    mount("sysfs", "/sys", "sysfs", nodev, "")?;
    mount(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "mode=0755",
    )?;
    trace("mounted /proc, /sys, /dev");
    load_modules()?;
    trace("modules loaded");
    if std::env::var_os("moat_probe").is_some_and(|v| v == "1") {
        println!("{PROBE_MARKER}");
        return Ok(None);
    }
    let ports = find_ports(&[STDOUT_PORT, STDERR_PORT, STATUS_PORT])?;
    let open_port = |name: &str| {
        let path = &ports[name];
        fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    let status = open_port(STATUS_PORT)?;
    let stdout = open_port(STDOUT_PORT)?;
    let stderr = open_port(STDERR_PORT)?;
    for (name, port) in [
        (STATUS_PORT, &status),
        (STDOUT_PORT, &stdout),
        (STDERR_PORT, &stderr),
    ] {
        wait_host_connected(name, port)?;
    }
    *status_port = Some(status);
    trace("ports open");
    let config = read_config()?;
    let passed = open_passed(&config)?;
    build_root(&config)?;
    trace("root built");
    let mut layers = Vec::new();
    network(&config, &mut layers)?;
    harden_view(&mut layers)?;
    trace("starting the program");
    let status = run_program(&config, stdout, stderr, &passed, layers).map(Some);
    trace("the program ended");
    status
}

/// A line on the serial console, which the host quotes when no status
/// comes back: how far the init got.
fn trace(stage: &str) {
    eprintln!("moat guest init: [{} ms] {stage}", uptime_ms().unwrap_or(0));
}

fn load_modules() -> Result<(), String> {
    let order = fs::read_to_string(MODULE_ORDER).map_err(|e| format!("{MODULE_ORDER}: {e}"))?;
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    for file in order.lines().filter(|l| !l.is_empty()) {
        let name = file.trim_end_matches(".ko").replace('-', "_");
        // Module parameters on the kernel command line (QEMU's
        // `virtio_mmio.device=` entries) are modprobe's to pass: pass them.
        let prefix = format!("{name}.");
        let params: Vec<&str> = cmdline
            .split_whitespace()
            .filter_map(|p| p.strip_prefix(&prefix))
            .collect();
        let params = c(&params.join(" "))?;
        let path = Path::new(MODULE_DIR).join(file);
        let module = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: the descriptor and the NUL-terminated parameters outlive the call.
        let loaded = cvt(unsafe {
            libc::syscall(
                libc::SYS_finit_module,
                module.as_raw_fd(),
                params.as_ptr(),
                0,
            )
        });
        match loaded {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(format!("loading {file}: {e}")),
        }
    }
    Ok(())
}

/// The virtio-serial ports by name, once the driver has probed them.
fn find_ports(names: &[&str]) -> Result<HashMap<String, PathBuf>, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut found = HashMap::new();
        if let Ok(dir) = fs::read_dir("/sys/class/virtio-ports") {
            for entry in dir.flatten() {
                let name = fs::read_to_string(entry.path().join("name")).unwrap_or_default();
                let name = name.trim();
                if names.contains(&name) {
                    found.insert(name.to_owned(), Path::new("/dev").join(entry.file_name()));
                }
            }
        }
        if found.len() == names.len() && found.values().all(|p| p.exists()) {
            return Ok(found);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the host's ports did not appear (found {:?} of {names:?})",
                found.keys().collect::<Vec<_>>()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The ports standing for the descriptors the host passed the program,
/// each open for reading and writing, with where the program gets it. Each
/// is moved above the descriptors it is placed at, so that placing one
/// never overwrites another.
fn open_passed(config: &GuestConfig) -> Result<Vec<(OwnedFd, Vec<i32>)>, String> {
    if config.passed.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = config.passed.iter().map(|p| p.port.as_str()).collect();
    let ports = find_ports(&names)?;
    let mut opened = Vec::new();
    for passed in &config.passed {
        if passed
            .fds
            .iter()
            .any(|fd| !(3..PASSED_FD_FLOOR).contains(fd))
        {
            return Err(format!("port {}: descriptors out of range", passed.port));
        }
        let path = &ports[&passed.port];
        let port = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        wait_host_connected(&passed.port, &port)?;
        use std::os::fd::AsRawFd;
        // SAFETY: duplicating a descriptor this process owns; the copy is
        // owned by the OwnedFd below.
        let high =
            cvt(unsafe { libc::fcntl(port.as_raw_fd(), libc::F_DUPFD_CLOEXEC, PASSED_FD_FLOOR) })
                .map_err(|e| format!("{}: {e}", passed.port))?;
        // SAFETY: `high` was just opened and is owned by nothing else.
        opened.push((unsafe { OwnedFd::from_raw_fd(high) }, passed.fds.clone()));
    }
    Ok(opened)
}

/// Where the init keeps the passed ports until the program's start places
/// them at 3, 4, ...
const PASSED_FD_FLOOR: i32 = 64;

/// Waits until the host end of a port is open: until then a write blocks
/// (the host's "port open" message can arrive after the guest opened its
/// end), and the program would hang on its first line of output.
fn wait_host_connected(name: &str, port: &File) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut poll = libc::pollfd {
            fd: port.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, 50) };
        if ready > 0 && poll.revents & libc::POLLOUT != 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the host never opened its end of port {name}"));
        }
    }
}

fn mount_9p(tag: &str, target: &str, writable: bool, cache: &str) -> Result<(), String> {
    fs::create_dir_all(target).map_err(|e| format!("creating {target}: {e}"))?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if !writable {
        flags |= libc::MS_RDONLY;
    }
    mount(
        tag,
        target,
        "9p",
        flags,
        &format!("trans=virtio,version=9p2000.L,msize=262144,cache={cache}"),
    )
}

fn read_config() -> Result<GuestConfig, String> {
    let dir = "/run/moat";
    mount_9p(CONFIG_TAG, dir, false, "none")?;
    let path = Path::new(dir).join(CONFIG_FILE);
    let text = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()));
    let c_dir = c(dir)?;
    // SAFETY: a NUL-terminated path; the share is not the program's to see.
    let _ = unsafe { libc::umount2(c_dir.as_ptr(), libc::MNT_DETACH) };
    let _ = fs::remove_dir(dir);
    let _ = fs::remove_dir("/run");
    serde_json::from_slice(&text?).map_err(|e| format!("{}: {e}", path.display()))
}

fn build_root(config: &GuestConfig) -> Result<(), String> {
    for entry in &config.system {
        match entry {
            SystemEntry::Link { name, target } => {
                std::os::unix::fs::symlink(target, Path::new("/").join(name))
                    .map_err(|e| format!("linking /{name}: {e}"))?;
            }
            SystemEntry::Share { name, tag } => mount_9p(tag, &format!("/{name}"), false, "loose")?,
        }
    }
    mount(
        "tmpfs",
        "/tmp",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("size={},mode=1777", config.tmp_size_bytes),
    )?;
    for root in &config.roots {
        // Shared mappings (a database's) work on writable roots.
        let cache = if root.writable { "mmap" } else { "loose" };
        mount_9p(&root.tag, &root.inside, root.writable, cache)?;
    }
    Ok(())
}

fn network(config: &GuestConfig, layers: &mut Vec<String>) -> Result<(), String> {
    interface_up("lo", None)?;
    if !config.proxy {
        layers.push("network: no interface but lo".into());
        return Ok(());
    }
    let nic = fs::read_dir("/sys/class/net")
        .map_err(|e| format!("/sys/class/net: {e}"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n != "lo")
        .ok_or("no network interface for the egress proxy")?;
    interface_up(&nic, Some(GUEST_ADDR))?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", crate::EGRESS_PORT))
        .map_err(|e| format!("listening on 127.0.0.1:{}: {e}", crate::EGRESS_PORT))?;
    std::thread::Builder::new()
        .spawn(move || proxy_relay(listener))
        .map_err(|e| format!("starting the proxy relay: {e}"))?;
    layers.push(format!(
        "network: {nic} reaches only the egress proxy (the emulator's user network, \
         restricted), relayed from 127.0.0.1:{}",
        crate::EGRESS_PORT
    ));
    Ok(())
}

/// Relays each connection to the proxy's guest address.
fn proxy_relay(listener: std::net::TcpListener) {
    let [a, b, c, d] = PROXY_GUEST_ADDR;
    let proxy = std::net::SocketAddr::from(([a, b, c, d], crate::EGRESS_PORT));
    for conn in listener.incoming().flatten() {
        // A thread the kernel refuses (the program used them up) drops this
        // connection; a panic here would end the init and the machine.
        let _ = std::thread::Builder::new().spawn(move || {
            let Ok(upstream) = std::net::TcpStream::connect(proxy) else {
                return;
            };
            let (Ok(mut up_w), Ok(mut conn_r)) = (upstream.try_clone(), conn.try_clone()) else {
                return;
            };
            let mut up_r = upstream;
            let mut conn_w = conn;
            let upstream = std::thread::Builder::new().spawn(move || {
                let _ = super::relay::copy(&mut conn_r, &mut up_w);
                let _ = up_w.shutdown(std::net::Shutdown::Write);
            });
            let Ok(upstream) = upstream else {
                return;
            };
            let _ = super::relay::copy(&mut up_r, &mut conn_w);
            let _ = conn_w.shutdown(std::net::Shutdown::Write);
            let _ = upstream.join();
        });
    }
}

fn interface_up(name: &str, address: Option<[u8; 4]>) -> Result<(), String> {
    let fail = |what: &str, e: io::Error| format!("{what} {name}: {e}");
    // SAFETY: a plain socket for interface ioctls, closed below.
    let sock =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })
            .map_err(|e| fail("socket for", e))?;
    // SAFETY: `sock` is ours.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(sock) };
    use std::os::fd::AsRawFd;
    // SAFETY: ifreq is plain old data; zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src as libc::c_char;
    }
    if let Some(addr) = address {
        for (request, value) in [
            (libc::SIOCSIFADDR, addr),
            (libc::SIOCSIFNETMASK, [255, 255, 255, 0]),
        ] {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(value),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: the union's address member is a sockaddr, which a
            // sockaddr_in fits.
            unsafe {
                std::ptr::write_unaligned(
                    std::ptr::addr_of_mut!(req.ifr_ifru.ifru_addr).cast::<libc::sockaddr_in>(),
                    sin,
                );
            }
            // SAFETY: `req` is a valid ifreq for these requests.
            cvt(unsafe { libc::ioctl(sock.as_raw_fd(), request, &mut req) })
                .map_err(|e| fail("addressing", e))?;
        }
    }
    // SAFETY: as above.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })
        .map_err(|e| fail("reading the flags of", e))?;
    // SAFETY: SIOCGIFFLAGS filled the flags member.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) })
        .map_err(|e| fail("bringing up", e))?;
    Ok(())
}

/// What the program sees of the guest's kernel: no `/sys`, a read-only
/// `/proc/sys` and no sysrq trigger, a `/dev` of five nodes (the host's
/// ports are the init's, open already).
fn harden_view(layers: &mut Vec<String>) -> Result<(), String> {
    let ro_bind = |path: &str| -> Result<(), String> {
        mount(path, path, "", libc::MS_BIND | libc::MS_REC, "")?;
        mount(
            "",
            path,
            "",
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            "",
        )
    };
    ro_bind("/proc/sys")?;
    mount("/dev/null", "/proc/sysrq-trigger", "", libc::MS_BIND, "")?;
    for path in ["/sys", "/dev"] {
        let p = c(path)?;
        // SAFETY: a NUL-terminated path.
        cvt(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) })
            .map_err(|e| format!("unmounting {path}: {e}"))?;
    }
    // And no empty /sys, nor the /root the kernel makes in every initramfs.
    for dir in ["/sys", "/root"] {
        if let Err(e) = fs::remove_dir(dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            return Err(format!("removing {dir}: {e}"));
        }
    }
    mount(
        "tmpfs",
        "/dev",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "size=64k,mode=0755",
    )?;
    for (name, minor) in [
        ("null", 3),
        ("zero", 5),
        ("full", 7),
        ("random", 8),
        ("urandom", 9),
    ] {
        let path = c(&format!("/dev/{name}"))?;
        // SAFETY: a NUL-terminated path; a character device of the memory driver.
        cvt(unsafe {
            libc::mknod(
                path.as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(1, minor),
            )
        })
        .map_err(|e| format!("making /dev/{name}: {e}"))?;
        // mknod honours the umask: set the mode plainly.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(format!("/dev/{name}"), fs::Permissions::from_mode(0o666))
            .map_err(|e| format!("/dev/{name}: {e}"))?;
    }
    for (link, target) in crate::mounts::DEV_LINKS {
        std::os::unix::fs::symlink(target, Path::new("/dev").join(link))
            .map_err(|e| format!("linking /dev/{link}: {e}"))?;
    }
    // The image's root and /dev are the init's: read-only from here on
    // (the program may be uid 0, without a capability but owning them).
    for path in ["/dev", "/"] {
        mount(
            "",
            path,
            "",
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID,
            "",
        )?;
    }
    layers.push(
        "view: read-only root, no /sys, /proc/sys read-only, /dev of null, zero, full, \
         random, urandom; writable: /tmp and the writable roots"
            .into(),
    );
    Ok(())
}

/// Guest uptime, in milliseconds.
fn uptime_ms() -> Option<u64> {
    let text = fs::read_to_string("/proc/uptime").ok()?;
    let seconds: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some((seconds * 1000.0) as u64)
}

fn run_program(
    config: &GuestConfig,
    stdout: File,
    stderr: File,
    passed: &[(OwnedFd, Vec<i32>)],
    mut layers: Vec<String>,
) -> Result<GuestStatus, String> {
    // The program acts as the owner of its first writable root, as the
    // `namespace` class does; with none, as nobody.
    let owner = config
        .roots
        .iter()
        .find(|r| r.writable)
        .and_then(|r| fs::metadata(&r.inside).ok())
        .map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.uid(), m.gid())
        })
        .unwrap_or((65534, 65534));
    let programs =
        crate::seccomp::compile(config.proxy, false, false).map_err(|e| e.to_string())?;
    // Refusals go to the init through user notification, so that each is
    // observed and reported, as in the namespace class; the child hands
    // the listener over before it execs.
    let seccomp = programs.notify;
    let (notify_here, notify_there) =
        crate::sys::socketpair().map_err(|e| format!("the seccomp listener's socket: {e}"))?;
    let notify_there_fd = {
        use std::os::fd::AsRawFd;
        notify_there.as_raw_fd()
    };
    let (uid, gid) = owner;
    let last_cap: libc::c_ulong = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or("cannot read /proc/sys/kernel/cap_last_cap")?;
    let Some((program, args)) = config.argv.split_first() else {
        return Err("no program".into());
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(config.env.iter().map(|(n, v)| (n, v)))
        .current_dir(&config.cwd)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    if uid != 0 {
        // std clears the supplementary groups when root changes uid.
        cmd.uid(uid).gid(gid);
        layers.push(format!("identity: uid {uid} / gid {gid}, no capabilities"));
    } else {
        layers.push(
            "identity: uid 0 (the owner of its writable root) with every capability dropped \
             and securebits locked"
                .into(),
        );
    }
    let limits = [
        (libc::RLIMIT_NOFILE, config.open_files),
        (libc::RLIMIT_NPROC, config.pids),
        (libc::RLIMIT_FSIZE, config.file_size_bytes),
        (libc::RLIMIT_CORE, 0),
    ];
    // Raised here first, by the init that may: the child sets them again
    // after it has changed uid, when it could only lower them.
    for (resource, value) in limits {
        let limit = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: a valid rlimit for a known resource.
        cvt(unsafe { libc::setrlimit(resource, &limit) })
            .map_err(|e| format!("rlimit {resource}: {e}"))?;
    }
    let nproc = if uid == 0 {
        " (not applied to uid 0)"
    } else {
        ""
    };
    layers.push(format!(
        "rlimits: nofile {}, nproc {}{nproc}, fsize {}, core 0",
        config.open_files, config.pids, config.file_size_bytes
    ));
    layers.push("no_new_privs".into());
    layers.push("seccomp: the namespace class's deny list, each refusal reported".into());
    layers.push("environment: scrubbed (the host's list only)".into());
    // Placed last in the child, after the seccomp listener is handed over
    // (its socket may stand at one of these numbers).
    let placements: Vec<(i32, i32)> = passed
        .iter()
        .flat_map(|(port, fds)| {
            use std::os::fd::AsRawFd;
            fds.iter().map(|&fd| (port.as_raw_fd(), fd))
        })
        .collect();
    if !placements.is_empty() {
        let at: Vec<String> = placements.iter().map(|(_, fd)| fd.to_string()).collect();
        layers.push(format!(
            "descriptors {}: the host's, virtio-serial ports relayed from its sockets",
            at.join(", ")
        ));
    }
    // SAFETY: the closure runs in the child between fork and exec, on memory
    // prepared before the fork; its system calls are async-signal-safe, and
    // the one allocation (send_fd's control buffer) relies on glibc's malloc
    // being reset in the child of a fork (the only other thread, the proxy
    // relay, may hold no lock of ours).
    unsafe {
        cmd.pre_exec(move || {
            cvt(libc::setsid())?;
            if uid == 0 {
                drop_all_capabilities(last_cap)?;
            }
            for (resource, value) in limits {
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                cvt(libc::setrlimit(resource, &limit))?;
            }
            cvt(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            if let Some(listener) = crate::seccomp::install(&seccomp, true)? {
                crate::sys::send_fd(notify_there_fd, listener)?;
                libc::close(listener);
            }
            for &(port, at) in &placements {
                // dup2 leaves the copy open across exec.
                cvt(libc::dup2(port, at))?;
            }
            Ok(())
        });
    }
    let boot_ms = uptime_ms();
    let spawned = cmd.spawn();
    drop(cmd);
    drop(notify_there);
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return Ok(GuestStatus {
                exit: ExitStatus::ExecFailed {
                    errno: e.raw_os_error().unwrap_or(libc::ENOEXEC),
                },
                timed_out: false,
                boot_ms,
                layers,
                denied: Vec::new(),
                error: None,
            });
        }
    };
    let mut listener = {
        use std::os::fd::AsRawFd;
        crate::sys::recv_fd(notify_here.as_raw_fd())
            .map_err(|e| format!("receiving the seccomp listener: {e}"))?
    };
    let mut counts = std::collections::BTreeMap::new();
    let mut denied: Vec<GuestDenial> = Vec::new();
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + Duration::from_millis(config.timeout_ms);
    let mut timed_out = false;
    let exit = loop {
        let mut status = 0;
        // SAFETY: plain wait; PID 1 reaps every orphan too.
        let reaped = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if reaped == pid {
            break std::process::ExitStatus::from_raw(status);
        }
        if reaped > 0 {
            continue;
        }
        if !timed_out && Instant::now() >= deadline {
            timed_out = true;
            // SAFETY: every process but this init.
            unsafe { libc::kill(-1, libc::SIGKILL) };
        }
        match &listener {
            Some(fd) => {
                if !answer_refusals(fd, &mut counts, &mut denied) {
                    listener = None;
                }
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    for denial in &mut denied {
        denial.count = counts.get(denial.syscall.as_str()).copied().unwrap_or(1);
    }
    // Whatever the program left behind ends with it.
    // SAFETY: as above.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    reap_all();
    let exit = match (exit.code(), exit.signal()) {
        (Some(code), _) => ExitStatus::Exited { code },
        (None, Some(signal)) => ExitStatus::Signaled { signal },
        (None, None) => ExitStatus::NotStarted,
    };
    for root in &config.roots {
        if let Ok(path) = c(&root.inside) {
            // SAFETY: a NUL-terminated path. Writes reach the host on unmount.
            unsafe { libc::umount2(path.as_ptr(), 0) };
        }
    }
    Ok(GuestStatus {
        exit,
        timed_out,
        boot_ms,
        layers,
        denied,
        error: None,
    })
}

/// Waits a moment for a refused syscall and answers it (always with an
/// error). Returns false once no process holds the filter any more.
fn answer_refusals(
    listener: &std::os::fd::OwnedFd,
    counts: &mut std::collections::BTreeMap<&'static str, u64>,
    denied: &mut Vec<GuestDenial>,
) -> bool {
    use std::os::fd::AsRawFd;
    let mut poll = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut poll, 1, 2) };
    if ready <= 0 {
        return true;
    }
    if poll.revents & libc::POLLIN != 0 {
        crate::supervise::answer_notification(
            listener.as_raw_fd(),
            Some(&crate::confine::TcpRules {
                connect: vec![crate::launch::EGRESS_PORT],
                bind: Vec::new(),
            }),
            counts,
            &mut |d| {
                if let crate::supervise::Denial::Syscall { name, arch, nr } = d {
                    denied.push(GuestDenial {
                        syscall: name.to_owned(),
                        arch,
                        nr,
                        count: 1,
                    });
                }
            },
        );
        return true;
    }
    poll.revents & (libc::POLLHUP | libc::POLLERR) == 0
}

/// Reaps the killed processes, for at most a second.
fn reap_all() {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let mut status = 0;
        // SAFETY: plain wait.
        let reaped = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if reaped < 0 {
            return;
        }
        if reaped == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Root in the guest without root's power: no capability in any set, and
/// securebits locked so that none comes back on exec.
fn drop_all_capabilities(last_cap: libc::c_ulong) -> io::Result<()> {
    // SAFETY (all below): plain prctl/capset calls on values built here.
    unsafe {
        for cap in 0..=last_cap {
            cvt(libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0))?;
        }
        cvt(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ))?;
        // NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, NO_CAP_AMBIENT_RAISE, each locked.
        let bits = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
        cvt(libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0))?;
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut header = Header {
            version: 0x2008_0522,
            pid: 0,
        };
        let data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        cvt(libc::syscall(
            libc::SYS_capset,
            std::ptr::addr_of_mut!(header),
            data.as_ptr(),
        ))?;
    }
    Ok(())
}
