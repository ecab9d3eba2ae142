//! What a careful operator refuses to mount, checked before anything is.
//!
//! A declared root is a piece of the host handed to a program that may be
//! hostile. Some pieces are never fine to hand over, however the spec was
//! made: kernel interfaces (`/proc`, `/sys`, `/dev`), the host's live state
//! and configuration (`/run`, `/etc`, `/boot`, `/root`), container runtimes'
//! stores, and credential directories in any home. A root that holds one of
//! them is refused too. So is a root that holds a unix socket, a FIFO or a
//! device node: the mounts are `nodev`, but a socket would be a door to the
//! host process listening on it (launched by root, the idmapped mount even
//! makes a root-owned socket the program's own), and a FIFO a channel to
//! whoever reads it.
//!
//! The operator can exempt host paths (`--launch-allow`), and can override
//! the policy altogether; the report says which, and an override is an
//! escalation that `moat audit` lists.

use std::path::{Path, PathBuf};

use moat_core::LayerReport;

use crate::error::{Layer, SetupError};
use crate::spec::SandboxSpec;

/// Host paths no declared root may be, be under, or hold. `/root` is not
/// here: it is a home (below), and a project directory under a home is
/// the operator's own data.
const SYSTEM_PATHS: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/var/run",
    "/var/lock",
    "/boot",
    "/etc",
];

/// Container runtimes' and hypervisors' state: images, other containers'
/// filesystems, their sockets.
const RUNTIME_PATHS: &[&str] = &[
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/lib/containers",
    "/var/lib/kubelet",
    "/var/lib/cri-o",
    "/var/lib/lxd",
    "/var/lib/incus",
    "/var/lib/libvirt",
    "/var/snap/lxd",
];

/// Credentials kept in a home directory. `--root host-ro` masks the same
/// entries.
pub(crate) const CREDENTIAL_HOME_ENTRIES: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".kube",
    ".docker",
    ".config/gcloud",
    ".config/gh",
    ".azure",
    ".netrc",
    ".git-credentials",
    ".pgpass",
    ".password-store",
    ".vault-token",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".local/share/keyrings",
];

/// The operator's exceptions to the launch policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchPolicy {
    /// Host paths the operator allows as declared roots although the policy
    /// refuses them: a root at or under one of them is not checked.
    pub allow: Vec<PathBuf>,
    /// Skip the policy for every root. The run goes beyond its default
    /// boundary: the report says `not_enforced`, and audits list it.
    pub overridden: bool,
}

/// Why a root is refused.
enum Refusal {
    Is(PathBuf, &'static str),
    Holds(PathBuf, &'static str),
}

impl LaunchPolicy {
    /// Applies the policy to the spec's (validated, canonical) roots: the
    /// layer's report, or the refusal of the first root that breaks it.
    pub(crate) fn check(&self, spec: &SandboxSpec) -> Result<LayerReport, SetupError> {
        if self.overridden {
            return Ok(LayerReport::not_enforced(
                "overridden by the operator (--override-launch-policy): declared roots were not \
                 checked for system, credential or container-runtime paths, nor for sockets, \
                 FIFOs and devices inside them",
            ));
        }
        if spec.mounts.is_empty() {
            return Ok(LayerReport::enforced("no declared roots"));
        }
        let allow: Vec<PathBuf> = self
            .allow
            .iter()
            .map(|a| std::fs::canonicalize(a).unwrap_or_else(|_| a.clone()))
            .collect();
        let denied = denied_paths();
        let mut exempt = Vec::new();
        for mount in &spec.mounts {
            let host = &mount.host;
            if let Some(a) = allow.iter().find(|a| host.starts_with(a)) {
                exempt.push(format!("{} (allowed: {})", host.display(), a.display()));
                continue;
            }
            let refusal = refuse_path(host, &denied).or_else(|| special_file_under(host));
            if let Some(refusal) = refusal {
                let why = match refusal {
                    Refusal::Is(path, what) if path == *host => format!("is {what}"),
                    Refusal::Is(path, what) => format!("is under {} ({what})", path.display()),
                    Refusal::Holds(path, what) => format!("holds {} ({what})", path.display()),
                };
                return Err(SetupError::new(
                    Layer::LaunchPolicy,
                    format!(
                        "declared root {} {why}: refused (an operator may allow it with \
                         --launch-allow {}, or override the policy)",
                        host.display(),
                        host.display()
                    ),
                ));
            }
        }
        let mut detail = format!(
            "{} declared root(s) checked: none is, is under or holds a system, credential or \
             container-runtime path, and none holds a unix socket, FIFO or device",
            spec.mounts.len() - exempt.len()
        );
        if !exempt.is_empty() {
            detail.push_str(&format!(
                "; exempt by the operator's allowlist: {}",
                exempt.join(", ")
            ));
        }
        Ok(LayerReport::enforced(detail))
    }
}

/// A path the policy refuses.
struct Denied {
    path: PathBuf,
    what: &'static str,
    /// Refused below it too; a home is refused whole, not a project inside it.
    subtree: bool,
}

/// Every path the policy refuses, with what it is.
fn denied_paths() -> Vec<Denied> {
    let entry = |path: PathBuf, what, subtree| Denied {
        path,
        what,
        subtree,
    };
    let mut denied: Vec<Denied> = SYSTEM_PATHS
        .iter()
        .map(|p| entry(PathBuf::from(p), "a host system path", true))
        .chain(
            RUNTIME_PATHS
                .iter()
                .map(|p| entry(PathBuf::from(p), "a container runtime's state", true)),
        )
        .collect();
    for (home, person) in homes() {
        // A home reached through a link (`/home` -> `/var/home`) is
        // refused under both names: declared roots are canonical.
        let real = std::fs::canonicalize(&home)
            .ok()
            .filter(|real| *real != home);
        for home in std::iter::once(home).chain(real) {
            for name in CREDENTIAL_HOME_ENTRIES {
                denied.push(entry(home.join(name), "a credential path", true));
            }
            if person {
                denied.push(entry(home, "a user's home directory", false));
            }
        }
    }
    denied
}

/// Home directories from /etc/passwd, and whether each is a person's (root
/// or a uid from 1000, Debian's first regular user): a person's home is
/// refused whole, a system account's (`/bin`, `/var/www`) only for its
/// credential entries. Entries of /home count as persons' homes.
pub(crate) fn homes() -> Vec<(PathBuf, bool)> {
    let mut homes: Vec<(PathBuf, bool)> = std::fs::read_dir("/home")
        .map(|d| d.filter_map(|e| e.ok().map(|e| (e.path(), true))).collect())
        .unwrap_or_default();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    for line in passwd.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        let (Some(uid), Some(home)) = (fields.get(2), fields.get(5)) else {
            continue;
        };
        let home = PathBuf::from(home);
        if !home.is_absolute() || home == Path::new("/") {
            continue;
        }
        let uid: u32 = uid.parse().unwrap_or(0);
        let person = uid == 0 || (1000..65534).contains(&uid);
        match homes.iter_mut().find(|(h, _)| *h == home) {
            Some(known) => known.1 |= person,
            None => homes.push((home, person)),
        }
    }
    homes
}

fn refuse_path(host: &Path, denied: &[Denied]) -> Option<Refusal> {
    let under = |d: &Denied| host == d.path || (d.subtree && host.starts_with(&d.path));
    if let Some(d) = denied.iter().find(|d| under(d)) {
        return Some(Refusal::Is(d.path.clone(), d.what));
    }
    // A root above a denied path would show it, unless what is there is
    // only a symbolic link to elsewhere (`/var/run` -> `/run`), which the
    // sandbox resolves in its own tree.
    denied
        .iter()
        .filter(|d| d.path.starts_with(host))
        .find(|d| std::fs::canonicalize(&d.path).is_ok_and(|real| real == d.path))
        .map(|d| Refusal::Holds(d.path.clone(), d.what))
}

/// The first socket, FIFO or device under `root` (symbolic links are not
/// followed: inside, they resolve in the sandbox's own tree), or the first
/// directory that could not be listed: what it holds cannot be checked,
/// and the program (as the same user, unprivileged) may still reach a
/// socket in it by name.
fn special_file_under(root: &Path) -> Option<Refusal> {
    if !root.is_dir() {
        return None;
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let unlistable = || {
            Some(Refusal::Holds(
                dir.clone(),
                "a directory the launcher cannot list",
            ))
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return unlistable();
        };
        for entry in entries {
            let Ok(entry) = entry else {
                return unlistable();
            };
            let Ok(kind) = entry.file_type() else {
                return unlistable();
            };
            use std::os::unix::fs::FileTypeExt;
            let what = if kind.is_socket() {
                "a unix socket"
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_block_device() || kind.is_char_device() {
                "a device node"
            } else {
                if kind.is_dir() {
                    stack.push(entry.path());
                }
                continue;
            };
            return Some(Refusal::Holds(entry.path(), what));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied() -> Vec<Denied> {
        vec![
            Denied {
                path: PathBuf::from("/etc"),
                what: "a host system path",
                subtree: true,
            },
            Denied {
                path: PathBuf::from("/home/a/.ssh"),
                what: "a credential path",
                subtree: true,
            },
            Denied {
                path: PathBuf::from("/home/a"),
                what: "a user's home directory",
                subtree: false,
            },
        ]
    }

    #[test]
    fn roots_at_or_under_a_denied_path_are_refused() {
        for bad in [
            "/etc",
            "/etc/ssl",
            "/home/a/.ssh",
            "/home/a/.ssh/keys",
            "/home/a",
        ] {
            assert!(
                matches!(
                    refuse_path(Path::new(bad), &denied()),
                    Some(Refusal::Is(..))
                ),
                "{bad}"
            );
        }
        for fine in ["/etcetera", "/home/a/.sshx", "/home/a/project", "/srv/data"] {
            assert!(refuse_path(Path::new(fine), &denied()).is_none(), "{fine}");
        }
    }

    #[test]
    fn a_root_above_an_existing_denied_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("home/a/.ssh");
        std::fs::create_dir_all(&creds).unwrap();
        let creds = std::fs::canonicalize(creds).unwrap();
        let denied = vec![Denied {
            path: creds.clone(),
            what: "a credential path",
            subtree: true,
        }];
        let home = creds.parent().unwrap();
        assert!(matches!(
            refuse_path(home, &denied),
            Some(Refusal::Holds(p, _)) if p == creds
        ));
        // A denied path that does not exist is nothing to hide.
        let gone = vec![Denied {
            path: home.join(".aws"),
            what: "a credential path",
            subtree: true,
        }];
        assert!(refuse_path(home, &gone).is_none());
    }

    #[test]
    fn sockets_and_fifos_anywhere_under_a_root_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("file"), b"x").unwrap();
        assert!(special_file_under(dir.path()).is_none());
        let _listener = std::os::unix::net::UnixListener::bind(deep.join("s")).unwrap();
        assert!(matches!(
            special_file_under(dir.path()),
            Some(Refusal::Holds(p, "a unix socket")) if p == deep.join("s")
        ));
    }
}
