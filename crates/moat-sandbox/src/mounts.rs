//! The sandbox's root filesystem: planned by the launcher before the clone,
//! built by the sandbox's init inside its own mount namespace.
//!
//! Every host path is cloned as a detached mount (`open_tree`) before anything
//! is mounted, then attached under a fresh tmpfs that becomes `/` through
//! `pivot_root`; the old root is detached. Nothing of the host is reachable
//! but what the plan names.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use moat_core::{NetworkMode, RootView, SandboxMode};

use crate::budget::Budget;
use crate::error::{Layer, SetupError};
use crate::spec::SandboxSpec;
use crate::sys;

/// Where the new root is assembled before `pivot_root` (a private tmpfs
/// mounted over the mount namespace's own copy of `/tmp`).
const STAGE: &str = "/tmp";

const ATTR_RO: u64 = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
const ATTR_RW: u64 = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;

/// A host tree to be attached somewhere in the new root.
pub(crate) struct Source {
    host: CString,
    /// Include the mounts below `host` (system dirs); declared roots that are
    /// idmapped take only their own mount.
    recursive: bool,
    attrs: u64,
    /// The detached, idmapped tree the launcher cloned before the clone
    /// (inherited descriptor).
    prepared: Option<RawFd>,
}

/// Declared roots cloned and idmapped by the launcher (only root may idmap
/// a mount): the owner of each root appears, inside, as the sandbox user.
pub(crate) struct IdmappedRoots {
    /// One slot per declared mount of the spec, in order.
    trees: Vec<Option<OwnedFd>>,
    /// Whether each is idmapped (its owner shown as the sandbox user), or
    /// only cloned here so that what is mounted is what was checked.
    mapped: Vec<bool>,
    /// uid/gid owning the first writable root (else the first root): the
    /// identity the sandbox user takes inside.
    pub(crate) owner: Option<(u32, u32)>,
    /// Whether that owner is a writable root's.
    writable_owner: bool,
    /// The spec's KVM node, cloned here: root's node for the jail lies in a
    /// directory the sandbox's init cannot traverse.
    kvm: Option<OwnedFd>,
}

impl IdmappedRoots {
    pub(crate) fn none() -> Self {
        IdmappedRoots {
            trees: Vec::new(),
            mapped: Vec::new(),
            owner: None,
            writable_owner: false,
            kvm: None,
        }
    }

    /// Launcher side, before the clone: clones each declared root as a
    /// detached mount with its final flags. The tree is cloned from a handle
    /// opened without following symbolic links, and its owner read from that
    /// same handle, so what is mounted is what was checked.
    pub(crate) fn prepare(spec: &SandboxSpec) -> Result<Self, SetupError> {
        let mut trees = Vec::with_capacity(spec.mounts.len());
        let mut owners = Vec::with_capacity(spec.mounts.len());
        for mount in &spec.mounts {
            let fail = |e| SetupError::io(Layer::Filesystem, mount.host.display(), e);
            let handle = sys::open_no_symlinks(&mount.host).map_err(fail)?;
            let st = sys::fstat(handle.as_raw_fd()).map_err(fail)?;
            owners.push((spec.is_writable(mount), (st.st_uid, st.st_gid)));
            let fd = sys::open_tree(
                handle.as_raw_fd(),
                c"",
                libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32,
            )
            .map_err(fail)?;
            let attrs = if spec.is_writable(mount) {
                ATTR_RW
            } else {
                ATTR_RO
            };
            sys::mount_setattr(fd.as_raw_fd(), false, attrs, 0, None).map_err(fail)?;
            trees.push(Some(fd));
        }
        // The sandbox user becomes the owner of the first writable root (it
        // must write there), else of the first read-only root owned by
        // neither root's uid nor root's group: host root's files are never
        // handed to it for reading only, unless the spec names the one
        // root it must read as its owner (the export verifier's candidates).
        let named = (!owners.iter().any(|(writable, _)| *writable))
            .then(|| {
                let inside = spec.read_as_owner.as_deref()?;
                spec.mounts.iter().position(|m| m.inside == inside)
            })
            .flatten();
        if let Some(index) = named {
            let owner = owners.get(index).map(|(_, owner)| *owner);
            let mapped = (0..owners.len()).map(|i| i == index).collect();
            return Ok(IdmappedRoots {
                trees,
                mapped,
                owner,
                writable_owner: false,
                kvm: None,
            });
        }
        let owner = owners
            .iter()
            .find(|(writable, _)| *writable)
            .or(owners.iter().find(|(_, (uid, gid))| *uid != 0 && *gid != 0))
            .map(|(_, owner)| *owner);
        let writable_owner = owners.iter().any(|(writable, _)| *writable);
        // A read-only root is mapped only when it has the sandbox user's
        // owning uid: otherwise its files keep their owners, which the sandbox
        // does not have, and only what anyone may read is read. (Root's
        // read-only roots are mapped only beside a writable root of root's,
        // such as a root runner's workspace, whose files the program owns
        // anyway; the report says so.)
        let mapped = owners
            .iter()
            .map(|(writable, of)| *writable || owner.is_some_and(|o| o.0 == of.0))
            .collect();
        let kvm = match &spec.kvm {
            Some(node) => {
                let path = sys::cstring(node)
                    .map_err(|e| SetupError::io(Layer::Filesystem, node.display(), e))?;
                Some(
                    sys::open_tree(
                        libc::AT_FDCWD,
                        &path,
                        libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
                    )
                    .map_err(|e| SetupError::io(Layer::Filesystem, node.display(), e))?,
                )
            }
            None => None,
        };
        Ok(IdmappedRoots {
            trees,
            mapped,
            owner,
            writable_owner,
            kvm,
        })
    }

    /// A writable root owned by host root: what root keeps in it is the
    /// sandbox's (for the report).
    pub(crate) fn root_owned_writable(&self) -> bool {
        self.writable_owner && self.owner.is_some_and(|(uid, _)| uid == 0)
    }

    pub(crate) fn is_empty(&self) -> bool {
        !self.mapped.iter().any(|m| *m)
    }

    /// Whether the `index`th declared root is idmapped.
    pub(crate) fn is_mapped(&self, index: usize) -> bool {
        self.mapped.get(index).copied().unwrap_or(false)
    }

    fn raw(&self, index: usize) -> Option<RawFd> {
        self.trees.get(index)?.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Launcher side, once the user namespace exists: maps each root's owner
    /// to the sandbox user. Returns the first root that could not be mapped.
    pub(crate) fn apply(&self, spec: &SandboxSpec, userns: &OwnedFd) -> Result<(), SetupError> {
        for ((tree, mount), mapped) in self.trees.iter().zip(&spec.mounts).zip(&self.mapped) {
            if let (Some(fd), true) = (tree, mapped) {
                let set = libc::MOUNT_ATTR_IDMAP;
                sys::mount_setattr(fd.as_raw_fd(), false, set, 0, Some(userns.as_raw_fd()))
                    .map_err(|e| {
                        SetupError::new(
                            Layer::Filesystem,
                            format!(
                                "cannot idmap {}: {e} (does its filesystem support idmapped mounts?)",
                                mount.host.display()
                            ),
                        )
                    })?;
            }
        }
        Ok(())
    }
}

enum Op {
    Dir(PathBuf),
    /// A file written fresh into the root tmpfs (copied or synthesised).
    File(PathBuf, Vec<u8>),
    /// An empty file to mount over; if it exists (a nested root's mount point
    /// inside an outer root) it is left untouched.
    MountPoint(PathBuf),
    Symlink(PathBuf, PathBuf),
    Attach(PathBuf, usize),
    Tmpfs(PathBuf, String, bool),
    Proc(PathBuf),
    /// A writable root under the storage budget: the source's tree below an
    /// overlay whose upper layer is on the budget's tmpfs (slot: its
    /// directories there).
    Budgeted(PathBuf, usize, usize),
}

/// The whole root filesystem of one run.
pub(crate) struct RootPlan {
    sources: Vec<Source>,
    ops: Vec<Op>,
    root_size: String,
    /// The storage budget's tmpfs options, when writable roots have one.
    budget: Option<(u64, String)>,
}

/// How `moat exec --root host-ro` hides credentials and sockets.
const MASKED_HOST_PATHS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
];
/// Top-level host entries never shown in `host-ro`: credentials, live sockets,
/// kernel interfaces, and what the sandbox builds itself.
const HOST_SKIPPED: &[&str] = &["proc", "dev", "tmp", "sys", "run", "root", "lost+found"];

/// Whether the `host-ro` view leaves `path` (absolute, canonical) out.
pub(crate) fn hidden_in_host_view(path: &Path) -> bool {
    let mut parts = path.components().skip(1);
    parts
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .is_some_and(|top| HOST_SKIPPED.contains(&top))
}

const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// The `/etc` a program needs without a network (the network modes add
/// resolver and TLS files). `passwd`, `group` and `hosts` are written fresh.
const ETC_ENTRIES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "nsswitch.conf",
    "alternatives",
    "os-release",
    "debian_version",
];
/// Small files are copied into the root tmpfs instead of bind-mounted: a copy
/// is cheaper to make than a mount, and costs nothing at teardown.
const COPY_LIMIT: u64 = 256 << 10;
const COPY_DIR_ENTRIES: usize = 16;
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];
/// The symbolic links of a sandbox's `/dev` (a `microvm` guest's too).
pub(crate) const DEV_LINKS: &[(&str, &str)] = &[
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("shm", "/tmp"),
];
/// The home where the decoys live: what a script looking for credentials
/// tries first. Landlock grants nothing below it, so an attempt on a decoy
/// is refused and, with the evidence layer on, recorded with its path
/// (a path that does not exist inside fails with `ENOENT` and leaves no
/// trace anywhere).
pub(crate) const DECOY_HOME: &str = "/root";
/// Empty files, in the decoy home, where credentials usually are.
const DECOYS: &[&str] = &[
    ".ssh/id_rsa",
    ".ssh/id_ecdsa",
    ".ssh/id_ed25519",
    ".ssh/config",
    ".aws/credentials",
    ".aws/config",
    ".config/gcloud/application_default_credentials.json",
    ".config/gcloud/credentials.db",
    ".kube/config",
    ".docker/config.json",
    ".netrc",
    ".git-credentials",
    ".pgpass",
    ".npmrc",
    ".pypirc",
];

impl RootPlan {
    /// Plans the root for `spec`, running as `inside` uid/gid. Reads host
    /// metadata only; mounts nothing.
    pub(crate) fn new(
        spec: &SandboxSpec,
        inside: (u32, u32),
        idmapped: &IdmappedRoots,
        decoys: bool,
    ) -> Self {
        let mut plan = RootPlan {
            sources: Vec::new(),
            ops: Vec::new(),
            root_size: "size=2m,nr_inodes=4096,mode=0755".to_owned(),
            budget: spec.limits.max_write_bytes.map(|limit| {
                (
                    limit,
                    // Entries cost inodes the size does not count (an
                    // empty file, a directory): one per 4 KiB of budget,
                    // at least 1024.
                    format!(
                        "size={limit},nr_inodes={},mode=0700,uid={},gid={}",
                        (limit / 4096).max(1024),
                        inside.0,
                        inside.1
                    ),
                )
            }),
        };
        match (spec.mode, spec.root_view) {
            (SandboxMode::DangerFullAccess, _) => plan.host_view(false),
            (_, RootView::HostRo) => plan.host_view(true),
            (_, RootView::Minimal) => plan.minimal_view(spec.network, inside),
        }
        if decoys && spec.mode != SandboxMode::DangerFullAccess {
            // Before the declared roots: one mounted at the decoy home hides
            // the decoys instead of receiving them.
            plan.decoys();
        }
        plan.devices(
            spec.kvm.as_deref(),
            idmapped.kvm.as_ref().map(AsRawFd::as_raw_fd),
        );
        plan.ops.push(Op::Dir("/proc".into()));
        plan.ops.push(Op::Proc("/proc".into()));
        plan.ops.push(Op::Dir("/tmp".into()));
        plan.ops.push(Op::Tmpfs(
            "/tmp".into(),
            format!(
                "size={},mode=1777,uid={},gid={}",
                spec.limits.tmp_size_bytes, inside.0, inside.1
            ),
            false,
        ));
        for (i, mount) in spec.mounts.iter().enumerate() {
            let writable = spec.is_writable(mount);
            let is_file = mount.host.is_file();
            plan.declare_parents(&mount.inside);
            plan.ops.push(if is_file {
                Op::MountPoint(mount.inside.clone())
            } else {
                Op::Dir(mount.inside.clone())
            });
            let attrs = if writable { ATTR_RW } else { ATTR_RO };
            let index = plan.source(&mount.host, true, attrs);
            if let Some(fd) = idmapped.raw(i) {
                plan.sources[index].prepared = Some(fd);
                plan.sources[index].recursive = false;
            }
            plan.ops
                .push(if writable && plan.budget.is_some() && !is_file {
                    Op::Budgeted(mount.inside.clone(), index, i)
                } else {
                    Op::Attach(mount.inside.clone(), index)
                });
        }
        plan
    }

    fn decoys(&mut self) {
        let home = Path::new(DECOY_HOME);
        self.ops.push(Op::Dir(home.to_path_buf()));
        let mut dirs = std::collections::BTreeSet::new();
        for decoy in DECOYS {
            let path = home.join(decoy);
            for parent in path.ancestors().skip(1) {
                if parent.starts_with(home) && parent != home {
                    dirs.insert(parent.to_path_buf());
                }
            }
        }
        // BTreeSet order puts each directory before its children.
        self.ops.extend(dirs.into_iter().map(Op::Dir));
        self.ops
            .extend(DECOYS.iter().map(|d| Op::File(home.join(d), Vec::new())));
    }

    /// What Landlock lets the program read: every top-level entry of this
    /// root but the decoy home, and the declared roots wherever they are.
    pub(crate) fn readable(&self, spec: &SandboxSpec) -> Vec<PathBuf> {
        let mut tops = std::collections::BTreeSet::new();
        for op in &self.ops {
            let path = match op {
                Op::Dir(p)
                | Op::File(p, _)
                | Op::MountPoint(p)
                | Op::Symlink(p, _)
                | Op::Attach(p, _)
                | Op::Tmpfs(p, _, _)
                | Op::Proc(p)
                | Op::Budgeted(p, _, _) => p,
            };
            if let Some(top) = path.components().nth(1)
                && path.has_root()
            {
                tops.insert(Path::new("/").join(top));
            }
        }
        tops.remove(Path::new(DECOY_HOME));
        tops.extend(spec.mounts.iter().map(|m| m.inside.clone()));
        tops.into_iter().collect()
    }

    fn source(&mut self, host: &Path, recursive: bool, attrs: u64) -> usize {
        let host = CString::new(host.as_os_str().as_bytes()).unwrap_or_default();
        self.sources.push(Source {
            host,
            recursive,
            attrs,
            prepared: None,
        });
        self.sources.len() - 1
    }

    fn declare_parents(&mut self, inside: &Path) {
        let mut parents: Vec<&Path> = inside.ancestors().skip(1).collect();
        parents.reverse();
        for parent in parents {
            if parent != Path::new("/") && parent != Path::new("/tmp") {
                self.ops.push(Op::Dir(parent.to_path_buf()));
            }
        }
    }

    /// Mirrors a host entry: a symlink stays a symlink, a directory or file is
    /// attached read-only. Missing entries are skipped.
    fn mirror(&mut self, host: &Path, inside: &Path, attrs: u64) {
        if let Ok(meta) = std::fs::symlink_metadata(host) {
            self.mirror_entry(host, inside, &meta, attrs);
        }
    }

    fn mirror_entry(&mut self, host: &Path, inside: &Path, meta: &std::fs::Metadata, attrs: u64) {
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::read_link(host) {
                self.ops.push(Op::Symlink(inside.to_path_buf(), target));
            }
        } else if meta.is_dir() || meta.is_file() {
            self.ops.push(if meta.is_dir() {
                Op::Dir(inside.to_path_buf())
            } else {
                Op::MountPoint(inside.to_path_buf())
            });
            let index = self.source(host, true, attrs);
            self.ops.push(Op::Attach(inside.to_path_buf(), index));
        }
    }

    /// Like [`RootPlan::mirror`], but small files are copied and small
    /// directories of small files rebuilt, rather than mounted.
    fn copy_or_mirror(&mut self, host: &Path, depth: u32) {
        let Ok(meta) = std::fs::symlink_metadata(host) else {
            return;
        };
        // Only what anyone may read is copied (a copy is world-readable); the
        // rest is bound, keeping its owner and mode.
        let world_readable =
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o004 != 0;
        if meta.is_file()
            && meta.len() <= COPY_LIMIT
            && world_readable
            && let Some(content) = read_small(host, meta.len())
        {
            self.ops.push(Op::File(host.to_path_buf(), content));
            return;
        }
        // A directory whose entries fill more than one block holds far more
        // than COPY_DIR_ENTRIES; skip listing it (getdents reads it whole).
        if meta.is_dir() && depth > 0 && meta.len() <= 4096 {
            let entries: Vec<PathBuf> = std::fs::read_dir(host)
                .map(|d| {
                    d.take(COPY_DIR_ENTRIES + 1)
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .collect()
                })
                .unwrap_or_default();
            if entries.len() <= COPY_DIR_ENTRIES {
                self.ops.push(Op::Dir(host.to_path_buf()));
                for entry in entries {
                    self.copy_or_mirror(&entry, depth - 1);
                }
                return;
            }
        }
        self.mirror_entry(host, host, &meta, ATTR_RO);
    }

    fn minimal_view(&mut self, network: NetworkMode, inside: (u32, u32)) {
        for dir in SYSTEM_DIRS {
            let path = Path::new("/").join(dir);
            self.mirror(&path, &path, ATTR_RO);
        }
        self.ops.push(Op::Dir("/etc".into()));
        let network_entries: &[&str] = if network == NetworkMode::Full {
            &[
                "resolv.conf",
                "hosts",
                "gai.conf",
                "ssl",
                "ca-certificates",
                "services",
                "protocols",
            ]
        } else if network.uses_egress_proxy() {
            // TLS through the proxy's tunnels is the program's own: it needs
            // the trusted roots (names are resolved by the proxy).
            &["ssl", "ca-certificates"]
        } else {
            &[]
        };
        for entry in ETC_ENTRIES.iter().chain(network_entries) {
            let path = Path::new("/etc").join(entry);
            self.copy_or_mirror(&path, 1);
        }
        if network != NetworkMode::Full {
            self.ops.push(Op::File(
                "/etc/hosts".into(),
                b"127.0.0.1\tlocalhost moat\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_vec(),
            ));
        }
        let (uid, gid) = inside;
        let user = if uid == 0 { "root" } else { "sandbox" };
        let group = if gid == 0 { "root" } else { "sandbox" };
        let mut passwd = format!("{user}:x:{uid}:{gid}:Moat sandbox:/tmp:/bin/sh\n");
        let mut groups = format!("{group}:x:{gid}:\n");
        if uid != 65534 {
            passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
        }
        if gid != 65534 {
            groups.push_str("nogroup:x:65534:\n");
        }
        self.ops
            .push(Op::File("/etc/passwd".into(), passwd.into_bytes()));
        self.ops
            .push(Op::File("/etc/group".into(), groups.into_bytes()));
    }

    fn host_view(&mut self, masked: bool) {
        let attrs = if masked { ATTR_RO } else { ATTR_RW };
        let mut entries: Vec<PathBuf> = std::fs::read_dir("/")
            .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        entries.sort();
        for path in entries {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if HOST_SKIPPED.contains(&name) || name == "workspace" {
                if matches!(name, "root" | "run" | "sys") {
                    self.ops.push(Op::Dir(path));
                }
                continue;
            }
            self.mirror(&path, &path, attrs);
        }
        if !masked {
            return;
        }
        let mut masks: Vec<PathBuf> = MASKED_HOST_PATHS.iter().map(PathBuf::from).collect();
        for (home, _) in crate::launch_policy::homes() {
            masks.extend(
                crate::launch_policy::CREDENTIAL_HOME_ENTRIES
                    .iter()
                    .map(|e| home.join(e)),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for path in masks {
            // A masked entry may be a symlink (dotfile managers): mask what it
            // points to. The host view mirrors host paths at the same place.
            let Ok(target) = std::fs::canonicalize(&path) else {
                continue;
            };
            if !seen.insert(target.clone())
                || HOST_SKIPPED
                    .iter()
                    .any(|s| target.starts_with(Path::new("/").join(s)))
            {
                continue;
            }
            match std::fs::metadata(&target) {
                Ok(meta) if meta.is_dir() => self.ops.push(Op::Tmpfs(
                    target,
                    "size=4k,nr_inodes=1,mode=0555".into(),
                    true,
                )),
                Ok(meta) if meta.is_file() => {
                    let index = self.source(Path::new("/dev/null"), false, ATTR_RO);
                    self.ops.push(Op::Attach(target, index));
                }
                _ => {}
            }
        }
    }

    fn devices(&mut self, kvm: Option<&Path>, kvm_tree: Option<RawFd>) {
        self.ops.push(Op::Dir("/dev".into()));
        let host = |dev: &str| Path::new("/dev").join(dev);
        let nodes = DEVICES
            .iter()
            .map(|dev| (host(dev), host(dev)))
            .chain(kvm.map(|node| (node.to_path_buf(), host("kvm"))));
        for (source, path) in nodes {
            self.ops.push(Op::MountPoint(path.clone()));
            // Device nodes can neither be executed nor be set-id: no flags to set.
            let index = self.source(&source, false, 0);
            if kvm.is_some_and(|node| node == source) {
                self.sources[index].prepared = kvm_tree;
            }
            self.ops.push(Op::Attach(path, index));
        }
        for (link, target) in DEV_LINKS {
            self.ops.push(Op::Symlink(
                Path::new("/dev").join(link),
                PathBuf::from(target),
            ));
        }
    }

    /// Sandbox side: builds the root and pivots into it. Runs as the sandbox
    /// init, with full capabilities in its own user namespace only.
    pub(crate) fn build(&self) -> Result<Option<Budget>, SetupError> {
        let fs = |what: &str, e: io::Error| SetupError::io(Layer::Filesystem, what, e);
        sys::mount(c"none", c"/", c"", libc::MS_REC | libc::MS_PRIVATE, None)
            .map_err(|e| fs("making / private", e))?;
        let mut owned = Vec::with_capacity(self.sources.len());
        let mut trees = Vec::with_capacity(self.sources.len());
        for source in &self.sources {
            let tree = match source.prepared {
                Some(fd) => fd,
                None => {
                    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
                    if source.recursive {
                        flags |= libc::AT_RECURSIVE as u32;
                    }
                    let fd = sys::open_tree(libc::AT_FDCWD, &source.host, flags)
                        .map_err(|e| fs(&display(&source.host), e))?;
                    if source.attrs != 0 {
                        sys::mount_setattr(fd.as_raw_fd(), source.recursive, source.attrs, 0, None)
                            .map_err(|e| fs(&display(&source.host), e))?;
                    }
                    let raw = fd.as_raw_fd();
                    owned.push(fd);
                    raw
                }
            };
            trees.push(tree);
        }
        let stage = cpath(Path::new(STAGE))?;
        let opts = CString::new(self.root_size.as_str()).unwrap_or_default();
        sys::mount(
            c"moat-root",
            &stage,
            c"tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&opts),
        )
        .map_err(|e| fs("mounting the root tmpfs", e))?;
        let mut budget = None;
        for op in &self.ops {
            match op {
                Op::Budgeted(inside, index, slot) => {
                    let tree = trees.get(*index).copied().ok_or_else(|| {
                        SetupError::new(Layer::Filesystem, "internal: mount plan out of order")
                    })?;
                    self.budgeted(&mut budget, inside, tree, *slot)?;
                }
                op => run_op(op, &trees)?,
            }
        }
        if budget.is_some() {
            // The overlays hold the tmpfs; nothing inside reaches it but them.
            let at = staged(Path::new(BUDGET_DIR))?;
            sys::cvt(unsafe_detach(&at)).map_err(|e| fs("detaching the budget's tmpfs", e))?;
        }
        pivot_into(&stage)?;
        Ok(budget)
    }

    /// One writable root under the budget: its tree attached out of sight,
    /// an overlay with its upper layer on the budget's tmpfs where the
    /// program sees the root, and both sides kept open for the merge.
    fn budgeted(
        &self,
        budget: &mut Option<Budget>,
        inside: &Path,
        tree: RawFd,
        slot: usize,
    ) -> Result<(), SetupError> {
        let fail = |what: &str, e: io::Error| {
            SetupError::io(Layer::Storage, format!("{} ({what})", inside.display()), e)
        };
        let Some((limit, options)) = &self.budget else {
            return Err(SetupError::new(
                Layer::Storage,
                "internal: no budget planned",
            ));
        };
        if budget.is_none() {
            let at = staged(Path::new(BUDGET_DIR))?;
            make_dir(&at).map_err(|e| fail("the budget's directory", e))?;
            let options = CString::new(options.as_str()).unwrap_or_default();
            sys::mount(
                c"moat-budget",
                &at,
                c"tmpfs",
                libc::MS_NOSUID | libc::MS_NODEV,
                Some(&options),
            )
            .map_err(|e| fail("mounting the budget's tmpfs", e))?;
            let fd = open_dir(&at).map_err(|e| fail("opening the budget's tmpfs", e))?;
            *budget = Some(Budget::new(*limit, fd));
        }
        let lower = staged(&Path::new("/").join(format!(".moat-lower-{slot}")))?;
        let upper = staged(&Path::new(BUDGET_DIR).join(format!("upper-{slot}")))?;
        let work = staged(&Path::new(BUDGET_DIR).join(format!("work-{slot}")))?;
        for dir in [&lower, &upper, &work] {
            make_dir(dir).map_err(|e| fail("a layer's directory", e))?;
        }
        sys::move_mount(tree, libc::AT_FDCWD, &lower).map_err(|e| fail("attaching the root", e))?;
        let options = format!(
            "lowerdir={},upperdir={},workdir={},userxattr",
            display(&lower),
            display(&upper),
            display(&work)
        );
        let options = CString::new(options).unwrap_or_default();
        sys::mount(
            c"moat-overlay",
            &staged(inside)?,
            c"overlay",
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&options),
        )
        .map_err(|e| fail("mounting the overlay (does this kernel allow overlayfs in a user namespace, with user xattrs on tmpfs?)", e))?;
        let upper_fd = open_dir(&upper).map_err(|e| fail("opening its upper layer", e))?;
        let lower_fd = open_dir(&lower).map_err(|e| fail("opening the root", e))?;
        sys::cvt(unsafe_detach(&lower)).map_err(|e| fail("detaching the root's second view", e))?;
        // SAFETY: lower is NUL-terminated; an empty directory of the root tmpfs.
        sys::cvt(unsafe { libc::rmdir(lower.as_ptr()) })
            .map_err(|e| fail("its staging directory", e))?;
        if let Some(budget) = budget.as_mut() {
            budget.add(inside.to_path_buf(), upper_fd, lower_fd);
        }
        Ok(())
    }
}

/// Where the budget's tmpfs is mounted while the root is built (detached
/// before `pivot_root`).
const BUDGET_DIR: &str = "/.moat-budget";

fn make_dir(path: &CString) -> io::Result<()> {
    // SAFETY: path is NUL-terminated.
    if unsafe { libc::mkdir(path.as_ptr(), 0o700) } != 0 && sys::errno() != libc::EEXIST {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn open_dir(path: &CString) -> io::Result<OwnedFd> {
    // SAFETY: path is NUL-terminated; the result is checked.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor of ours.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// `umount2(path, MNT_DETACH)`.
fn unsafe_detach(path: &CString) -> libc::c_int {
    // SAFETY: path is NUL-terminated.
    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) }
}

/// Reads a file whose size is known, without the extra `stat` of `fs::read`.
fn read_small(path: &Path, size: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut content = Vec::with_capacity(usize::try_from(size).ok()? + 1);
    std::fs::File::open(path)
        .ok()?
        .read_to_end(&mut content)
        .ok()?;
    Some(content)
}

fn staged(inside: &Path) -> Result<CString, SetupError> {
    let relative = inside.strip_prefix("/").unwrap_or(inside);
    cpath(&Path::new(STAGE).join(relative))
}

fn cpath(path: &Path) -> Result<CString, SetupError> {
    sys::cstring(path).map_err(|e| SetupError::io(Layer::Filesystem, path.display(), e))
}

fn display(path: &CString) -> String {
    String::from_utf8_lossy(path.as_bytes()).into_owned()
}

fn run_op(op: &Op, trees: &[RawFd]) -> Result<(), SetupError> {
    let fail = |path: &Path, e: io::Error| SetupError::io(Layer::Filesystem, path.display(), e);
    match op {
        Op::Dir(path) => {
            let target = staged(path)?;
            // SAFETY: target is a NUL-terminated path.
            if unsafe { libc::mkdir(target.as_ptr(), 0o755) } != 0 && sys::errno() != libc::EEXIST {
                return Err(fail(path, io::Error::last_os_error()));
            }
        }
        Op::File(path, contents) => {
            let target = staged(path)?;
            std::fs::write(
                Path::new(std::ffi::OsStr::from_bytes(target.as_bytes())),
                contents,
            )
            .map_err(|e| fail(path, e))?;
        }
        Op::MountPoint(path) => {
            let target = staged(path)?;
            // Read-only, no truncation, no symlink: an existing mount point in
            // a (possibly read-only) outer root is opened, never modified.
            let flags = libc::O_RDONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            // SAFETY: target is NUL-terminated; the descriptor is closed at once.
            let fd = unsafe { libc::open(target.as_ptr(), flags, 0o644) };
            if fd < 0 {
                return Err(fail(path, io::Error::last_os_error()));
            }
            // SAFETY: fd was just opened by us.
            unsafe { libc::close(fd) };
        }
        Op::Symlink(path, to) => {
            let target = staged(path)?;
            let to = cpath(to)?;
            // SAFETY: both paths are NUL-terminated.
            if unsafe { libc::symlink(to.as_ptr(), target.as_ptr()) } != 0 {
                return Err(fail(path, io::Error::last_os_error()));
            }
        }
        Op::Attach(path, index) => {
            let target = staged(path)?;
            let tree = trees.get(*index).ok_or_else(|| {
                SetupError::new(Layer::Filesystem, "internal: mount plan out of order")
            })?;
            sys::move_mount(*tree, libc::AT_FDCWD, &target).map_err(|e| fail(path, e))?;
        }
        Op::Tmpfs(path, options, read_only) => {
            let target = staged(path)?;
            let options = CString::new(options.as_str()).unwrap_or_default();
            let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
            if *read_only {
                flags |= libc::MS_RDONLY;
            }
            sys::mount(c"tmpfs", &target, c"tmpfs", flags, Some(&options))
                .map_err(|e| fail(path, e))?;
        }
        // Built by `RootPlan::budgeted`, which holds what they need.
        Op::Budgeted(..) => {}
        Op::Proc(path) => {
            let target = staged(path)?;
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            sys::mount(c"proc", &target, c"proc", flags, None).map_err(|e| fail(path, e))?;
        }
    }
    Ok(())
}

/// `pivot_root` into the staged tmpfs, detach the old root, and make the new
/// root itself read-only (its writable parts are separate mounts).
fn pivot_into(stage: &CString) -> Result<(), SetupError> {
    let fs = |what: &str, e: io::Error| SetupError::io(Layer::Filesystem, what, e);
    // SAFETY: stage is a NUL-terminated path.
    sys::cvt(unsafe { libc::chdir(stage.as_ptr()) }).map_err(|e| fs("chdir to new root", e))?;
    sys::pivot_root(c".", c".").map_err(|e| fs("pivot_root", e))?;
    // SAFETY: "." is a valid path; the old root is stacked on it after pivot_root.
    sys::cvt(unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) })
        .map_err(|e| fs("detaching the old root", e))?;
    // SAFETY: "/" is a valid path.
    sys::cvt(unsafe { libc::chdir(c"/".as_ptr()) }).map_err(|e| fs("chdir /", e))?;
    let root = sys::open_tree(libc::AT_FDCWD, c"/", libc::OPEN_TREE_CLOEXEC)
        .map_err(|e| fs("opening the new root", e))?;
    sys::mount_setattr(root.as_raw_fd(), false, ATTR_RO, 0, None)
        .map_err(|e| fs("making the new root read-only", e))?;
    Ok(())
}
