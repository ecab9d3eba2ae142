//! Where in the unified (v2) hierarchy a run's cgroup can go.
//!
//! Two layouts give a user real limits without root:
//!
//! * a cgroup that already hands `memory` and `pids` to its children: the
//!   launcher's own, or its parent (systemd `Delegate=yes` with
//!   `DelegateSubgroup=`, where moat runs in a leaf of the delegated unit);
//! * the launcher's own cgroup delegated to its user (`systemd-run --user
//!   -p Delegate=yes`, `--scope` likewise): writable, with the controllers
//!   available in `cgroup.controllers` but enabled for no child. cgroup v2
//!   lets a cgroup enable controllers for its children only once it holds no
//!   process itself, so when the only processes there are moat's own (the
//!   launcher, and init once cloned), they move to `moat/supervisor` first.
//!
//! The decision reads the hierarchy through [`V2Tree`], so that it can be
//! checked against layouts the build machines do not have (their cgroup2
//! hierarchy offers no `memory` controller).

use std::path::{Path, PathBuf};

/// What the decision needs to know about the hierarchy.
pub(crate) trait V2Tree {
    /// The words of a cgroup file (`cgroup.controllers`,
    /// `cgroup.subtree_control`, `cgroup.procs`); `None` when unreadable.
    fn words(&self, file: &Path) -> Option<Vec<String>>;
    /// This process may write `path` (a directory: create entries in it).
    fn writable(&self, path: &Path) -> bool;
}

/// The host's cgroupfs.
pub(crate) struct HostTree;

impl V2Tree for HostTree {
    fn words(&self, file: &Path) -> Option<Vec<String>> {
        let text = super::read_small(file).ok()?;
        Some(text.split_whitespace().map(str::to_owned).collect())
    }

    fn writable(&self, path: &Path) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: a valid C string; access only reads it.
        unsafe { libc::access(path.as_ptr(), libc::W_OK) == 0 }
    }
}

/// Where the run's `moat/<run>` directory goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Base {
    /// `dir` already enables the controllers for its children.
    Delegating(PathBuf),
    /// `dir` is the launcher's own cgroup, delegated to this user, holding
    /// only `movable` (moat's own processes): they move to
    /// `dir/moat/supervisor`, then `dir` enables the controllers.
    Delegated { dir: PathBuf, movable: Vec<String> },
}

/// The leaf the launcher (and init, until it is admitted to its run) moves
/// to when moat takes over its own delegated cgroup.
pub(crate) const SUPERVISOR: &str = "supervisor";

/// Chooses where runs go, for a launcher in `own` (a directory under the
/// cgroup2 mount `mount`), needing `wanted` controllers; `ours` are the pids
/// moat may move out of `own` (the launcher's, and init's once cloned).
pub(crate) fn choose(
    tree: &dyn V2Tree,
    mount: &Path,
    own: &Path,
    wanted: &[&str],
    ours: &[libc::pid_t],
) -> Result<Base, String> {
    let has_all = |file: &Path| {
        tree.words(file)
            .is_some_and(|words| wanted.iter().all(|c| words.iter().any(|w| w == c)))
    };
    let parent = own.parent().filter(|_| own != mount);
    for dir in [Some(own), parent].into_iter().flatten() {
        if has_all(&dir.join("cgroup.subtree_control"))
            && (tree.writable(dir) || tree.writable(&dir.join("moat")))
        {
            return Ok(Base::Delegating(dir.to_path_buf()));
        }
    }
    let not_delegating = format!(
        "neither {} nor its parent delegates {wanted:?} to children this user may create",
        own.display()
    );
    let why = match own_delegated(tree, mount, own, wanted, ours) {
        Ok(movable) => {
            return Ok(Base::Delegated {
                dir: own.to_path_buf(),
                movable,
            });
        }
        Err(why) => why,
    };
    Err(format!(
        "{not_delegating}, and {why} (run moat in a cgroup delegated to its user, e.g. \
         `systemd-run --user -p Delegate=yes`, or a leaf of a unit with Delegate=yes and \
         DelegateSubgroup=supervisor)"
    ))
}

/// Whether moat may take over its own cgroup: the pids to move out of it, or
/// why not.
fn own_delegated(
    tree: &dyn V2Tree,
    mount: &Path,
    own: &Path,
    wanted: &[&str],
    ours: &[libc::pid_t],
) -> Result<Vec<String>, String> {
    if own == mount {
        return Err("its own cgroup is the hierarchy's root".into());
    }
    let available = tree
        .words(&own.join("cgroup.controllers"))
        .unwrap_or_default();
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|c| !available.iter().any(|a| a == c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "its own cgroup lacks {missing:?} (available: {available:?})"
        ));
    }
    for entry in ["", "cgroup.procs", "cgroup.subtree_control"] {
        let path = own.join(entry);
        if !tree.writable(&path) {
            return Err(format!("{} is not writable by this user", path.display()));
        }
    }
    let procs = tree
        .words(&own.join("cgroup.procs"))
        .ok_or_else(|| "its own cgroup.procs cannot be read".to_owned())?;
    let ours: Vec<String> = ours.iter().map(ToString::to_string).collect();
    let others = procs.iter().filter(|p| !ours.contains(p)).count();
    if others > 0 {
        return Err(format!(
            "its own cgroup holds {others} other process(es), which moat does not move"
        ));
    }
    Ok(procs)
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    /// A hierarchy on paper: file contents and writable paths.
    #[derive(Default)]
    struct Paper {
        files: HashMap<PathBuf, String>,
        writable: HashSet<PathBuf>,
    }

    impl Paper {
        fn file(mut self, path: &str, text: &str) -> Self {
            self.files.insert(PathBuf::from(path), text.into());
            self
        }

        fn writable(mut self, paths: &[&str]) -> Self {
            self.writable.extend(paths.iter().map(PathBuf::from));
            self
        }

        /// A cgroup delegated to this user: the directory and its files.
        fn delegated(self, dir: &str) -> Self {
            self.writable(&[
                dir,
                &format!("{dir}/cgroup.procs"),
                &format!("{dir}/cgroup.subtree_control"),
            ])
        }
    }

    impl V2Tree for Paper {
        fn words(&self, file: &Path) -> Option<Vec<String>> {
            let text = self.files.get(file)?;
            Some(text.split_whitespace().map(str::to_owned).collect())
        }

        fn writable(&self, path: &Path) -> bool {
            // Path::join("") leaves a trailing slash; compare without it.
            let path = PathBuf::from(path.to_string_lossy().trim_end_matches('/'));
            self.writable.contains(&path)
        }
    }

    const MOUNT: &str = "/sys/fs/cgroup";
    const APP: &str = "/sys/fs/cgroup/user.slice/user@1000.service/app.slice";
    const UNIT: &str = "/sys/fs/cgroup/user.slice/user@1000.service/app.slice/run-u7.service";
    const WANTED: &[&str] = &["memory", "pids"];

    fn choose_for(tree: &Paper, own: &str, ours: &[libc::pid_t]) -> Result<Base, String> {
        choose(tree, Path::new(MOUNT), Path::new(own), WANTED, ours)
    }

    #[test]
    fn a_leaf_of_a_delegating_unit_runs_beside_itself() {
        let own = format!("{UNIT}/supervisor");
        let tree = Paper::default()
            .file(&format!("{UNIT}/cgroup.subtree_control"), "cpu memory pids")
            .file(&format!("{own}/cgroup.subtree_control"), "")
            .delegated(UNIT)
            .delegated(&own);
        assert_eq!(
            choose_for(&tree, &own, &[10]),
            Ok(Base::Delegating(UNIT.into()))
        );
    }

    #[test]
    fn a_parent_that_delegates_but_is_not_ours_is_passed_over() {
        // The parent hands memory and pids on, but only root may create there.
        let tree = Paper::default()
            .file(&format!("{APP}/cgroup.subtree_control"), "memory pids")
            .file(&format!("{UNIT}/cgroup.controllers"), "cpu memory pids")
            .file(&format!("{UNIT}/cgroup.subtree_control"), "")
            .file(&format!("{UNIT}/cgroup.procs"), "10\n")
            .delegated(UNIT);
        assert_eq!(
            choose_for(&tree, UNIT, &[10]),
            Ok(Base::Delegated {
                dir: UNIT.into(),
                movable: vec!["10".into()]
            })
        );
    }

    #[test]
    fn a_delegated_own_cgroup_is_taken_over_with_init_in_it() {
        let tree = Paper::default()
            .file(&format!("{UNIT}/cgroup.controllers"), "memory pids")
            .file(&format!("{UNIT}/cgroup.procs"), "10\n11\n")
            .delegated(UNIT);
        assert_eq!(
            choose_for(&tree, UNIT, &[10, 11]),
            Ok(Base::Delegated {
                dir: UNIT.into(),
                movable: vec!["10".into(), "11".into()]
            })
        );
    }

    #[test]
    fn another_process_in_the_own_cgroup_is_never_moved() {
        let tree = Paper::default()
            .file(&format!("{UNIT}/cgroup.controllers"), "memory pids")
            .file(&format!("{UNIT}/cgroup.procs"), "9\n10\n")
            .delegated(UNIT);
        let err = choose_for(&tree, UNIT, &[10]).unwrap_err();
        assert!(err.contains("1 other process"), "{err}");
    }

    #[test]
    fn an_own_cgroup_without_the_controllers_or_not_ours_is_refused() {
        // The build machines: a cgroup2 hierarchy offering hugetlb only.
        let hugetlb = Paper::default()
            .file(&format!("{UNIT}/cgroup.controllers"), "hugetlb")
            .file(&format!("{UNIT}/cgroup.procs"), "10\n")
            .delegated(UNIT);
        let err = choose_for(&hugetlb, UNIT, &[10]).unwrap_err();
        assert!(err.contains(r#"lacks ["memory", "pids"]"#), "{err}");
        // Readable but owned by root: a session scope, not a delegation.
        let root_owned = Paper::default()
            .file(&format!("{UNIT}/cgroup.controllers"), "memory pids")
            .file(&format!("{UNIT}/cgroup.procs"), "10\n")
            .writable(&[UNIT]);
        let err = choose_for(&root_owned, UNIT, &[10]).unwrap_err();
        assert!(err.contains("cgroup.procs is not writable"), "{err}");
    }

    #[test]
    fn the_root_cgroup_is_never_emptied_and_nothing_above_it_is_read() {
        let tree = Paper::default()
            .file(&format!("{MOUNT}/cgroup.controllers"), "memory pids")
            .file(&format!("{MOUNT}/cgroup.procs"), "10\n")
            .file("/sys/fs/cgroup.subtree_control", "memory pids")
            .delegated(MOUNT)
            .writable(&["/sys/fs"]);
        let err = choose_for(&tree, MOUNT, &[10]).unwrap_err();
        assert!(err.contains("hierarchy's root"), "{err}");
    }

    #[test]
    fn a_moat_directory_made_over_to_the_user_is_enough() {
        // An administrator created APP/moat for this user, and nothing else.
        let tree = Paper::default()
            .file(&format!("{APP}/cgroup.subtree_control"), "memory pids")
            .writable(&[&format!("{APP}/moat")]);
        assert_eq!(
            choose_for(&tree, UNIT, &[10]),
            Ok(Base::Delegating(APP.into()))
        );
    }
}
