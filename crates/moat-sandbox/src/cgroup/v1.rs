//! Cgroup v1: one directory per controller hierarchy.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use moat_core::Limits;

use super::{CgroupError, CgroupStats, RunCgroup};

pub(crate) struct Cgroup {
    memory: PathBuf,
    pids: PathBuf,
    cpu: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
    /// The run directories, open and locked while the run lives.
    _locks: Vec<OwnedFd>,
    /// Directories of killed launchers removed before this one was made.
    swept: usize,
}

impl Cgroup {
    pub(crate) fn create(
        own: &str,
        mountinfo: &str,
        run_id: &str,
        limits: &Limits,
    ) -> Result<Self, CgroupError> {
        let mounts = super::cgroup_mounts(mountinfo);
        let run_dir = |controller: &str| -> Option<PathBuf> {
            let (_, _, mount_point) = mounts.iter().find(|(fstype, options, _)| {
                *fstype == "cgroup" && options.split(',').any(|o| o == controller)
            })?;
            let own_path = super::own_path(own, controller)?;
            Some(super::join(mount_point, own_path).join("moat").join(run_id))
        };
        let missing = |c: &str| CgroupError(format!("no v1 {c} controller mounted"));
        let mut cgroup = Cgroup {
            memory: run_dir("memory").ok_or_else(|| missing("memory"))?,
            pids: run_dir("pids").ok_or_else(|| missing("pids"))?,
            // The CPU hierarchies cost a directory each per run: only with a CPU limit.
            cpu: limits.cpu_millis.and(run_dir("cpu")),
            cpuacct: limits.cpu_millis.and(run_dir("cpuacct")),
            _locks: Vec::new(),
            swept: 0,
        };
        if limits.cpu_millis.is_some() && cgroup.cpu.is_none() {
            return Err(missing("cpu"));
        }
        let mut parents: Vec<PathBuf> = ["memory", "pids", "cpu", "cpuacct"]
            .into_iter()
            .filter_map(|c| run_dir(c)?.parent().map(Path::to_path_buf))
            .collect();
        parents.dedup();
        cgroup.swept = parents.iter().map(|moat| super::sweep(moat)).sum();
        match cgroup.make(limits) {
            Ok(locks) => cgroup._locks = locks,
            Err(e) => {
                let _ = cgroup.remove();
                return Err(CgroupError(e.to_string()));
            }
        }
        Ok(cgroup)
    }

    fn dirs(&self) -> Vec<&Path> {
        let mut dirs = vec![self.memory.as_path(), self.pids.as_path()];
        for dir in [&self.cpu, &self.cpuacct].into_iter().flatten() {
            if !dirs.contains(&dir.as_path()) {
                dirs.push(dir);
            }
        }
        dirs
    }

    fn make(&self, limits: &Limits) -> std::io::Result<Vec<OwnedFd>> {
        let mut locks = Vec::new();
        for dir in self.dirs() {
            if let Some(parent) = dir.parent() {
                super::make_dir(parent)?;
            }
            locks.push(super::make_run_dir(dir)?);
        }
        super::write(
            &self.memory.join("memory.limit_in_bytes"),
            &limits.memory_bytes.to_string(),
        )?;
        // Without this, swap would let the tree exceed its memory limit. The file
        // exists only with swap accounting; without it there is no swap to limit.
        let memsw = self.memory.join("memory.memsw.limit_in_bytes");
        match super::write(&memsw, &limits.memory_bytes.to_string()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        super::write(&self.pids.join("pids.max"), &limits.pids.to_string())?;
        if let (Some(millis), Some(cpu)) = (limits.cpu_millis, &self.cpu) {
            super::write(&cpu.join("cpu.cfs_period_us"), "100000")?;
            super::write(&cpu.join("cpu.cfs_quota_us"), &(millis * 100).to_string())?;
        }
        Ok(locks)
    }
}

impl RunCgroup for Cgroup {
    /// init moves itself, through `tasks` (see [`super::enter`]); opened
    /// here, so the kernel checks the launcher's right to move it.
    fn admit(&self, _init: libc::pid_t) -> std::io::Result<Vec<OwnedFd>> {
        self.dirs()
            .into_iter()
            .map(|dir| {
                let tasks = dir.join("tasks");
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&tasks)
                    .map(OwnedFd::from)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", tasks.display())))
            })
            .collect()
    }

    fn stats(&self) -> CgroupStats {
        CgroupStats {
            cpu_ns: self
                .cpuacct
                .as_ref()
                .and_then(|d| super::read_u64(&d.join("cpuacct.usage"))),
            peak_memory_bytes: super::read_u64(&self.memory.join("memory.max_usage_in_bytes")),
            oom_kills: super::read_keyed(&self.memory.join("memory.oom_control"), "oom_kill")
                .unwrap_or(0),
            pids_limit_hits: super::read_keyed(&self.pids.join("pids.events"), "max").unwrap_or(0),
            peak_pids: super::read_u64(&self.pids.join("pids.peak")),
        }
    }

    fn remove(&self) -> std::io::Result<()> {
        let mut first_error = None;
        for dir in self.dirs() {
            if let Err(e) = super::remove_dir(dir) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn describe(&self) -> String {
        format!(
            "cgroup v1 at {}{}",
            self.memory.display(),
            super::swept_note(self.swept)
        )
    }
}
