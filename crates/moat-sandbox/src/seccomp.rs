//! The seccomp-bpf layer: a deny list as data, compiled with `seccompiler`.
//!
//! Denied syscalls go to the launcher through `SECCOMP_RET_USER_NOTIF`, so each
//! refusal is *observed* (and becomes a `sandbox.syscall.denied` event) rather
//! than guessed; the launcher always answers with an error and never lets a
//! notified syscall continue. Where user notification is unavailable the same
//! filter returns `EPERM` directly.
//!
//! A prologue checks the architecture and refuses the x32 ABI before any
//! syscall number is compared: without it a deny list is bypassed through
//! `int 0x80` (i386 numbers) or x32 numbers.

use std::collections::{BTreeMap, BTreeSet};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use crate::error::{Layer, SetupError};

/// When a listed syscall is refused.
#[derive(Clone, Copy)]
enum When {
    Always,
    /// Any of these bits set in the (32-bit) argument.
    AnyBit(u8, &'static [u64]),
    /// The (32-bit) argument equals one of these.
    ArgIs(u8, &'static [u64]),
    /// Argument `a` equals `value` and argument `b` masked with `mask` equals `masked`.
    Both(u8, u64, u8, u64, u64),
    /// Creating a file (flags argument has O_CREAT or O_TMPFILE) with set-id bits in the mode argument.
    CreatesSetId(u8, u8),
}

#[derive(Clone, Copy)]
struct Deny {
    name: &'static str,
    nr: i64,
    when: When,
}

/// Namespace flags of `clone(2)`. (`CLONE_NEWTIME` shares its bit with the
/// exit-signal field there and is only accepted by `clone3`, which is steered
/// away; `unshare` is refused whatever its flags.)
const NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];
const SET_ID: &[u64] = &[libc::S_ISUID as u64, libc::S_ISGID as u64];
// `as _`: the ioctl request type differs between libc targets.
#[allow(clippy::unnecessary_cast)]
const TTY_INJECT: &[u64] = &[libc::TIOCSTI as u64, libc::TIOCLINUX as u64];

macro_rules! deny {
    ($($name:ident $(=> $when:expr)?),+ $(,)?) => {
        &[$(Deny { name: stringify!($name), nr: paste_nr!($name), when: deny!(@when $($when)?) }),+]
    };
    (@when) => { When::Always };
    (@when $when:expr) => { $when };
}

macro_rules! paste_nr {
    ($name:ident) => {
        syscall_nr::$name
    };
}

#[allow(non_upper_case_globals)]
mod syscall_nr {
    macro_rules! nrs {
        ($($name:ident = $sys:ident),+ $(,)?) => { $(pub const $name: i64 = libc::$sys;)+ };
    }
    nrs!(
        mount = SYS_mount,
        umount2 = SYS_umount2,
        pivot_root = SYS_pivot_root,
        chroot = SYS_chroot,
        open_tree = SYS_open_tree,
        move_mount = SYS_move_mount,
        mount_setattr = SYS_mount_setattr,
        fsopen = SYS_fsopen,
        fsconfig = SYS_fsconfig,
        fsmount = SYS_fsmount,
        fspick = SYS_fspick,
        ptrace = SYS_ptrace,
        process_vm_readv = SYS_process_vm_readv,
        process_vm_writev = SYS_process_vm_writev,
        pidfd_getfd = SYS_pidfd_getfd,
        bpf = SYS_bpf,
        perf_event_open = SYS_perf_event_open,
        keyctl = SYS_keyctl,
        add_key = SYS_add_key,
        request_key = SYS_request_key,
        userfaultfd = SYS_userfaultfd,
        io_uring_setup = SYS_io_uring_setup,
        io_uring_enter = SYS_io_uring_enter,
        io_uring_register = SYS_io_uring_register,
        kexec_load = SYS_kexec_load,
        kexec_file_load = SYS_kexec_file_load,
        init_module = SYS_init_module,
        finit_module = SYS_finit_module,
        delete_module = SYS_delete_module,
        reboot = SYS_reboot,
        swapon = SYS_swapon,
        swapoff = SYS_swapoff,
        unshare = SYS_unshare,
        setns = SYS_setns,
        clone = SYS_clone,
        open_by_handle_at = SYS_open_by_handle_at,
        ioctl = SYS_ioctl,
        socket = SYS_socket,
        acct = SYS_acct,
        quotactl = SYS_quotactl,
        syslog = SYS_syslog,
        settimeofday = SYS_settimeofday,
        clock_settime = SYS_clock_settime,
        clock_adjtime = SYS_clock_adjtime,
        iopl = SYS_iopl,
        ioperm = SYS_ioperm,
        fanotify_init = SYS_fanotify_init,
        vhangup = SYS_vhangup,
        chmod = SYS_chmod,
        fchmod = SYS_fchmod,
        fchmodat = SYS_fchmodat,
        fchmodat2 = SYS_fchmodat2,
        creat = SYS_creat,
        open = SYS_open,
        openat = SYS_openat,
        mknod = SYS_mknod,
        mknodat = SYS_mknodat,
        sendto = SYS_sendto,
        sendmsg = SYS_sendmsg,
        sendmmsg = SYS_sendmmsg,
        setsockopt = SYS_setsockopt,
        chown = SYS_chown,
        fchown = SYS_fchown,
        lchown = SYS_lchown,
        fchownat = SYS_fchownat,
        setxattr = SYS_setxattr,
        lsetxattr = SYS_lsetxattr,
        fsetxattr = SYS_fsetxattr,
        removexattr = SYS_removexattr,
        lremovexattr = SYS_lremovexattr,
        fremovexattr = SYS_fremovexattr,
        link = SYS_link,
        linkat = SYS_linkat,
        symlink = SYS_symlink,
        symlinkat = SYS_symlinkat,
        unlink = SYS_unlink,
        unlinkat = SYS_unlinkat,
        rename = SYS_rename,
        renameat = SYS_renameat,
        renameat2 = SYS_renameat2,
        mkdir = SYS_mkdir,
        mkdirat = SYS_mkdirat,
        rmdir = SYS_rmdir,
        truncate = SYS_truncate,
        utimes = SYS_utimes,
        utimensat = SYS_utimensat,
        futimesat = SYS_futimesat,
        kill = SYS_kill,
        tkill = SYS_tkill,
        tgkill = SYS_tgkill,
        pidfd_send_signal = SYS_pidfd_send_signal,
        pidfd_open = SYS_pidfd_open,
        execve = SYS_execve,
        execveat = SYS_execveat,
    );
}

const O_CREATE_ANY: &[u64] = &[libc::O_CREAT as u64, libc::O_TMPFILE as u64];

/// The deny list. Everything not listed is allowed; the other layers
/// (namespaces, Landlock, no capabilities) bound what an allowed call can reach.
const DENY: &[Deny] = deny![
    mount, umount2, pivot_root, chroot, open_tree, move_mount, mount_setattr, fsopen,
    fsconfig, fsmount, fspick,
    ptrace, process_vm_readv, process_vm_writev, pidfd_getfd,
    bpf, perf_event_open, keyctl, add_key, request_key, userfaultfd,
    io_uring_setup, io_uring_enter, io_uring_register,
    kexec_load, kexec_file_load, init_module, finit_module, delete_module, reboot,
    swapon, swapoff, acct, quotactl, syslog, settimeofday, clock_settime, clock_adjtime,
    iopl, ioperm, fanotify_init, vhangup, open_by_handle_at, setns, unshare,
    clone => When::AnyBit(0, NS_FLAGS),
    ioctl => When::ArgIs(1, TTY_INJECT),
    // Packet sockets; vsock and Bluetooth, which network namespaces do not
    // isolate (vsock reaches the hypervisor host from inside a VM).
    socket => When::ArgIs(0, &[libc::AF_PACKET as u64, libc::AF_VSOCK as u64, libc::AF_BLUETOOTH as u64]),
    // Raw IP sockets; the type argument may carry SOCK_NONBLOCK / SOCK_CLOEXEC.
    socket => When::Both(0, libc::AF_INET as u64, 1, 0xf, libc::SOCK_RAW as u64),
    socket => When::Both(0, libc::AF_INET6 as u64, 1, 0xf, libc::SOCK_RAW as u64),
    // No set-user-ID or set-group-ID files: a declared root may be owned by a
    // more privileged host user than the sandbox runs as.
    chmod => When::AnyBit(1, SET_ID),
    fchmod => When::AnyBit(1, SET_ID),
    fchmodat => When::AnyBit(2, SET_ID),
    fchmodat2 => When::AnyBit(2, SET_ID),
    creat => When::AnyBit(1, SET_ID),
    mknod => When::AnyBit(1, SET_ID),
    mknodat => When::AnyBit(2, SET_ID),
    open => When::CreatesSetId(1, 2),
    openat => When::CreatesSetId(2, 3),
];

/// Added for the `ingress-only` forwarder, a host process that needs none
/// of these: no file changed, no process signalled, nothing executed.
const DENY_FORWARDER: &[Deny] = deny![
    chmod,
    fchmod,
    fchmodat,
    fchmodat2,
    chown,
    fchown,
    lchown,
    fchownat,
    setxattr,
    lsetxattr,
    fsetxattr,
    removexattr,
    lremovexattr,
    fremovexattr,
    link,
    linkat,
    symlink,
    symlinkat,
    unlink,
    unlinkat,
    rename,
    renameat,
    renameat2,
    mkdir,
    mkdirat,
    rmdir,
    truncate,
    utimes,
    utimensat,
    futimesat,
    creat,
    mknod,
    mknodat,
    kill,
    tkill,
    tgkill,
    pidfd_send_signal,
    pidfd_open,
    execve,
    execveat,
];

/// Added in the proxy network modes: no UDP (so no DNS, QUIC or other
/// datagrams of the program's own); TCP is bounded by Landlock to the proxy.
const DENY_PROXY: &[Deny] = deny![
    socket => When::Both(0, libc::AF_INET as u64, 1, 0xf, libc::SOCK_DGRAM as u64),
    socket => When::Both(0, libc::AF_INET6 as u64, 1, 0xf, libc::SOCK_DGRAM as u64),
    // Nor the other internet socket kinds (SCTP's SEQPACKET, RDM, DCCP) or
    // stream protocols Landlock's TCP rules do not cover (SCTP, MPTCP).
    socket => When::Both(0, libc::AF_INET as u64, 1, 0xf, libc::SOCK_SEQPACKET as u64),
    socket => When::Both(0, libc::AF_INET6 as u64, 1, 0xf, libc::SOCK_SEQPACKET as u64),
    socket => When::Both(0, libc::AF_INET as u64, 1, 0xf, libc::SOCK_RDM as u64),
    socket => When::Both(0, libc::AF_INET6 as u64, 1, 0xf, libc::SOCK_RDM as u64),
    socket => When::Both(0, libc::AF_INET as u64, 1, 0xf, 6 /* SOCK_DCCP */),
    socket => When::Both(0, libc::AF_INET6 as u64, 1, 0xf, 6 /* SOCK_DCCP */),
    socket => When::Both(0, libc::AF_INET as u64, 2, 0xffff_ffff, libc::IPPROTO_SCTP as u64),
    socket => When::Both(0, libc::AF_INET6 as u64, 2, 0xffff_ffff, libc::IPPROTO_SCTP as u64),
    socket => When::Both(0, libc::AF_INET as u64, 2, 0xffff_ffff, libc::IPPROTO_MPTCP as u64),
    socket => When::Both(0, libc::AF_INET6 as u64, 2, 0xffff_ffff, libc::IPPROTO_MPTCP as u64),
    // TCP Fast Open connects from sendto/sendmsg, past the connect() check.
    sendto => When::AnyBit(3, &[libc::MSG_FASTOPEN as u64]),
    sendmsg => When::AnyBit(2, &[libc::MSG_FASTOPEN as u64]),
    sendmmsg => When::AnyBit(3, &[libc::MSG_FASTOPEN as u64]),
    setsockopt => When::Both(1, libc::IPPROTO_TCP as u64, 2, 0xffff_ffff, 30 /* TCP_FASTOPEN_CONNECT */),
];

/// Syscalls answered with `ENOSYS` so that libc falls back to a call the deny
/// list can inspect (`clone3` and `openat2` pass their flags in memory).
const STEERED: &[(&str, i64)] = &[("clone3", libc::SYS_clone3), ("openat2", libc::SYS_openat2)];

const SENTINEL_ERRNO: u32 = 0x0bad;

/// Both compiled forms of the filter.
pub(crate) struct SeccompPrograms {
    pub(crate) notify: BpfProgram,
    pub(crate) errno: BpfProgram,
}

/// The filter; `proxy_network` adds [`DENY_PROXY`], `watch_connect` shows
/// every `connect(2)` to the launcher (the proxy modes, but for a jail
/// whose TCP stays on its own loopback; `ingress-only`), `watch_bind` every
/// `bind(2)` (`ingress-only`).
pub(crate) fn compile(
    proxy_network: bool,
    watch_connect: bool,
    watch_bind: bool,
) -> Result<SeccompPrograms, SetupError> {
    let extra: &[Deny] = if proxy_network { DENY_PROXY } else { &[] };
    build(extra, watch_connect, watch_bind)
}

/// The `ingress-only` forwarder's filter (refusing with `EPERM`): the
/// sandbox's list and the proxy modes' (no UDP, no other internet socket
/// kinds), and nothing that changes a file or signals a process: it only
/// relays connections it already holds.
pub(crate) fn compile_forwarder() -> Result<BpfProgram, SetupError> {
    let extra: Vec<Deny> = DENY_PROXY.iter().chain(DENY_FORWARDER).copied().collect();
    Ok(build(&extra, false, false)?.errno)
}

fn build(
    extra: &[Deny],
    watch_connect: bool,
    watch_bind: bool,
) -> Result<SeccompPrograms, SetupError> {
    let err = |e: seccompiler::BackendError| SetupError::new(Layer::Seccomp, e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // Syscalls refused whatever their arguments are decided by the dispatch
    // tree itself; only those with argument rules reach seccompiler's body.
    // (A smaller program is cheaper to install: the kernel translates and
    // JIT-compiles it on every launch.)
    let always: BTreeSet<u32> = DENY
        .iter()
        .chain(extra)
        .filter(|d| matches!(d.when, When::Always))
        .map(|d| d.nr as u32)
        .collect();
    for deny in DENY.iter().chain(extra) {
        if !always.contains(&(deny.nr as u32)) {
            let entry = rules.entry(deny.nr).or_default();
            entry.extend(rules_for(deny.when).map_err(err)?);
        }
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| SetupError::new(Layer::Seccomp, e.to_string()))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(SENTINEL_ERRNO),
        arch,
    )
    .map_err(err)?;
    let body: BpfProgram = filter.try_into().map_err(err)?;
    let mut denied: Vec<u32> = DENY.iter().chain(extra).map(|d| d.nr as u32).collect();
    denied.sort_unstable();
    denied.dedup();
    let dispatch = dispatch_tree(&denied, &always)?;
    let with_action = |deny_action: u32| {
        let mut program = prologue(deny_action);
        // Proxy modes: every connect(2) is shown to the launcher, which
        // refuses (and records) the ones that bypass the proxy and lets the
        // rest continue to Landlock's port rule, which is what enforces.
        // Without user notification Landlock alone decides, unobserved.
        if watch_connect && deny_action == libc::SECCOMP_RET_USER_NOTIF {
            program.push(jump(BPF_JEQ_K, libc::SYS_connect as u32, 0, 1));
            program.push(stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF));
        }
        // ingress-only: likewise every bind(2), so that a port it does not
        // expose is refused on the record, not only by Landlock.
        if watch_bind && deny_action == libc::SECCOMP_RET_USER_NOTIF {
            program.push(jump(BPF_JEQ_K, libc::SYS_bind as u32, 0, 1));
            program.push(stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF));
        }
        program.extend(dispatch.iter().chain(body.iter()).map(|insn| {
            let mut insn = insn.clone();
            if insn.code == BPF_RET_K && insn.k == libc::SECCOMP_RET_ERRNO | SENTINEL_ERRNO {
                insn.k = deny_action;
            }
            insn
        }));
        program
    };
    Ok(SeccompPrograms {
        notify: with_action(libc::SECCOMP_RET_USER_NOTIF),
        errno: with_action(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
    })
}

fn rules_for(when: When) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
    };
    let bit = |arg: u8, b: u64| cond(arg, SeccompCmpOp::MaskedEq(b), b);
    Ok(match when {
        When::Always => Vec::new(),
        When::AnyBit(arg, bits) => bits
            .iter()
            .map(|b| SeccompRule::new(vec![bit(arg, *b)?]))
            .collect::<Result<_, _>>()?,
        When::ArgIs(arg, values) => values
            .iter()
            .map(|v| SeccompRule::new(vec![cond(arg, SeccompCmpOp::Eq, *v)?]))
            .collect::<Result<_, _>>()?,
        When::Both(a, value, b, mask, masked) => vec![SeccompRule::new(vec![
            cond(a, SeccompCmpOp::Eq, value)?,
            cond(b, SeccompCmpOp::MaskedEq(mask), masked)?,
        ])?],
        When::CreatesSetId(flags, mode) => {
            let mut rules = Vec::new();
            for create in O_CREATE_ANY {
                for set_id in SET_ID {
                    rules.push(SeccompRule::new(vec![
                        bit(flags, *create)?,
                        bit(mode, *set_id)?,
                    ])?);
                }
            }
            rules
        }
    })
}

/// BPF_LD | BPF_W | BPF_ABS (the first two are 0).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;
const ARCH_OFFSET: u32 = 4;
const NR_OFFSET: u32 = 0;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Architecture check, x32 refusal and the steered syscalls, before the
/// seccompiler body (which checks the architecture again).
fn prologue(deny_action: u32) -> BpfProgram {
    let mut program = vec![
        stmt(BPF_LD_W_ABS, ARCH_OFFSET),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, deny_action),
        stmt(BPF_LD_W_ABS, NR_OFFSET),
    ];
    if cfg!(target_arch = "x86_64") {
        program.push(jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1));
        program.push(stmt(BPF_RET_K, deny_action));
    }
    for (_, nr) in STEERED {
        program.push(jump(BPF_JEQ_K, *nr as u32, 0, 1));
        program.push(stmt(
            BPF_RET_K,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ));
    }
    program
}

enum Target {
    Next,
    At(usize),
    Allow,
    Deny,
    Body,
}

/// A balanced binary search over the listed syscall numbers: anything not on
/// the list is allowed after a handful of comparisons instead of walking the
/// whole rule chain, and a syscall in `always` is refused there and then.
/// Besides the runtime saving, the kernel's per-syscall "always allowed"
/// cache is computed by emulating the filter for every syscall number when it
/// is installed, and a short path makes that cheap. The refusal is the
/// sentinel the caller replaces with its deny action.
fn dispatch_tree(nrs: &[u32], always: &BTreeSet<u32>) -> Result<BpfProgram, SetupError> {
    fn emit(nrs: &[u32], always: &BTreeSet<u32>, out: &mut Vec<(u16, u32, Target, Target)>) {
        if let [only] = nrs {
            let hit = if always.contains(only) {
                Target::Deny
            } else {
                Target::Body
            };
            out.push((BPF_JEQ_K, *only, hit, Target::Allow));
            return;
        }
        let mid = nrs.len() / 2;
        let at = out.len();
        out.push((BPF_JGE_K, nrs[mid], Target::Next, Target::Next));
        emit(&nrs[..mid], always, out);
        out[at].2 = Target::At(out.len());
        emit(&nrs[mid..], always, out);
    }
    let mut nodes = Vec::new();
    if !nrs.is_empty() {
        emit(nrs, always, &mut nodes);
    }
    let allow = nodes.len();
    let deny = allow + 1;
    let body = allow + 2;
    let offset = |from: usize, target: &Target| -> Result<u8, SetupError> {
        let to = match target {
            Target::Next => from + 1,
            Target::At(i) => *i,
            Target::Allow => allow,
            Target::Deny => deny,
            Target::Body => body,
        };
        u8::try_from(to - from - 1)
            .map_err(|_| SetupError::new(Layer::Seccomp, "deny list too long for one jump"))
    };
    let mut program = Vec::with_capacity(nodes.len() + 1);
    for (i, (code, k, jt, jf)) in nodes.iter().enumerate() {
        program.push(jump(*code, *k, offset(i, jt)?, offset(i, jf)?));
    }
    program.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    program.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | SENTINEL_ERRNO));
    Ok(program)
}

/// Names a syscall the filter refused, for events and the report. The set of
/// names is closed (the deny list plus three classes), so a program looping
/// over syscall numbers cannot grow the launcher's records.
/// The socket calls shown to the launcher in the network modes with TCP
/// rules, whatever their arguments (see [`compile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SocketCall {
    Connect,
    Bind,
}

impl SocketCall {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SocketCall::Connect => "connect",
            SocketCall::Bind => "bind",
        }
    }
}

/// A native-ABI `connect(2)` or `bind(2)` (notified only when watched).
pub(crate) fn watched_socket_call(arch: u32, nr: i32) -> Option<SocketCall> {
    if arch != AUDIT_ARCH {
        return None;
    }
    match i64::from(nr) {
        libc::SYS_connect => Some(SocketCall::Connect),
        libc::SYS_bind => Some(SocketCall::Bind),
        _ => None,
    }
}

pub(crate) fn describe(arch: u32, nr: i32) -> &'static str {
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;
    if arch == AUDIT_ARCH_I386 {
        return "i386-abi";
    }
    if arch != AUDIT_ARCH {
        return "foreign-abi";
    }
    if cfg!(target_arch = "x86_64") && (nr as u32) & X32_SYSCALL_BIT != 0 {
        return "x32-abi";
    }
    DENY.iter()
        .find(|d| d.nr == i64::from(nr))
        .map_or("unlisted", |d| d.name)
}

/// Installs `program` on the calling thread. With `listen`, returns the
/// user-notification listener. Requires `no_new_privs` (set by Landlock).
pub(crate) fn install(program: &BpfProgram, listen: bool) -> std::io::Result<Option<i32>> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut().cast(),
    };
    let flags = if listen {
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER
    } else {
        0
    };
    // SAFETY: prog points at `program`, which outlives the call; the kernel copies it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            std::ptr::addr_of!(prog),
        )
    };
    let ret = crate::sys::cvt(ret)?;
    Ok(listen.then_some(ret as i32))
}

#[cfg(test)]
// libc's ioctl request constants have different types across targets.
#[allow(clippy::unnecessary_cast)]
mod tests {
    use super::*;

    #[test]
    fn both_programs_compile_and_start_with_the_arch_check() {
        let programs = compile(false, false, false).map_err(|e| e.to_string());
        let Ok(programs) = programs else {
            panic!("{programs:?}", programs = programs.err());
        };
        for program in [&programs.notify, &programs.errno] {
            assert_eq!(program[0].k, ARCH_OFFSET);
            assert_eq!(program[1].k, AUDIT_ARCH);
            assert!(program.len() < 4096);
        }
        for (program, action) in [
            (&programs.notify, libc::SECCOMP_RET_USER_NOTIF),
            (
                &programs.errno,
                libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
            ),
        ] {
            let returns = |k| {
                program
                    .iter()
                    .filter(|i| i.code == BPF_RET_K && i.k == k)
                    .count()
            };
            assert_eq!(returns(libc::SECCOMP_RET_ERRNO | SENTINEL_ERRNO), 0);
            // The dispatch tree's refusal, and the body's rules.
            assert!(returns(action) > 10, "{}", returns(action));
        }
    }

    #[test]
    fn denials_are_named() {
        assert_eq!(describe(AUDIT_ARCH, libc::SYS_ptrace as i32), "ptrace");
        assert_eq!(describe(0x4000_0003, 1), "i386-abi");
        assert_eq!(describe(AUDIT_ARCH, 0x4000_0027), "x32-abi");
    }

    /// A classic-BPF interpreter for the instructions our filters use, run
    /// over `seccomp_data` the way the kernel would.
    fn run(program: &BpfProgram, arch: u32, nr: i32, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let insn = &program[pc];
            pc += 1;
            let class = insn.code & 0x07;
            let op = insn.code & 0xf0;
            match class {
                0x00 => {
                    assert_eq!(insn.code, BPF_LD_W_ABS, "only absolute word loads");
                    let at = insn.k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                0x04 => {
                    assert_eq!(op, 0x50, "only AND");
                    acc &= insn.k;
                }
                0x05 => {
                    let taken = match op {
                        0x00 => {
                            pc += insn.k as usize;
                            continue;
                        }
                        0x10 => acc == insn.k,
                        0x20 => acc > insn.k,
                        0x30 => acc >= insn.k,
                        0x40 => acc & insn.k != 0,
                        _ => panic!("jump op {op:#x}"),
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                0x06 => return insn.k,
                _ => panic!("instruction class {class:#x}"),
            }
        }
    }

    const NOTIFY: u32 = libc::SECCOMP_RET_USER_NOTIF;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    #[test]
    fn the_compiled_filter_decides_every_syscall_number_as_the_table_says() {
        let programs = compile(false, false, false).ok().unwrap();
        let program = &programs.notify;
        for nr in 0..600i32 {
            let got = run(program, AUDIT_ARCH, nr, [0; 6]);
            let steered = STEERED.iter().any(|(_, s)| *s == i64::from(nr));
            let always = DENY
                .iter()
                .any(|d| d.nr == i64::from(nr) && matches!(d.when, When::Always));
            let want = if steered {
                libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
            } else if always {
                NOTIFY
            } else {
                ALLOW // conditional rules do not match all-zero arguments
            };
            assert_eq!(got, want, "syscall {nr}");
            // The same number through the x32 and i386 entry points is refused.
            assert_eq!(
                run(program, AUDIT_ARCH, nr | 0x4000_0000, [0; 6]),
                NOTIFY,
                "x32 {nr}"
            );
            assert_eq!(run(program, 0x4000_0003, nr, [0; 6]), NOTIFY, "i386 {nr}");
        }
    }

    #[test]
    fn the_forwarder_relays_but_changes_no_file_and_signals_nothing() {
        let p = &compile_forwarder().ok().unwrap();
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let sys = |nr: i64, args: [u64; 6]| run(p, AUDIT_ARCH, nr as i32, args);
        for nr in [
            libc::SYS_chmod,
            libc::SYS_fchmodat,
            libc::SYS_fchownat,
            libc::SYS_setxattr,
            libc::SYS_unlinkat,
            libc::SYS_renameat2,
            libc::SYS_kill,
            libc::SYS_tgkill,
            libc::SYS_execve,
            libc::SYS_ptrace,
        ] {
            assert_eq!(sys(nr, [0; 6]), eperm, "syscall {nr}");
        }
        let stream = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        assert_eq!(
            sys(libc::SYS_socket, [libc::AF_INET as u64, stream, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            sys(libc::SYS_socket, [libc::AF_INET6 as u64, dgram, 0, 0, 0, 0]),
            eperm
        );
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_poll,
            libc::SYS_accept4,
        ] {
            assert_eq!(sys(nr, [0; 6]), ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn proxy_modes_refuse_udp_sockets_and_keep_tcp_and_unix() {
        let p = &compile(true, true, false).ok().unwrap().notify;
        let off = &compile(false, false, false).ok().unwrap().notify;
        let socket = |p: &BpfProgram, family: i32, ty: i32| {
            run(
                p,
                AUDIT_ARCH,
                libc::SYS_socket as i32,
                [family as u64, ty as u64, 0, 0, 0, 0],
            )
        };
        let dgram = libc::SOCK_DGRAM;
        for family in [libc::AF_INET, libc::AF_INET6] {
            for flags in [
                0,
                libc::SOCK_CLOEXEC,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            ] {
                assert_eq!(socket(p, family, dgram | flags), NOTIFY, "{family} {flags}");
                assert_eq!(socket(off, family, dgram | flags), ALLOW);
            }
            assert_eq!(
                socket(p, family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC),
                ALLOW
            );
        }
        assert_eq!(socket(p, libc::AF_UNIX, dgram), ALLOW);
        assert_eq!(socket(p, libc::AF_UNIX, libc::SOCK_STREAM), ALLOW);
        let sys = |nr: i64, args: [u64; 6]| run(p, AUDIT_ARCH, nr as i32, args);
        let (inet, stream) = (libc::AF_INET as u64, libc::SOCK_STREAM as u64);
        for proto in [libc::IPPROTO_SCTP, libc::IPPROTO_MPTCP] {
            assert_eq!(
                sys(libc::SYS_socket, [inet, stream, proto as u64, 0, 0, 0]),
                NOTIFY
            );
        }
        assert_eq!(
            sys(
                libc::SYS_socket,
                [inet, libc::SOCK_SEQPACKET as u64, 0, 0, 0, 0]
            ),
            NOTIFY
        );
        let tcp = libc::IPPROTO_TCP as u64;
        assert_eq!(sys(libc::SYS_socket, [inet, stream, tcp, 0, 0, 0]), ALLOW);
        let fastopen = libc::MSG_FASTOPEN as u64;
        assert_eq!(sys(libc::SYS_sendto, [3, 0, 1, fastopen, 0, 0]), NOTIFY);
        assert_eq!(
            sys(libc::SYS_sendto, [3, 0, 1, libc::MSG_NOSIGNAL as u64, 0, 0]),
            ALLOW
        );
        assert_eq!(sys(libc::SYS_sendmsg, [3, 0, fastopen, 0, 0, 0]), NOTIFY);
        assert_eq!(sys(libc::SYS_setsockopt, [3, tcp, 30, 0, 4, 0]), NOTIFY);
        assert_eq!(
            sys(
                libc::SYS_setsockopt,
                [3, tcp, libc::TCP_NODELAY as u64, 0, 4, 0]
            ),
            ALLOW
        );
        // Outside the proxy modes these are untouched.
        assert_eq!(
            run(
                off,
                AUDIT_ARCH,
                libc::SYS_sendto as i32,
                [3, 0, 1, fastopen, 0, 0]
            ),
            ALLOW
        );
    }

    #[test]
    fn argument_rules_match_what_they_should_and_nothing_else() {
        let p = &compile(false, false, false).ok().unwrap().notify;
        let sys = |nr: i64, args: [u64; 6]| run(p, AUDIT_ARCH, nr as i32, args);
        let newuser = libc::CLONE_NEWUSER as u64;
        let sigchld = libc::SIGCHLD as u64;
        assert_eq!(
            sys(libc::SYS_clone, [newuser | sigchld, 0, 0, 0, 0, 0]),
            NOTIFY
        );
        assert_eq!(
            sys(libc::SYS_clone, [libc::CLONE_NEWNET as u64, 0, 0, 0, 0, 0]),
            NOTIFY
        );
        assert_eq!(
            sys(libc::SYS_clone, [0x3d0f00 | sigchld, 0, 0, 0, 0, 0]),
            ALLOW
        ); // pthread_create
        assert_eq!(
            sys(libc::SYS_unshare, [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]),
            NOTIFY
        );
        for cmd in [
            libc::TIOCSTI as u64,
            libc::TIOCLINUX as u64,
            0xdead_0000_0000_0000 | libc::TIOCSTI as u64,
        ] {
            assert_eq!(
                sys(libc::SYS_ioctl, [0, cmd, 0, 0, 0, 0]),
                NOTIFY,
                "ioctl {cmd:#x}"
            );
        }
        assert_eq!(
            sys(libc::SYS_ioctl, [0, libc::TCGETS as u64, 0, 0, 0, 0]),
            ALLOW
        );
        for family in [libc::AF_PACKET, libc::AF_VSOCK, libc::AF_BLUETOOTH] {
            assert_eq!(
                sys(libc::SYS_socket, [family as u64, 1, 0, 0, 0, 0]),
                NOTIFY
            );
        }
        let raw = (libc::SOCK_RAW | libc::SOCK_CLOEXEC) as u64;
        assert_eq!(
            sys(libc::SYS_socket, [libc::AF_INET as u64, raw, 1, 0, 0, 0]),
            NOTIFY
        );
        assert_eq!(
            sys(libc::SYS_socket, [libc::AF_INET6 as u64, raw, 58, 0, 0, 0]),
            NOTIFY
        );
        let stream = libc::SOCK_STREAM as u64;
        assert_eq!(
            sys(libc::SYS_socket, [libc::AF_INET as u64, stream, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            sys(libc::SYS_socket, [libc::AF_UNIX as u64, stream, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(sys(libc::SYS_fchmod, [3, 0o4755, 0, 0, 0, 0]), NOTIFY);
        assert_eq!(sys(libc::SYS_fchmod, [3, 0o2755, 0, 0, 0, 0]), NOTIFY);
        assert_eq!(sys(libc::SYS_fchmod, [3, 0o755, 0, 0, 0, 0]), ALLOW);
        assert_eq!(sys(libc::SYS_fchmodat, [3, 0, 0o6755, 0, 0, 0]), NOTIFY);
        let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
        assert_eq!(sys(libc::SYS_openat, [3, 0, creat, 0o4755, 0, 0]), NOTIFY);
        assert_eq!(sys(libc::SYS_openat, [3, 0, creat, 0o644, 0, 0]), ALLOW);
        assert_eq!(sys(libc::SYS_openat, [3, 0, 0, 0o4755, 0, 0]), ALLOW); // no file created
        assert_eq!(
            sys(
                libc::SYS_openat,
                [3, 0, libc::O_TMPFILE as u64, 0o2755, 0, 0]
            ),
            NOTIFY
        );
    }
}
