//! What to run and under which confinement: the launcher's only input.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use moat_core::{Limits, NetworkMode, RootView, SandboxMode};

use crate::error::SpecError;

/// A host path made visible inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    /// Host path (resolved to a canonical path by [`SandboxSpec::validate`]).
    pub host: PathBuf,
    /// Absolute path inside the sandbox.
    pub inside: PathBuf,
    /// Writable from inside, if the mode allows declared writes.
    pub writable: bool,
}

/// Everything the launcher needs to start one sandboxed program.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Identifies the run in events and in the cgroup name.
    pub run_id: String,
    /// Program and arguments. A program without `/` is looked up in the
    /// sandbox's own `PATH`, inside the sandbox.
    pub argv: Vec<String>,
    /// Working directory inside the sandbox; default `/workspace` when a
    /// workspace root exists, else `/`.
    pub cwd: Option<PathBuf>,
    /// Extra environment, on top of `PATH`, `HOME`, `TMPDIR`, `LANG`, `RUN_ID`.
    /// Nothing else of the launcher's environment is passed.
    pub env: Vec<(String, String)>,
    pub mounts: Vec<BindMount>,
    pub mode: SandboxMode,
    pub network: NetworkMode,
    pub root_view: RootView,
    pub limits: Limits,
    /// Run even when a protection cannot be applied; the report says which.
    pub allow_degraded: bool,
    /// Host uid and gid the program runs as when the launcher is root.
    pub unprivileged_id: (u32, u32),
}

/// Paths inside the sandbox that the launcher builds itself.
const RESERVED: &[&str] = &[
    "/", "/proc", "/dev", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

impl SandboxSpec {
    pub fn new(run_id: impl Into<String>, argv: Vec<String>) -> Self {
        SandboxSpec {
            run_id: run_id.into(),
            argv,
            cwd: None,
            env: Vec::new(),
            mounts: Vec::new(),
            mode: SandboxMode::default(),
            network: NetworkMode::default(),
            root_view: RootView::default(),
            limits: Limits::default(),
            allow_degraded: false,
            unprivileged_id: (65534, 65534),
        }
    }

    /// Checks the spec and resolves host paths. Nothing is started before this passes.
    pub fn validate(&mut self) -> Result<(), SpecError> {
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(SpecError::EmptyArgv);
        }
        if let Some(index) = self.argv.iter().position(|a| a.contains('\0')) {
            return Err(SpecError::NulInArgument { index });
        }
        for (name, value) in &self.env {
            let bad_name = name.is_empty()
                || name.contains('=')
                || name.contains('\0')
                || name.starts_with(|c: char| c.is_ascii_digit());
            if bad_name || value.contains('\0') {
                return Err(SpecError::BadEnv(name.clone()));
            }
        }
        if matches!(
            self.network,
            NetworkMode::ProxyOnly | NetworkMode::Allowlist
        ) {
            return Err(SpecError::UnsupportedNetwork(self.network));
        }
        self.check_limits()?;
        if let Some(cwd) = &self.cwd {
            if !cwd.is_absolute() {
                return Err(SpecError::BadCwd(cwd.clone()));
            }
        }
        let mut seen = HashSet::new();
        for mount in &mut self.mounts {
            mount.host = resolve_host(&mount.host)?;
            check_inside(&mount.inside)?;
            if !seen.insert(mount.inside.clone()) {
                return Err(SpecError::DuplicateMount(mount.inside.clone()));
            }
        }
        // Parents before children, so a nested root lands on top of its parent.
        self.mounts.sort_by_key(|m| m.inside.components().count());
        self.make_nested_mount_points()
    }

    /// A root nested inside another declared root (`/workspace/input` inside
    /// `/workspace`) needs its mount point to exist in the parent's host
    /// directory: create it, empty, if it is missing. This is the only host
    /// write the launcher makes.
    fn make_nested_mount_points(&self) -> Result<(), SpecError> {
        for (i, inner) in self.mounts.iter().enumerate() {
            let Some(outer) = self.mounts[..i]
                .iter()
                .rev()
                .find(|o| inner.inside.starts_with(&o.inside))
            else {
                continue;
            };
            let relative = inner
                .inside
                .strip_prefix(&outer.inside)
                .unwrap_or(Path::new(""));
            let point = outer.host.join(relative);
            if point.symlink_metadata().is_ok() {
                continue;
            }
            let made = if inner.host.is_dir() {
                std::fs::create_dir_all(&point)
            } else {
                point
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::File::create(&point).map(drop))
            };
            made.map_err(|e| SpecError::BadHostPath {
                path: point.clone(),
                reason: format!(
                    "cannot create the mount point for {}: {e}",
                    inner.inside.display()
                ),
            })?;
        }
        Ok(())
    }

    fn check_limits(&self) -> Result<(), SpecError> {
        let l = &self.limits;
        let checks: [(&'static str, u64, u64); 6] = [
            ("timeout", l.timeout_ms, 1),
            ("memory", l.memory_bytes, 4 << 20),
            ("pids", l.pids, 2),
            ("tmp-size", l.tmp_size_bytes, 4096),
            ("open files", l.open_files, 16),
            ("cpus", l.cpu_millis.unwrap_or(10), 10),
        ];
        for (name, value, min) in checks {
            if value < min {
                return Err(SpecError::LimitTooSmall { name, min });
            }
        }
        Ok(())
    }

    /// The working directory the program starts in.
    pub fn effective_cwd(&self) -> PathBuf {
        if let Some(cwd) = &self.cwd {
            return cwd.clone();
        }
        let workspace = Path::new("/workspace");
        if self.mounts.iter().any(|m| m.inside.starts_with(workspace)) {
            workspace.to_path_buf()
        } else {
            PathBuf::from("/")
        }
    }

    /// Whether `mount` is writable from inside under this spec's mode.
    pub fn is_writable(&self, mount: &BindMount) -> bool {
        mount.writable && self.mode.allows_declared_writes()
    }
}

fn resolve_host(path: &Path) -> Result<PathBuf, SpecError> {
    let bad = |reason: String| SpecError::BadHostPath {
        path: path.to_path_buf(),
        reason,
    };
    let resolved = std::fs::canonicalize(path).map_err(|e| bad(e.to_string()))?;
    if resolved == Path::new("/") {
        return Err(bad(
            "the host root cannot be a declared root (use --root host-ro to see the host \
             read-only)"
                .into(),
        ));
    }
    let meta = std::fs::metadata(&resolved).map_err(|e| bad(e.to_string()))?;
    if !(meta.is_dir() || meta.is_file()) {
        return Err(bad(
            "only directories and regular files can be mounted".into()
        ));
    }
    Ok(resolved)
}

fn check_inside(path: &Path) -> Result<(), SpecError> {
    let bad = |reason: &str| SpecError::BadInsidePath {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    if !path.is_absolute() {
        return Err(bad("must be an absolute path inside the sandbox"));
    }
    if path
        .components()
        .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(bad("must not contain `.` or `..`"));
    }
    if let Some(reserved) = RESERVED.iter().find(|r| {
        let r = Path::new(r);
        path == r || (r != Path::new("/") && path.starts_with(r))
    }) {
        return Err(bad(&format!("{reserved} is built by the sandbox itself")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_paths_must_be_plain_and_outside_system_dirs() {
        assert!(check_inside(Path::new("/workspace/input")).is_ok());
        assert!(check_inside(Path::new("/tmp/data")).is_ok());
        for bad in [
            "relative",
            "/workspace/../etc",
            "/usr/local/x",
            "/proc",
            "/",
            "/etc",
        ] {
            assert!(check_inside(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn empty_program_is_refused() {
        let mut spec = SandboxSpec::new("r", vec![]);
        assert!(matches!(spec.validate(), Err(SpecError::EmptyArgv)));
    }
}
