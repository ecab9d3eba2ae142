//! Who the sandboxed program is: its ids inside its user namespace and on
//! the host, and the maps that tie the two.

use std::path::{Path, PathBuf};

use moat_core::LayerReport;

use super::Lease;
use crate::error::{Layer, SetupError};
use crate::spec::SandboxSpec;

/// Which ids the program has inside and on the host.
pub(crate) struct Identity {
    pub(crate) inside: (u32, u32),
    pub(crate) host: (u32, u32),
    pub(crate) launched_by_root: bool,
    /// The host id held for this run. Declared in `launch` before the
    /// `ChildGuard`, so it is dropped (and the id freed) only after init
    /// was reaped, which ends every process of the run's pid namespace.
    _lease: Option<Lease>,
    pub(crate) report: LayerReport,
}

/// Launched by root, the program runs as a host uid/gid of its own (see
/// [`crate::hostid`]) and acts, inside, as the owner of its first declared
/// root (writable first), whose files the idmapped mounts show as its own.
/// Launched by anyone else, it keeps that user's ids.
pub(crate) fn identity(
    spec: &SandboxSpec,
    root_owner: Option<(u32, u32)>,
) -> Result<Identity, SetupError> {
    // SAFETY: plain id queries.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if euid != 0 {
        return Ok(Identity {
            inside: (euid, egid),
            host: (euid, egid),
            launched_by_root: false,
            _lease: None,
            report: LayerReport::not_enforced(format!(
                "launched by uid {euid}, not root: the program runs as uid {euid} / gid {egid}, \
                 like that user's other runs and processes, so runs are not separated by host \
                 identity (a root launcher gives each run ids of its own)"
            )),
        });
    }
    let refuse = |what: String| SetupError::new(Layer::UserMapping, what);
    let range = super::subid::block(spec.id_range)
        .map_err(|e| refuse(format!("no block of host ids for sandboxes: {e}")))?;
    let source = match spec.id_range {
        Some(_) => "--uid-range",
        None => "the moat-sandboxes entries of /etc/subuid and /etc/subgid",
    };
    // Root of a container's user namespace can only hand out ids its own
    // map holds.
    for map in ["/proc/self/uid_map", "/proc/self/gid_map"] {
        let mapped = super::mapped_here(Path::new(map), range.base, range.last())
            .map_err(|e| refuse(format!("{map}: {e}")))?;
        if !mapped {
            return Err(refuse(format!(
                "this launcher is root of a user namespace whose {map} does not hold the block \
                 {range}: give --uid-range with ids mapped here"
            )));
        }
    }
    let lease = Lease::take(range, &spec.run_id).map_err(|e| refuse(e.to_string()))?;
    let id = lease.id();
    Ok(Identity {
        inside: root_owner.unwrap_or((0, 0)),
        host: (id, id),
        launched_by_root: true,
        report: LayerReport::enforced(format!(
            "host uid and gid {id}, held by this run alone until its last process ended \
             (block {range}, from {source})"
        )),
        _lease: Some(lease),
    })
}

pub(crate) fn write_id_maps(pid: libc::pid_t, id: &Identity) -> Result<(), SetupError> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let write = |file: &str, text: String| {
        std::fs::write(proc.join(file), text)
            .map_err(|e| SetupError::io(Layer::UserMapping, format!("writing {file}"), e))
    };
    if !id.launched_by_root {
        write("setgroups", "deny".into())?;
    }
    write("uid_map", format!("{} {} 1\n", id.inside.0, id.host.0))?;
    write("gid_map", format!("{} {} 1\n", id.inside.1, id.host.1))
}
