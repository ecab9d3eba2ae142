//! The last steps before `execve`, taken by the sandboxed process on itself:
//! rlimits, dropping every capability, `no_new_privs`, Landlock.

use std::io;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    RestrictionStatus, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use moat_core::LayerStatus;

use crate::error::{Layer, SetupError};

/// One `setrlimit` to apply; the hard limit is never raised above the current one.
#[derive(Clone, Copy)]
pub(crate) struct Rlimit {
    pub(crate) resource: libc::__rlimit_resource_t,
    pub(crate) soft: u64,
    pub(crate) hard: u64,
}

pub(crate) fn apply_rlimits(limits: &[Rlimit]) -> Result<(), SetupError> {
    for limit in limits {
        let mut current = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: current is a valid rlimit to fill.
        crate::sys::cvt(unsafe { libc::getrlimit(limit.resource, &mut current) })
            .map_err(|e| SetupError::io(Layer::Rlimits, "getrlimit", e))?;
        let hard = limit.hard.min(current.rlim_max);
        let wanted = libc::rlimit {
            rlim_cur: limit.soft.min(hard),
            rlim_max: hard,
        };
        // SAFETY: wanted is a valid rlimit.
        crate::sys::cvt(unsafe { libc::setrlimit(limit.resource, &wanted) }).map_err(|e| {
            SetupError::io(Layer::Rlimits, format!("setrlimit {}", limit.resource), e)
        })?;
    }
    Ok(())
}

const SECURE_ALL_LOCKED: libc::c_ulong = 0xEF; // every SECBIT_* and its lock, but KEEP_CAPS itself
const CAP_V3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops every capability for good: securebits locked so that even uid 0 inside
/// the namespace regains nothing at `execve`, bounding and ambient sets
/// emptied, all sets cleared, and `no_new_privs` set.
pub(crate) fn drop_privileges() -> Result<(), SetupError> {
    let fail = |what: &str| SetupError::io(Layer::Privileges, what, io::Error::last_os_error());
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECURE_ALL_LOCKED) } != 0 {
        return Err(fail("locking securebits"));
    }
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap) } != 0 {
            if crate::sys::errno() == libc::EINVAL {
                break; // past the last capability this kernel knows
            }
            return Err(fail("dropping the bounding set"));
        }
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(fail("clearing ambient capabilities"));
    }
    let header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and data are the v3 layouts capset expects (two data words).
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(fail("clearing capabilities"));
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(fail("setting no_new_privs"));
    }
    Ok(())
}

/// Whether this process holds no capability at all (effective, permitted,
/// inheritable): what a helper checks after giving up its ids.
pub(crate) fn holds_no_capability() -> bool {
    let header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and data are the v3 layouts capget expects (two data words).
    let ret = unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) };
    ret == 0
        && data
            .iter()
            .all(|d| d.effective == 0 && d.permitted == 0 && d.inheritable == 0)
}

/// The Landlock rules of one run, as paths inside the sandbox.
pub(crate) struct LandlockPlan {
    /// Trees where everything is allowed (writable roots, `/tmp`).
    pub(crate) writable: Vec<PathBuf>,
    /// Trees that may be read and executed: `/`; or, when the root holds
    /// decoys (see `mounts::DECOYS`), every top-level entry of the root but
    /// the decoy home and the declared roots, `/` itself only listed.
    pub(crate) readable: Vec<PathBuf>,
    /// Ask the kernel to log this domain's denials after `execve` too
    /// (`LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`, ABI 7), for the launcher's
    /// evidence layer. Only set when the launcher listens.
    pub(crate) log_denials: bool,
    /// `danger-full-access`: the whole root is writable.
    pub(crate) everything_writable: bool,
    /// TCP `connect` and `bind` only to these ports (`None`: left to the
    /// network namespace).
    pub(crate) tcp: Option<TcpRules>,
    pub(crate) allow_degraded: bool,
}

/// The TCP ports a sandbox may connect to and bind, by network mode: the
/// proxy modes connect to the egress proxy's port and bind none;
/// `ingress-only` binds its exposed ports and connects to none.
#[derive(Debug, Clone, Default)]
pub(crate) struct TcpRules {
    pub(crate) connect: Vec<u16>,
    pub(crate) bind: Vec<u16>,
}

impl TcpRules {
    fn describe(&self) -> String {
        let ports = |what: &str, ports: &[u16]| match ports {
            [] => format!("no TCP {what}"),
            [one] => format!("TCP {what} only to port {one}"),
            many => format!(
                "TCP {what} only to ports {}",
                many.iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        format!(
            "{} and {} (ABI 4)",
            ports("connect", &self.connect),
            ports("bind", &self.bind)
        )
    }
}

/// The ABI this code asks for: filesystem rights up to V5, scopes from V6.
const FS_ABI: ABI = ABI::V5;

/// Landlock ABI the running kernel offers (0 = none).
pub(crate) fn kernel_abi() -> u32 {
    // SAFETY: the version query takes a null attribute pointer and size 0.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    u32::try_from(abi).unwrap_or(0)
}

/// Restricts this process. Returns a one-line description of what holds.
pub(crate) fn apply_landlock(plan: &LandlockPlan) -> Result<(LayerStatus, String), SetupError> {
    let fail = |e: &dyn std::fmt::Display| SetupError::new(Layer::Landlock, e.to_string());
    let level = if plan.allow_degraded {
        CompatLevel::BestEffort
    } else {
        CompatLevel::HardRequirement
    };
    let read = AccessFs::from_read(FS_ABI);
    let all = AccessFs::from_all(FS_ABI);
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    let mut ruleset = Ruleset::default()
        .set_compatibility(level)
        .handle_access(all)
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| match plan.tcp {
            Some(_) => r.handle_access(AccessNet::from_all(ABI::V4)),
            None => Ok(r),
        })
        .and_then(|r| r.create())
        .map_err(|e| fail(&e))?;
    if let Some(tcp) = &plan.tcp {
        let connect = tcp.connect.iter().map(|p| (*p, AccessNet::ConnectTcp));
        let bind = tcp.bind.iter().map(|p| (*p, AccessNet::BindTcp));
        for (port, access) in connect.chain(bind) {
            ruleset = ruleset
                .add_rule(NetPort::new(port, access))
                .map_err(|e| fail(&e))?;
        }
    }
    let mut rules: Vec<(PathBuf, landlock::BitFlags<AccessFs>)> = Vec::new();
    if plan.everything_writable {
        rules.push((PathBuf::from("/"), all));
    } else {
        // With decoys, not `/` whole: what is left out (the decoy home) is
        // refused, and each attempt on it is evidence.
        if !plan.readable.iter().any(|p| p == Path::new("/")) {
            rules.push((PathBuf::from("/"), AccessFs::ReadDir.into()));
        }
        rules.extend(plan.readable.iter().map(|p| (p.clone(), read)));
    }
    rules.extend(plan.writable.iter().map(|p| (p.clone(), all)));
    // /dev holds only the five device nodes and symlinks, in the read-only root.
    rules.push((PathBuf::from("/dev"), device));
    let file_rights = AccessFs::from_file(FS_ABI);
    for (path, access) in rules {
        // A top-level file (the host view's `/vmlinuz`) takes file rights
        // only; a dangling link is nothing to allow.
        let access = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => access,
            Ok(_) => access & file_rights,
            Err(_) => continue,
        };
        let fd = PathFd::new(&path).map_err(|e| fail(&e))?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| fail(&e))?;
    }
    if plan.log_denials {
        ruleset = ruleset.log_new_exec(true).map_err(|e| fail(&e))?;
    }
    let status: RestrictionStatus = ruleset.restrict_self().map_err(|e| fail(&e))?;
    let (layer, what) = match status.ruleset {
        RulesetStatus::FullyEnforced => (LayerStatus::Enforced, "fully enforced"),
        RulesetStatus::PartiallyEnforced => (
            LayerStatus::Degraded,
            "partially enforced (kernel ABI too old)",
        ),
        RulesetStatus::NotEnforced => (
            LayerStatus::NotEnforced,
            "not enforced (Landlock unavailable)",
        ),
    };
    if layer != LayerStatus::Enforced && !plan.allow_degraded {
        return Err(SetupError::new(Layer::Landlock, what));
    }
    let net = match &plan.tcp {
        Some(tcp) => format!(", {},", tcp.describe()),
        None => String::new(),
    };
    Ok((
        layer,
        format!(
            "filesystem rules (ABI {}){net} and signal/abstract-socket scoping {what}",
            FS_ABI as u32
        ),
    ))
}
