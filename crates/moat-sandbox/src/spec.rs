//! What to run and under which confinement: the launcher's only input.

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use moat_core::{Limits, NetworkMode, RootView, SandboxMode};

use crate::error::SpecError;
use crate::hostid::IdRange;
use crate::launch_policy::LaunchPolicy;
use crate::sys;

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
    /// Run without a cgroup of its own when none can be made, because the
    /// deployment bounds runs instead (a manifest's `cgroupLimits:
    /// deployment`, `moat exec --without-cgroup-limits`). Only the cgroup
    /// layer: every other protection still fails closed.
    pub without_cgroup: bool,
    /// Launched by root, the program runs as a host uid/gid of its own from
    /// this block; `None` is the host's block for Moat (the `moat-sandboxes` entries of
    /// `/etc/subuid` and `/etc/subgid`, made on first use). Unused when the
    /// launcher is not root: the program then keeps the launcher's ids.
    pub id_range: Option<IdRange>,
    /// Give the program `/dev/null` as stdin whatever the launcher's stdin
    /// is. A launcher that reads requests on its own stdin (the capability
    /// shell, MCP) must set it: the program would otherwise read the
    /// requests that follow its own.
    pub stdin_null: bool,
    /// Bytes the program reads on stdin (then end of file), instead of any
    /// stdin: how a one-operation token is handed to a program without an
    /// argument, a variable or a file anyone else could see. At most 64 KiB.
    pub stdin_data: Option<Vec<u8>>,
    /// The operator's exceptions to the launch policy (none by default).
    pub launch_policy: LaunchPolicy,
    /// Launched by root with no writable root, the read-only root mounted
    /// at this path inside is still seen as the sandbox user's whoever owns
    /// it (idmapped), and no other root is. `None` by default: host root's
    /// files are never handed to a program for reading only. The shell's
    /// export verifier names its candidates: it must read what a program
    /// wrote into a workspace that a root runner owns, mode 0700.
    pub read_as_owner: Option<PathBuf>,
    /// A KVM device node bound at the sandbox's `/dev/kvm`: the jail of a
    /// `microvm` guest run with hardware virtualization. Nothing else asks
    /// for a device.
    pub kvm: Option<PathBuf>,
    /// In the proxy network modes, leave TCP bind and connect to the network
    /// namespace (only loopback, where only the egress proxy listens)
    /// rather than also to Landlock: the `microvm` jail's emulator pairs
    /// each proxied connection's sockets through a listener of its own on
    /// 127.0.0.1.
    pub tcp_on_loopback: bool,
    /// In the `ingress-only` network mode: the ports the program may listen
    /// on, each reached from the host through a unix socket the launcher
    /// binds at the given path (and removes when the sandbox ends).
    pub expose: Vec<ExposedPort>,
    /// Descriptors the program gets as 3, 4, ... in this order (open across
    /// its exec; every other descriptor of the launcher is closed): a
    /// channel of the caller's own with the program, such as a browser's
    /// DevTools pipe (`--remote-debugging-pipe` reads 3 and writes 4). At
    /// most [`MAX_PASSED_FDS`]; shared, so a spec stays cloneable.
    pub pass_fds: Vec<std::sync::Arc<std::os::fd::OwnedFd>>,
}

/// Most descriptors a spec may pass to its program.
pub const MAX_PASSED_FDS: usize = 4;

/// A port of an `ingress-only` sandbox and where the host reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposedPort {
    /// The TCP port the program listens on, on the sandbox's loopback (or
    /// any address: the sandbox has no other interface).
    pub port: u16,
    /// Absolute host path of the unix socket the launcher binds for it. It
    /// must not exist yet; its directory should be the caller's alone.
    pub socket: PathBuf,
}

/// Checks the ports a sandbox is to expose: at most [`MAX_EXPOSED_PORTS`],
/// each once, none below [`MIN_EXPOSED_PORT`].
pub fn check_ports(ports: &[u16]) -> Result<(), SpecError> {
    let bad = |m: String| Err(SpecError::BadExpose(m));
    if ports.len() > MAX_EXPOSED_PORTS {
        return bad(format!("at most {MAX_EXPOSED_PORTS} exposed ports"));
    }
    let mut seen = HashSet::new();
    for port in ports {
        if *port < MIN_EXPOSED_PORT {
            return bad(format!(
                "port {port}: expose {MIN_EXPOSED_PORT}-65535 (a lower port needs a privilege \
                 the sandboxed program never has)"
            ));
        }
        if !seen.insert(port) {
            return bad(format!("port {port} is exposed twice"));
        }
    }
    Ok(())
}

/// Whether `dir` is a directory (not a link) owned by this process's
/// effective user that nobody else may write to: where a socket only that
/// user reaches may be made.
pub fn is_private_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: plain id query.
    let euid = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(dir)
        .is_ok_and(|meta| meta.is_dir() && meta.uid() == euid && meta.mode() & 0o022 == 0)
}

/// Most ports one sandbox may expose.
pub const MAX_EXPOSED_PORTS: usize = 16;

/// Lowest port a sandbox may expose: the program never holds the privilege
/// lower ports need.
pub const MIN_EXPOSED_PORT: u16 = 1024;

/// The most bytes `stdin_data` may hold (a pipe's default capacity).
pub const MAX_STDIN_DATA: usize = 64 << 10;

/// Longest wall-clock limit accepted.
pub const MAX_TIMEOUT_MS: u64 = 30 * 24 * 3600 * 1000;

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
            without_cgroup: false,
            id_range: None,
            stdin_null: false,
            stdin_data: None,
            launch_policy: LaunchPolicy::default(),
            read_as_owner: None,
            kvm: None,
            tcp_on_loopback: false,
            expose: Vec::new(),
            pass_fds: Vec::new(),
        }
    }

    /// Checks the spec and resolves host paths. Nothing is started before this passes.
    pub fn validate(&mut self) -> Result<(), SpecError> {
        let id_ok = !self.run_id.is_empty()
            && self.run_id.len() <= 64
            && !self.run_id.starts_with('.')
            && self
                .run_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !id_ok {
            return Err(SpecError::BadRunId(self.run_id.clone()));
        }
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(SpecError::EmptyArgv);
        }
        if self
            .stdin_data
            .as_ref()
            .is_some_and(|d| d.len() > MAX_STDIN_DATA)
        {
            return Err(SpecError::StdinTooLarge {
                max: MAX_STDIN_DATA,
            });
        }
        // A descriptor below 3 would be overwritten by the program's
        // standard streams before it is placed.
        if self.pass_fds.len() > MAX_PASSED_FDS
            || self.pass_fds.iter().any(|fd| {
                use std::os::fd::AsRawFd as _;
                fd.as_raw_fd() < 3
            })
        {
            return Err(SpecError::TooManyPassedFds {
                max: MAX_PASSED_FDS,
            });
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
        self.check_limits()?;
        if let Some(cwd) = &self.cwd
            && !cwd.is_absolute()
        {
            return Err(SpecError::BadCwd(cwd.clone()));
        }
        let mut seen = HashSet::new();
        for mount in &mut self.mounts {
            mount.host = resolve_host(&mount.host)?;
            check_inside(&mount.inside)?;
            if !seen.insert(mount.inside.clone()) {
                return Err(SpecError::DuplicateMount(mount.inside.clone()));
            }
        }
        self.check_expose()?;
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
            let bad = |e: std::io::Error| SpecError::BadHostPath {
                path: outer.host.join(relative),
                reason: format!(
                    "cannot create the mount point for {}: {e}",
                    inner.inside.display()
                ),
            };
            // Walk from the outer root's handle one component at a time, never
            // following a symbolic link: the outer root may be writable by a
            // previous sandbox.
            let mut dir = sys::open_no_symlinks(&outer.host).map_err(bad)?;
            let owner = sys::fstat(dir.as_raw_fd()).map_err(bad)?;
            let owner = (owner.st_uid, owner.st_gid);
            let parts: Vec<_> = relative.components().collect();
            for (n, part) in parts.iter().enumerate() {
                let name = std::ffi::CString::new(part.as_os_str().as_bytes())
                    .map_err(|_| bad(std::io::ErrorKind::InvalidInput.into()))?;
                let last = n + 1 == parts.len();
                let is_dir = !last || inner.host.is_dir();
                sys::make_mount_point(&dir, &name, is_dir, owner).map_err(bad)?;
                if !last {
                    dir = sys::openat2(
                        dir.as_raw_fd(),
                        &name,
                        (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
                        0,
                        libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH,
                    )
                    .map_err(bad)?;
                }
            }
        }
        Ok(())
    }

    fn check_expose(&self) -> Result<(), SpecError> {
        let bad = |m: String| Err(SpecError::BadExpose(m));
        if self.network != NetworkMode::IngressOnly {
            if !self.expose.is_empty() {
                return bad(format!(
                    "exposed ports need the ingress-only network mode, not {}",
                    self.network
                ));
            }
            return Ok(());
        }
        check_ports(&self.expose.iter().map(|e| e.port).collect::<Vec<_>>())?;
        for exposed in &self.expose {
            let socket = &exposed.socket;
            if !socket.is_absolute() || socket.parent().is_none_or(|p| !p.is_dir()) {
                return bad(format!(
                    "{}: the socket for port {} needs an absolute path in an existing directory",
                    socket.display(),
                    exposed.port
                ));
            }
            // sun_path holds 108 bytes with its NUL.
            if socket.as_os_str().len() > 107 {
                return bad(format!(
                    "{}: a unix socket path is at most 107 bytes",
                    socket.display()
                ));
            }
            if socket.symlink_metadata().is_ok() {
                return bad(format!("{}: already exists", socket.display()));
            }
            // The socket's directory: the launcher's alone, and out of the
            // sandbox's sight (a program that could reach its own socket
            // would reach its own port, and forge the ingress record).
            let parent = socket.parent().unwrap_or(Path::new("/"));
            if !is_private_dir(parent) {
                return bad(format!(
                    "{}: the sockets' directory must be a directory (not a link) owned by \
                     moat's user, writable by nobody else",
                    parent.display()
                ));
            }
            let parent = std::fs::canonicalize(parent)
                .map_err(|e| SpecError::BadExpose(format!("{}: {e}", parent.display())))?;
            if let Some(root) = self.mounts.iter().find(|m| parent.starts_with(&m.host)) {
                return bad(format!(
                    "{}: the sockets' directory is inside {}, which the sandbox sees",
                    parent.display(),
                    root.host.display()
                ));
            }
            if self.root_view == RootView::HostRo && !crate::mounts::hidden_in_host_view(&parent) {
                return bad(format!(
                    "{}: the host-ro view shows it to the sandbox; put the sockets under /tmp \
                     or /run",
                    parent.display()
                ));
            }
        }
        Ok(())
    }

    fn check_limits(&self) -> Result<(), SpecError> {
        let l = &self.limits;
        let checks: [(&'static str, u64, u64, u64); 7] = [
            ("timeout (ms)", l.timeout_ms, 1, MAX_TIMEOUT_MS),
            // A tmpfs of size 0 would have no limit at all.
            (
                "max-write",
                l.max_write_bytes.unwrap_or(4096),
                4096,
                1 << 50,
            ),
            ("memory", l.memory_bytes, 4 << 20, u64::MAX),
            ("pids", l.pids, 2, 4_194_304),
            ("tmp-size", l.tmp_size_bytes, 4096, u64::MAX),
            ("open files", l.open_files, 16, 1 << 20),
            (
                "cpus (thousandths)",
                l.cpu_millis.unwrap_or(10),
                10,
                1_024_000,
            ),
        ];
        for (name, value, min, max) in checks {
            if !(min..=max).contains(&value) {
                return Err(SpecError::LimitOutOfRange { name, min, max });
            }
        }
        if l.max_write_bytes.is_some() && self.mode == SandboxMode::DangerFullAccess {
            return Err(SpecError::BudgetInDangerMode);
        }
        if l.max_write_bytes.is_some()
            && let Some(file) = self
                .mounts
                .iter()
                .find(|m| self.is_writable(m) && !m.host.is_dir())
        {
            return Err(SpecError::BadHostPath {
                path: file.host.clone(),
                reason: "a writable file is not under the storage budget (it covers \
                         directories): declare its directory instead"
                    .into(),
            });
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
    // A symbolic link on the way would let whoever controls it choose what
    // gets mounted (and, launched by root, whose files the sandbox may own).
    let absolute = std::path::absolute(path).map_err(|e| bad(e.to_string()))?;
    let fd = sys::open_no_symlinks(&absolute).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            bad(format!(
                "goes through a symbolic link; pass the resolved path ({})",
                resolved.display()
            ))
        } else {
            bad(e.to_string())
        }
    })?;
    let st = sys::fstat(fd.as_raw_fd()).map_err(|e| bad(e.to_string()))?;
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFDIR && kind != libc::S_IFREG {
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
