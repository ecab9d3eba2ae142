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

use std::collections::BTreeMap;

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
    socket => When::ArgIs(0, &[libc::AF_PACKET as u64]),
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

/// Syscalls answered with `ENOSYS` so that libc falls back to a call the deny
/// list can inspect (`clone3` and `openat2` pass their flags in memory).
const STEERED: &[(&str, i64)] = &[("clone3", libc::SYS_clone3), ("openat2", libc::SYS_openat2)];

const SENTINEL_ERRNO: u32 = 0x0bad;

/// Both compiled forms of the filter.
pub(crate) struct SeccompPrograms {
    pub(crate) notify: BpfProgram,
    pub(crate) errno: BpfProgram,
}

pub(crate) fn compile() -> Result<SeccompPrograms, SetupError> {
    let err = |e: seccompiler::BackendError| SetupError::new(Layer::Seccomp, e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for deny in DENY {
        let entry = rules.entry(deny.nr).or_default();
        entry.extend(rules_for(deny.when).map_err(err)?);
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
    let mut denied: Vec<u32> = DENY.iter().map(|d| d.nr as u32).collect();
    denied.sort_unstable();
    denied.dedup();
    let dispatch = dispatch_tree(&denied)?;
    let with_action = |deny_action: u32| {
        let mut program = prologue(deny_action);
        program.extend(dispatch.iter().cloned());
        program.extend(body.iter().map(|insn| {
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
    Body,
}

/// A balanced binary search over the listed syscall numbers: anything not on
/// the list is allowed after a handful of comparisons instead of walking the
/// whole rule chain. Besides the runtime saving, the kernel's per-syscall
/// "always allowed" cache is computed by emulating the filter for every
/// syscall number when it is installed, and a short path makes that cheap.
fn dispatch_tree(nrs: &[u32]) -> Result<BpfProgram, SetupError> {
    fn emit(nrs: &[u32], out: &mut Vec<(u16, u32, Target, Target)>) {
        if let [only] = nrs {
            out.push((BPF_JEQ_K, *only, Target::Body, Target::Allow));
            return;
        }
        let mid = nrs.len() / 2;
        let at = out.len();
        out.push((BPF_JGE_K, nrs[mid], Target::Next, Target::Next));
        emit(&nrs[..mid], out);
        out[at].2 = Target::At(out.len());
        emit(&nrs[mid..], out);
    }
    let mut nodes = Vec::new();
    if !nrs.is_empty() {
        emit(nrs, &mut nodes);
    }
    let allow = nodes.len();
    let body = allow + 1;
    let offset = |from: usize, target: &Target| -> Result<u8, SetupError> {
        let to = match target {
            Target::Next => from + 1,
            Target::At(i) => *i,
            Target::Allow => allow,
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
    Ok(program)
}

/// Names a syscall the filter refused, for events.
pub(crate) fn describe(arch: u32, nr: i32) -> String {
    if arch != AUDIT_ARCH {
        return format!("foreign-arch(0x{arch:x})#{nr}");
    }
    if cfg!(target_arch = "x86_64") && (nr as u32) & X32_SYSCALL_BIT != 0 {
        return format!("x32#{}", (nr as u32) & !X32_SYSCALL_BIT);
    }
    DENY.iter()
        .find(|d| d.nr == i64::from(nr))
        .map_or_else(|| format!("syscall#{nr}"), |d| d.name.to_owned())
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
mod tests {
    use super::*;

    #[test]
    fn both_programs_compile_and_start_with_the_arch_check() {
        let programs = compile().map_err(|e| e.to_string());
        let Ok(programs) = programs else {
            panic!("{programs:?}", programs = programs.err());
        };
        for program in [&programs.notify, &programs.errno] {
            assert_eq!(program[0].k, ARCH_OFFSET);
            assert_eq!(program[1].k, AUDIT_ARCH);
            assert!(program.len() < 4096);
        }
        let notifies = programs
            .notify
            .iter()
            .filter(|i| i.code == BPF_RET_K && i.k == libc::SECCOMP_RET_USER_NOTIF)
            .count();
        assert!(notifies > DENY.len() / 2, "{notifies}");
    }

    #[test]
    fn denials_are_named() {
        assert_eq!(describe(AUDIT_ARCH, libc::SYS_ptrace as i32), "ptrace");
        assert!(describe(0x4000_0003, 1).starts_with("foreign-arch"));
    }
}
