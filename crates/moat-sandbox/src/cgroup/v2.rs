//! Cgroup v2: one directory in the unified hierarchy.
//!
//! `memory` and `pids` (and `cpu` when a CPU limit is asked for) must be
//! delegated: see [`delegation`] for where the run's cgroup then goes. Moat
//! enables them on its own `moat` directory; the one cgroup it did not create
//! and may change is the launcher's own, when that is delegated to its user
//! and holds nothing but moat (see [`take_over`]).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use moat_core::Limits;

use super::delegation::{self, Base};
use super::{CgroupError, CgroupStats, RunCgroup};

pub(crate) struct Cgroup {
    dir: PathBuf,
    /// The open directory, when init is to be cloned into it.
    clone_target: Option<OwnedFd>,
    /// init was cloned into it: nothing to move.
    init_inside: bool,
    /// Where moat moved itself to take over its own delegated cgroup.
    took_over: Option<PathBuf>,
    /// The run directory, open and locked while the run lives.
    _lock: Option<OwnedFd>,
    /// Directories of killed launchers removed before this one was made.
    swept: usize,
}

impl Cgroup {
    pub(crate) fn create(
        own: &str,
        mountinfo: &str,
        run_id: &str,
        limits: &Limits,
        for_clone: bool,
        ours: &[libc::pid_t],
    ) -> Result<Self, CgroupError> {
        let mounts = super::cgroup_mounts(mountinfo);
        let (_, _, mount_point) = mounts
            .iter()
            .find(|(fstype, _, _)| *fstype == "cgroup2")
            .ok_or_else(|| CgroupError("no cgroup2 hierarchy mounted".into()))?;
        let own_path = super::own_path(own, "")
            .ok_or_else(|| CgroupError("this process has no cgroup2 path".into()))?;
        let own = super::join(mount_point, own_path);
        let mut wanted = vec!["memory", "pids"];
        if limits.cpu_millis.is_some() {
            wanted.push("cpu");
        }
        let delegates = |dir: &std::path::Path| {
            let enabled =
                super::read_small(&dir.join("cgroup.subtree_control")).unwrap_or_default();
            wanted
                .iter()
                .all(|c| enabled.split_whitespace().any(|e| e == *c))
        };
        let base = delegation::choose(
            &delegation::HostTree,
            Path::new(mount_point),
            &own,
            &wanted,
            ours,
        )
        .map_err(CgroupError)?;
        let (base, took_over) = match base {
            Base::Delegating(dir) => (dir, None),
            Base::Delegated { dir, movable } => {
                let supervisor = take_over(&dir, &movable, &wanted)
                    .map_err(|e| CgroupError(format!("taking over {}: {e}", dir.display())))?;
                (dir, Some(supervisor))
            }
        };
        let moat = base.join("moat");
        let mut cgroup = Cgroup {
            dir: moat.join(run_id),
            clone_target: None,
            init_inside: false,
            took_over,
            _lock: None,
            swept: super::sweep(&moat),
        };
        let made = (|| {
            super::make_dir(&moat)?;
            // Written only when missing: each write takes the cgroup lock.
            if !delegates(&moat) {
                let enable: Vec<String> = wanted.iter().map(|c| format!("+{c}")).collect();
                super::write(&moat.join("cgroup.subtree_control"), &enable.join(" "))?;
            }
            cgroup._lock = Some(super::make_run_dir(&cgroup.dir)?);
            super::write(
                &cgroup.dir.join("memory.max"),
                &limits.memory_bytes.to_string(),
            )?;
            super::write(&cgroup.dir.join("memory.swap.max"), "0").or_else(|e| {
                // No swap controller (swap accounting off): there is no swap to limit.
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
            super::write(&cgroup.dir.join("pids.max"), &limits.pids.to_string())?;
            if let Some(millis) = limits.cpu_millis {
                super::write(
                    &cgroup.dir.join("cpu.max"),
                    &format!("{} 100000", millis * 100),
                )?;
            }
            if for_clone {
                let dir = std::fs::File::open(&cgroup.dir).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("{}: {e}", cgroup.dir.display()))
                })?;
                cgroup.clone_target = Some(OwnedFd::from(dir));
            }
            Ok::<(), std::io::Error>(())
        })();
        if let Err(e) = made {
            let _ = cgroup.remove();
            return Err(CgroupError(e.to_string()));
        }
        Ok(cgroup)
    }
}

impl RunCgroup for Cgroup {
    fn admit(&self, init: libc::pid_t) -> std::io::Result<Vec<OwnedFd>> {
        if !self.init_inside {
            super::write(&self.dir.join("cgroup.procs"), &init.to_string())?;
        }
        Ok(Vec::new())
    }

    fn clone_target(&self) -> Option<RawFd> {
        self.clone_target.as_ref().map(AsRawFd::as_raw_fd)
    }

    fn after_clone(&mut self, cloned_into: bool) {
        self.init_inside = cloned_into && self.clone_target.is_some();
        self.clone_target = None;
    }

    fn stats(&self) -> CgroupStats {
        CgroupStats {
            cpu_ns: super::read_keyed(&self.dir.join("cpu.stat"), "usage_usec").map(|us| us * 1000),
            peak_memory_bytes: super::read_u64(&self.dir.join("memory.peak")),
            oom_kills: super::read_keyed(&self.dir.join("memory.events"), "oom_kill").unwrap_or(0),
            pids_limit_hits: super::read_keyed(&self.dir.join("pids.events"), "max").unwrap_or(0),
            peak_pids: super::read_u64(&self.dir.join("pids.peak")),
        }
    }

    fn remove(&self) -> std::io::Result<()> {
        // Anything still inside (there should be nothing: the pid namespace is
        // gone) is killed first so the directory can go.
        let _ = super::write(&self.dir.join("cgroup.kill"), "1");
        super::remove_dir(&self.dir)
    }

    fn describe(&self) -> String {
        let swept = super::swept_note(self.swept);
        match &self.took_over {
            None => format!("cgroup v2 at {}{swept}", self.dir.display()),
            Some(supervisor) => format!(
                "cgroup v2 at {} (the launcher's own delegated cgroup; moat moved itself to {}){swept}",
                self.dir.display(),
                supervisor.display()
            ),
        }
    }
}

/// Empties the launcher's own delegated cgroup `dir` of moat's processes
/// (into `dir/moat/supervisor`) and has it enable `wanted` for its children:
/// cgroup v2 allows that only in a cgroup without processes of its own. On
/// failure the processes go back where they were. Returns the supervisor
/// cgroup.
/// For a process that launches sandboxes through children of its own (a
/// runner): while it is the only process in its delegated cgroup, it takes
/// that cgroup over now (moves to `supervisor`, enables the controllers),
/// so that the launches its children make later find a delegating parent,
/// as under systemd's `DelegateSubgroup=supervisor` (which systemd 252
/// lacks). `None`: nothing to take over (it already sits below a
/// delegating cgroup, or its cgroup is not delegated to it); the reason is
/// then for the log, and each launch reports what it finds.
pub(crate) fn settle(
    own: &str,
    mountinfo: &str,
    me: libc::pid_t,
) -> Result<Result<PathBuf, String>, CgroupError> {
    let mounts = super::cgroup_mounts(mountinfo);
    let Some((_, _, mount_point)) = mounts.iter().find(|(fstype, _, _)| *fstype == "cgroup2")
    else {
        return Ok(Err("no cgroup2 hierarchy mounted".into()));
    };
    let Some(own_path) = super::own_path(own, "") else {
        return Ok(Err("this process has no cgroup2 path".into()));
    };
    let own = super::join(mount_point, own_path);
    let available = super::read_small(&own.join("cgroup.controllers")).unwrap_or_default();
    let mut wanted = vec!["memory", "pids"];
    if available.split_whitespace().any(|c| c == "cpu") {
        wanted.push("cpu");
    }
    let base = match delegation::choose(
        &delegation::HostTree,
        Path::new(mount_point),
        &own,
        &wanted,
        &[me],
    ) {
        Ok(base) => base,
        Err(why) => return Ok(Err(why)),
    };
    match base {
        Base::Delegating(dir) => Ok(Err(format!(
            "{} already delegates to the runs' cgroups",
            dir.display()
        ))),
        Base::Delegated { dir, movable } => settle_as_leaf(&dir, &movable, &wanted)
            .map(Ok)
            .map_err(|e| CgroupError(format!("taking over {}: {e}", dir.display()))),
    }
}

/// Moves `movable` to `dir/supervisor` and has `dir` hand `wanted` to its
/// children: the layout systemd's `DelegateSubgroup=supervisor` makes, in
/// which each launch from the supervisor finds `dir` delegating and puts
/// its run in `dir/moat/<run>`.
fn settle_as_leaf(dir: &Path, movable: &[String], wanted: &[&str]) -> std::io::Result<PathBuf> {
    move_out(dir, dir.join(delegation::SUPERVISOR), movable, wanted)
}

/// A launcher's take-over of its own cgroup: the same, into `dir/moat/supervisor`.
fn take_over(dir: &Path, movable: &[String], wanted: &[&str]) -> std::io::Result<PathBuf> {
    super::make_dir(&dir.join("moat"))?;
    move_out(
        dir,
        dir.join("moat").join(delegation::SUPERVISOR),
        movable,
        wanted,
    )
}

/// Moves `movable` out of `dir` into `supervisor`, then enables `wanted`
/// for `dir`'s children. On failure the processes move back.
fn move_out(
    dir: &Path,
    supervisor: PathBuf,
    movable: &[String],
    wanted: &[&str],
) -> std::io::Result<PathBuf> {
    super::make_dir(&supervisor)?;
    let moved = (|| {
        for pid in movable {
            super::write(&supervisor.join("cgroup.procs"), pid)?;
        }
        let enable: Vec<String> = wanted.iter().map(|c| format!("+{c}")).collect();
        super::write(&dir.join("cgroup.subtree_control"), &enable.join(" "))
    })();
    if let Err(e) = moved {
        for pid in movable {
            let _ = super::write(&dir.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&supervisor);
        return Err(e);
    }
    Ok(supervisor)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a plain directory standing in for the unit's cgroup: what is
    /// written where. (That a launch from `supervisor` then finds the unit
    /// delegating is `delegation`'s `a_leaf_of_a_delegating_unit_runs_beside_itself`.)
    #[test]
    fn a_settled_runner_sits_in_a_leaf_beside_its_runs() {
        let root = tempfile::tempdir().unwrap();
        let unit = root.path().join("moat-runner.service");
        std::fs::create_dir(&unit).unwrap();
        let leaf = settle_as_leaf(&unit, &["10".into()], &["memory", "pids", "cpu"]).unwrap();
        assert_eq!(leaf, unit.join("supervisor"));
        assert_eq!(
            std::fs::read_to_string(leaf.join("cgroup.procs")).unwrap(),
            "10"
        );
        assert_eq!(
            std::fs::read_to_string(unit.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids +cpu"
        );
    }
}
