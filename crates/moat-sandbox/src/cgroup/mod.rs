//! Cgroup limits for one run: v2 first, v1 as the fallback (hybrid hosts).
//!
//! Each run gets `<the launcher's own cgroup or its parent>/moat/<run id>`
//! (where exactly on v2: see [`delegation`]), created before the program
//! starts and removed after it ends; the `moat` directory itself is created
//! once and left, empty, for the next run. Existing cgroups are only read, but
//! for the launcher's own when it is delegated to its user (see
//! [`delegation`]). Without any, the run falls back to rlimit floors (see
//! [`report`]).
//!
//! How init gets in matters for speed: writing a pid to `cgroup.procs`
//! write-locks the kernel's global `cgroup_threadgroup_rwsem`, and the first
//! writer after a quiet spell waits for an RCU grace period (about 10 ms on
//! the build machines), on every lone `moat exec`. So on a host whose
//! `/sys/fs/cgroup` is the unified hierarchy the cgroup is made before the
//! clone and init is cloned straight into it (`CLONE_INTO_CGROUP`); on a
//! hybrid or v1 host it is made after the clone, beside init's own setup, and
//! init moves itself in through v1 `tasks` files (see [`enter`]).

mod delegation;
pub(crate) mod report;
mod v1;
mod v2;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use moat_core::Limits;

/// What one run's cgroup measured.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CgroupStats {
    pub(crate) cpu_ns: Option<u64>,
    pub(crate) peak_memory_bytes: Option<u64>,
    pub(crate) oom_kills: u64,
    /// Times a fork was refused because `pids.max` was reached.
    pub(crate) pids_limit_hits: u64,
    /// Most processes and threads alive at once (`pids.peak`, where the
    /// kernel keeps it: 6.1 and later on v2, and on recent kernels' v1).
    pub(crate) peak_pids: Option<u64>,
}

/// A created cgroup (v1: one directory per controller; v2: one directory).
pub(crate) trait RunCgroup {
    /// Lets `init`, the sandbox's single-threaded pid 1, into the cgroup:
    /// either puts it there now, or returns files init writes `0` to, each
    /// moving init itself (see [`enter`]). Nothing to do when init was cloned
    /// into it.
    fn admit(&self, init: libc::pid_t) -> io::Result<Vec<OwnedFd>>;
    /// The directory to clone init into, for a cgroup made before the clone
    /// (v2 only).
    fn clone_target(&self) -> Option<RawFd> {
        None
    }
    /// Told once the clone is done, and whether init was cloned into the
    /// cgroup (Linux before 5.7 has no `CLONE_INTO_CGROUP`: then [`admit`]
    /// moves it). The directory is closed.
    ///
    /// [`admit`]: RunCgroup::admit
    fn after_clone(&mut self, _cloned_into: bool) {}
    fn stats(&self) -> CgroupStats;
    /// Removes the run's directories. The shared, empty `moat` parent stays:
    /// removing it would race with a concurrent run creating its own.
    fn remove(&self) -> io::Result<()>;
    /// Where it lives, for the report.
    fn describe(&self) -> String;
}

/// Why no cgroup could be made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct CgroupError(pub(crate) String);

/// Whether the run's cgroup is made before the clone: only where
/// `/sys/fs/cgroup` itself is a cgroup2 mount, so that a hybrid host (which
/// ends up on v1) pays nothing on the clone's critical path to find out.
pub(crate) fn made_before_clone() -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    // SAFETY: statfs is plain old data (zero is valid); the path is a valid C string.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the kernel writes into `fs`, which outlives the call.
    let ok = unsafe { libc::statfs(c"/sys/fs/cgroup".as_ptr(), &mut fs) } == 0;
    #[allow(clippy::unnecessary_cast)] // the field's type differs between libcs
    let magic = fs.f_type as i64;
    ok && magic == CGROUP2_SUPER_MAGIC
}

/// Creates the run's cgroup, before the clone, on a unified host (see
/// [`made_before_clone`]); init is then cloned into it.
pub(crate) fn create_for_clone(
    run_id: &str,
    limits: &Limits,
) -> Result<Box<dyn RunCgroup>, CgroupError> {
    let (own, mountinfo) = own_cgroups_and_mounts()?;
    // SAFETY: getpid has no preconditions.
    let ours = [unsafe { libc::getpid() }];
    match v2::Cgroup::create(&own, &mountinfo, run_id, limits, true, &ours) {
        Ok(cgroup) => Ok(Box::new(cgroup)),
        Err(e) => Err(CgroupError(format!("v2: {}", e.0))),
    }
}

/// Creates the run's cgroup with `limits` applied, after `init` was cloned.
pub(crate) fn create(
    run_id: &str,
    limits: &Limits,
    init: libc::pid_t,
) -> Result<Box<dyn RunCgroup>, CgroupError> {
    let (own, mountinfo) = own_cgroups_and_mounts()?;
    // SAFETY: getpid has no preconditions.
    let ours = [unsafe { libc::getpid() }, init];
    let v2_reason = match v2::Cgroup::create(&own, &mountinfo, run_id, limits, false, &ours) {
        Ok(cgroup) => return Ok(Box::new(cgroup)),
        Err(e) => e.0,
    };
    match v1::Cgroup::create(&own, &mountinfo, run_id, limits) {
        Ok(cgroup) => Ok(Box::new(cgroup)),
        Err(e) => Err(CgroupError(format!("v2: {v2_reason}; v1: {}", e.0))),
    }
}

/// A long-lived launcher of sandboxes through its children (a runner)
/// takes over its own delegated cgroup v2 while it is alone there (see
/// `v2::settle`): `Ok(Ok(supervisor))` where it moved to, `Ok(Err(why))`
/// when there was nothing to take over, `Err` when taking over failed (it
/// was then moved back).
pub fn settle_in_own_cgroup() -> Result<Result<PathBuf, String>, String> {
    let (own, mountinfo) = own_cgroups_and_mounts().map_err(|e| e.0)?;
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    v2::settle(&own, &mountinfo, me).map_err(|e| e.0)
}

/// Removes what is left of the run cgroups named `names` that this
/// process's launches (or its children's) made: under `moat` beside its own
/// cgroup, its parent or grandparent (a runner that took over its delegated
/// cgroup lives in `<it>/moat/supervisor`), per hierarchy. A directory a
/// live launcher holds is left. Returns the directories still there.
pub fn remove_run_cgroups(names: &[String]) -> Result<Vec<PathBuf>, String> {
    // A run that started no sandbox names none: nothing to look for, and
    // the host's mount table (long on a v1 host) need not be read for it.
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let (own, mountinfo) = own_cgroups_and_mounts().map_err(|e| e.0)?;
    let mut left = Vec::new();
    for (fstype, options, mount_point) in cgroup_mounts(&mountinfo) {
        let controller = if fstype == "cgroup2" {
            ""
        } else {
            match ["memory", "pids", "cpu", "cpuacct"]
                .into_iter()
                .find(|c| options.split(',').any(|o| o == *c))
            {
                Some(c) => c,
                None => continue,
            }
        };
        let Some(path) = own_path(&own, controller) else {
            continue;
        };
        let base = join(mount_point, path);
        let mut bases: Vec<&Path> = base.ancestors().take(3).collect();
        bases.retain(|b| b.starts_with(mount_point));
        for name in names {
            for dir in bases.iter().map(|b| b.join("moat").join(name)) {
                if !dir.exists() {
                    continue;
                }
                if !remove_orphan(&dir, remove_dir) {
                    left.push(dir);
                }
            }
        }
    }
    Ok(left)
}

/// This process's `/proc/self/cgroup` and `/proc/self/mountinfo`.
fn own_cgroups_and_mounts() -> Result<(String, String), CgroupError> {
    let read = |path: &str| {
        read_small(Path::new(path)).map_err(|e| CgroupError(format!("reading {path}: {e}")))
    };
    Ok((read("/proc/self/cgroup")?, read("/proc/self/mountinfo")?))
}

/// In init: moves init into the run's cgroup through the files
/// [`RunCgroup::admit`] returned. Writing `0` to a v1 `tasks` file moves the
/// calling thread only, which is all of init, and the kernel then skips the
/// global lock that writing a pid to `cgroup.procs` takes for writing
/// (`cgroup_threadgroup_rwsem`). The first writer of that lock after a quiet
/// spell waits for an RCU grace period: about 10 ms here, more than the
/// whole launch, on every `moat exec` that follows a pause.
pub(crate) fn enter(files: &[OwnedFd]) -> io::Result<()> {
    for file in files {
        // SAFETY: a write of one byte from a static buffer to a descriptor we hold.
        let n = unsafe { libc::write(file.as_raw_fd(), b"0".as_ptr().cast(), 1) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n != 1 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the cgroup took no move",
            ));
        }
    }
    Ok(())
}

/// Mount points of cgroup filesystems: `(fstype, super options, mount point)`.
fn cgroup_mounts(mountinfo: &str) -> Vec<(&str, &str, &str)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let options = right.nth(1)?;
            fstype
                .starts_with("cgroup")
                .then_some((fstype, options, mount_point))
        })
        .collect()
}

/// The cgroup path of this process for a v1 controller, or for v2 (`""`).
fn own_path<'a>(own: &'a str, controller: &str) -> Option<&'a str> {
    own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        let matches = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then_some(path)
    })
}

fn join(base: &str, path: &str) -> PathBuf {
    Path::new(base).join(path.trim_start_matches('/'))
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn read_u64(path: &Path) -> Option<u64> {
    read_small(path).ok()?.trim().parse().ok()
}

/// Reads a procfs or cgroupfs file whole. Such files report a size of 0, so
/// `fs::read_to_string` would `stat` them and then read in growing steps from
/// 32 bytes; these are read in one or two calls, on every launch.
pub(crate) fn read_small(path: &Path) -> io::Result<String> {
    let mut content = Vec::with_capacity(16 << 10);
    io::Read::read_to_end(&mut std::fs::File::open(path)?, &mut content)?;
    String::from_utf8(content).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// `key value` lines (memory.events, memory.oom_control, cpu.stat).
fn read_keyed(path: &Path, key: &str) -> Option<u64> {
    read_small(path).ok()?.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Creates a run's own directory: it must not exist yet (two runs with one id
/// would otherwise share, and one would kill the other's processes). The
/// directory is returned open and `flock`ed: the lock lives exactly as long
/// as the launcher (and its sandbox's init), so [`sweep`] can tell the
/// directory of a killed launcher from a live run's.
fn make_run_dir(path: &Path) -> io::Result<OwnedFd> {
    let fail = |e: io::Error| io::Error::new(e.kind(), format!("creating {}: {e}", path.display()));
    std::fs::create_dir(path).map_err(fail)?;
    let dir = std::fs::File::open(path).map_err(fail)?;
    if !crate::process::try_lock(&dir).map_err(fail)? {
        return Err(fail(io::Error::from(io::ErrorKind::WouldBlock)));
    }
    Ok(OwnedFd::from(dir))
}

/// A run directory younger than this is never swept: its launcher may be
/// between `mkdir` and `flock`.
const SWEEP_MIN_AGE: Duration = Duration::from_secs(2);

/// Removes the run directories under `moat` whose launcher is gone: a
/// `moat exec` killed with SIGKILL cannot remove its own (its sandbox dies
/// with it, `PR_SET_PDEATHSIG`, and leaves the directory empty). A live
/// run's directory is locked (see [`make_run_dir`]); a populated one cannot
/// be removed anyway. Returns how many were removed.
fn sweep(moat: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(moat) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        // A runner that took over its delegated cgroup lives here.
        if entry.file_name() == delegation::SUPERVISOR {
            continue;
        }
        let path = entry.path();
        let old_enough = entry
            .metadata()
            .ok()
            .filter(std::fs::Metadata::is_dir)
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= SWEEP_MIN_AGE);
        if !old_enough {
            continue;
        }
        // No retry on a busy directory: this is every launch's path.
        if remove_orphan(&path, |p| std::fs::remove_dir(p)) {
            removed += 1;
        }
    }
    removed
}

/// Removes the run directory `path` with `remove` if no launcher holds its
/// lock (see [`make_run_dir`]), holding the lock meanwhile.
fn remove_orphan(path: &Path, remove: impl Fn(&Path) -> io::Result<()>) -> bool {
    let Ok(dir) = std::fs::File::open(path) else {
        return false;
    };
    crate::process::try_lock(&dir).unwrap_or(false) && remove(path).is_ok()
}

/// How a cgroup layer's report mentions what [`sweep`] removed.
fn swept_note(swept: usize) -> String {
    match swept {
        0 => String::new(),
        n => format!("; removed {n} run cgroup(s) left by launchers that were killed"),
    }
}

fn make_dir(path: &Path) -> io::Result<()> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(io::Error::new(
            e.kind(),
            format!("creating {}: {e}", path.display()),
        )),
        _ => Ok(()),
    }
}

/// `rmdir` with a short retry: a pids cgroup stays busy for a moment while
/// exiting children drain.
fn remove_dir(path: &Path) -> io::Result<()> {
    let mut delay = Duration::from_micros(200);
    for _ in 0..12 {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(delay);
                delay = delay.saturating_mul(2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
    std::fs::remove_dir(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_own_paths_per_controller() {
        let own = "9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n0::/\n";
        assert_eq!(own_path(own, "memory"), Some("/process_api/abc"));
        assert_eq!(own_path(own, "cpuacct"), Some("/x"));
        assert_eq!(own_path(own, ""), Some("/"));
        assert_eq!(own_path(own, "pids"), None);
    }

    /// The mechanism `create_for_clone` relies on, tried on whatever cgroup2
    /// hierarchy the host has (on the hybrid build machines, the one at
    /// /sys/fs/cgroup/unified, which has no controllers: enough to show the
    /// child starts in the directory, with the sandbox's namespace flags).
    #[test]
    fn clone3_starts_init_in_a_v2_cgroup() {
        let own = read_small(Path::new("/proc/self/cgroup")).unwrap();
        let mountinfo = read_small(Path::new("/proc/self/mountinfo")).unwrap();
        let (_, _, mount) = cgroup_mounts(&mountinfo)
            .into_iter()
            .find(|(fstype, _, _)| *fstype == "cgroup2")
            .expect("this test needs a cgroup2 hierarchy");
        let own = own_path(&own, "").expect("a cgroup2 path");
        let moat = join(mount, own).join("moat");
        make_dir(&moat).unwrap();
        let name = format!("clone-test-{}", std::process::id());
        let dir = moat.join(&name);
        make_run_dir(&dir).unwrap();
        let target = std::fs::File::open(&dir).unwrap();
        let (wait_read, wait_write) = crate::sys::pipe().unwrap();
        let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;
        let forked = crate::sys::clone3(flags as u64, Some(target.as_raw_fd()));
        let pid = match forked {
            Ok(crate::sys::Forked::Child) => {
                // Waits for the parent to look, then leaves (async-signal-safe only:
                // the test harness has other threads).
                // SAFETY: this copy's write end, so the parent's close ends the read.
                unsafe { libc::close(wait_write.as_raw_fd()) };
                let _ = crate::sys::read(wait_read.as_raw_fd(), &mut [0u8; 1]);
                // SAFETY: _exit ends this copy of the test process at once.
                unsafe { libc::_exit(0) }
            }
            Ok(crate::sys::Forked::Parent { pid, .. }) => pid,
            Err(e) => {
                let _ = remove_dir(&dir);
                panic!("clone3 into {}: {e}", dir.display());
            }
        };
        let seen = read_small(Path::new(&format!("/proc/{pid}/cgroup"))).unwrap();
        drop((wait_read, wait_write));
        let mut status = 0;
        // SAFETY: reaping our own child; status is a valid int.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        remove_dir(&dir).unwrap();
        let v2 = own_path(&seen, "").unwrap();
        assert!(v2.ends_with(&format!("/moat/{name}")), "{seen}");
    }

    #[test]
    fn the_cgroup_is_made_before_the_clone_only_on_a_unified_host() {
        let mountinfo = read_small(Path::new("/proc/self/mountinfo")).unwrap();
        let unified = cgroup_mounts(&mountinfo)
            .iter()
            .any(|(fstype, _, mount)| *fstype == "cgroup2" && *mount == "/sys/fs/cgroup");
        assert_eq!(made_before_clone(), unified);
    }

    #[test]
    fn lists_cgroup_mounts() {
        let info = "35 24 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n\
                    30 24 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    22 1 0:21 / /proc rw - proc proc rw\n";
        let mounts = cgroup_mounts(info);
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0], ("cgroup", "rw,memory", "/sys/fs/cgroup/memory"));
    }
}
