//! The workspace as the shell sees it: directory handles of the readable and
//! writable roots, and every path resolved against a root's handle with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` — never by comparing
//! strings. A path names a file under the workspace (`output/report.md`);
//! it is matched to a root by its leading components, then opened beneath
//! that root's handle, so no symlink or `..` can leave it.

mod staging;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use moat_core::DenialReason;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

pub use staging::Staged;
use staging::{Staging, Target};

/// A refused path: the reason from the closed set and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: DenialReason,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: DenialReason, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            message: message.into(),
        }
    }
}

/// I/O that failed for a reason that is not a policy denial.
#[derive(Debug)]
pub enum PathError {
    Denied(Refusal),
    Io(std::io::Error),
}

impl From<Refusal> for PathError {
    fn from(r: Refusal) -> Self {
        PathError::Denied(r)
    }
}

impl From<std::io::Error> for PathError {
    fn from(e: std::io::Error) -> Self {
        PathError::Io(e)
    }
}

struct Root {
    /// Relative to the workspace; empty for the whole workspace (`"."`).
    rel: PathBuf,
    fd: OwnedFd,
}

/// The workspace and its roots.
pub struct Workspace {
    pub path: PathBuf,
    read: Vec<Root>,
    write: Vec<Root>,
    /// This shell's private directory for staged writes.
    staging: Arc<Staging>,
}

const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

fn errno_refusal(errno: Errno, path: &str) -> PathError {
    let denied =
        |reason, what: &str| PathError::Denied(Refusal::new(reason, format!("{path}: {what}")));
    match errno {
        Errno::XDEV | Errno::LOOP => {
            denied(DenialReason::SymlinkEscape, "a link leads outside its root")
        }
        Errno::NOENT => denied(DenialReason::NotFound, "no such file or directory"),
        Errno::NOTDIR => denied(
            DenialReason::WrongFileType,
            "a path component is not a directory",
        ),
        other => PathError::Io(std::io::Error::from_raw_os_error(other.raw_os_error())),
    }
}

/// Splits a workspace-relative path into plain components, refusing
/// absolute paths, `..`, and NUL bytes. `.` components and trailing slashes
/// are dropped; other names, however odd (unicode lookalikes included), are
/// just names.
pub fn components(path: &str) -> Result<Vec<String>, Refusal> {
    if path.contains('\0') {
        return Err(Refusal::new(
            DenialReason::InvalidArgs,
            "path contains a NUL byte",
        ));
    }
    if path.starts_with('/') {
        return Err(Refusal::new(
            DenialReason::AbsolutePath,
            format!("{path}: paths are relative to the workspace"),
        ));
    }
    let mut parts = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(Refusal::new(
                    DenialReason::PathOutsideWorkspace,
                    format!("{path}: `..` is not allowed"),
                ));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(Refusal::new(DenialReason::AbsolutePath, path.to_owned()));
            }
        }
    }
    Ok(parts)
}

fn open_root(workspace: &OwnedFd, rel: &str) -> std::io::Result<Root> {
    let parts = components(rel).map_err(|r| std::io::Error::other(r.message))?;
    let rel: PathBuf = parts.iter().collect();
    let target = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel.as_path()
    };
    let fd = rustix::fs::openat2(
        workspace,
        target,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH | ResolveFlags::NO_SYMLINKS,
    )?;
    Ok(Root { rel, fd })
}

/// A directory entry listed by [`Workspace::list`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub size: u64,
}

/// What [`Workspace::read`] returns.
pub struct ReadResult {
    pub bytes: Vec<u8>,
    pub size: u64,
    pub sha256: String,
    pub truncated: bool,
}

impl Workspace {
    /// Opens the workspace and its roots. Write roots that do not exist yet
    /// are created (one directory level, never through a symlink). This
    /// shell's private directory for staged writes is made under `staging`
    /// (in the state directory, outside every root).
    pub fn open(
        path: &Path,
        read_roots: &[String],
        write_roots: &[String],
        staging: &Path,
    ) -> std::io::Result<Self> {
        let path = std::fs::canonicalize(path)?;
        let fd = rustix::fs::open(
            &path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        for root in write_roots {
            let mut dir = fd.try_clone()?;
            for part in components(root).map_err(|r| std::io::Error::other(r.message))? {
                match rustix::fs::mkdirat(&dir, part.as_str(), Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                dir = rustix::fs::openat2(
                    &dir,
                    part.as_str(),
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    BENEATH | ResolveFlags::NO_SYMLINKS,
                )?;
            }
        }
        let read = read_roots
            .iter()
            .map(|r| open_root(&fd, r))
            .collect::<Result<_, _>>()?;
        let write: Vec<Root> = write_roots
            .iter()
            .map(|r| open_root(&fd, r))
            .collect::<Result<_, _>>()?;
        let staging = Arc::new(Staging::open(staging)?);
        Ok(Workspace {
            path,
            read,
            write,
            staging,
        })
    }

    /// Host paths of the roots, for the sandbox's mounts: `(relative, host)`.
    pub fn roots(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let rels = |roots: &[Root]| roots.iter().map(|r| r.rel.clone()).collect();
        (rels(&self.read), rels(&self.write))
    }

    /// The root a path falls under (the most specific one) and the rest.
    fn locate<'a>(roots: &'a [Root], parts: &[String]) -> Option<(&'a Root, PathBuf)> {
        roots
            .iter()
            .filter(|root| {
                let rc: Vec<_> = root.rel.iter().collect();
                rc.len() <= parts.len()
                    && rc.iter().zip(parts).all(|(a, b)| a.to_string_lossy() == *b)
            })
            .max_by_key(|root| root.rel.iter().count())
            .map(|root| {
                let rest: PathBuf = parts[root.rel.iter().count()..].iter().collect();
                (root, rest)
            })
    }

    fn readable(&self, path: &str) -> Result<(&Root, PathBuf), Refusal> {
        let parts = components(path)?;
        Self::locate(&self.read, &parts).ok_or_else(|| {
            Refusal::new(
                DenialReason::PathOutsideWorkspace,
                format!("{path}: not under a readable root"),
            )
        })
    }

    /// Opens `path` beneath the readable root it falls under.
    fn open_readable(&self, path: &str, flags: OFlags) -> Result<OwnedFd, PathError> {
        let (root, rest) = self.readable(path)?;
        let target = if rest.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            rest
        };
        rustix::fs::openat2(&root.fd, &target, flags, Mode::empty(), BENEATH)
            .map_err(|e| errno_refusal(e, path))
    }

    /// Checks a working directory for `exec_argv`: a directory beneath the
    /// readable or writable root it falls under (both are mounted), resolved
    /// like every other path. Returns it relative to the workspace.
    pub fn directory(&self, path: &str) -> Result<PathBuf, PathError> {
        let parts = components(path)?;
        let roots: Vec<&Root> = self.read.iter().chain(&self.write).collect();
        let (root, rest) = roots
            .into_iter()
            .filter_map(|root| {
                Self::locate(std::slice::from_ref(root), &parts).map(|(_, rest)| (root, rest))
            })
            .max_by_key(|(root, _)| root.rel.iter().count())
            .ok_or_else(|| {
                Refusal::new(
                    DenialReason::PathOutsideWorkspace,
                    format!("{path}: not under a root of the workspace"),
                )
            })?;
        let target = if rest.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            rest
        };
        rustix::fs::openat2(
            &root.fd,
            &target,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )
        .map_err(|e| errno_refusal(e, path))?;
        Ok(parts.iter().collect())
    }

    /// Checks that `path` is a regular file beneath a readable root
    /// (resolved like every other path, never through a link) and returns
    /// where it is on the host: how a worker's component is named.
    pub fn regular_file(&self, path: &str) -> Result<PathBuf, PathError> {
        let fd = self.open_readable(path, OFlags::PATH | OFlags::CLOEXEC)?;
        let st = rustix::fs::fstat(&fd).map_err(std::io::Error::from)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Refusal::new(
                DenialReason::WrongFileType,
                format!("{path}: not a regular file"),
            )
            .into());
        }
        Ok(self
            .path
            .join(components(path)?.iter().collect::<PathBuf>()))
    }

    /// Reads up to `max` bytes from `offset`; hashes the whole file.
    pub fn read(&self, path: &str, max: u64, offset: u64) -> Result<ReadResult, PathError> {
        let fd = self.open_readable(
            path,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        )?;
        let st = rustix::fs::fstat(&fd).map_err(std::io::Error::from)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Refusal::new(
                DenialReason::WrongFileType,
                format!("{path}: not a regular file"),
            )
            .into());
        }
        if st.st_nlink > 1 {
            return Err(Refusal::new(
                DenialReason::PathOutsideWorkspace,
                format!(
                    "{path}: has {} hard links, and may alias a file outside the workspace",
                    st.st_nlink
                ),
            )
            .into());
        }
        let mut file = std::fs::File::from(fd);
        let mut hasher = moat_core::hash::Sha256Stream::new();
        let mut bytes = Vec::new();
        let mut position: u64 = 0;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            let chunk = &buf[..n];
            hasher.update(chunk);
            let start = position;
            let end = position + n as u64;
            let want_from = offset.max(start);
            let want_to = end.min(offset.saturating_add(max));
            if want_from < want_to {
                bytes.extend_from_slice(
                    &chunk[(want_from - start) as usize..(want_to - start) as usize],
                );
            }
            position = end;
        }
        Ok(ReadResult {
            truncated: position > offset.saturating_add(max),
            bytes,
            size: position,
            sha256: hasher.finish(),
        })
    }

    /// Makes every write so far durable (one `syncfs` of the workspace's
    /// filesystem covers the renames and directories of a whole batch).
    /// Returns the devices synced.
    pub fn sync(&self) -> std::io::Result<Vec<u64>> {
        let mut synced = Vec::new();
        for root in &self.write {
            let dir = rustix::fs::openat(
                &root.fd,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let device = rustix::fs::fstat(&dir)?.st_dev;
            if !synced.contains(&device) {
                rustix::fs::syncfs(&dir)?;
                synced.push(device);
            }
        }
        Ok(synced)
    }

    /// Lists a directory, depth-first, never following symlinks.
    pub fn list(
        &self,
        path: &str,
        recursive: bool,
        max: usize,
    ) -> Result<(Vec<Entry>, bool), PathError> {
        let dir = self.open_readable(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC)?;
        let base = components(path)?.join("/");
        let mut entries = Vec::new();
        let mut stack = vec![(dir, base)];
        let mut truncated = false;
        while let Some((fd, prefix)) = stack.pop() {
            let mut names: Vec<(String, FileType)> = Vec::new();
            for entry in rustix::fs::Dir::read_from(&fd).map_err(std::io::Error::from)? {
                let entry = entry.map_err(std::io::Error::from)?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name == "." || name == ".." {
                    continue;
                }
                names.push((name, entry.file_type()));
            }
            names.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, file_type) in names {
                if entries.len() >= max {
                    truncated = true;
                    return Ok((entries, truncated));
                }
                let stat = rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW).ok();
                let kind = match stat
                    .map(|s| FileType::from_raw_mode(s.st_mode))
                    .unwrap_or(file_type)
                {
                    FileType::RegularFile => "file",
                    FileType::Directory => "dir",
                    FileType::Symlink => "symlink",
                    _ => "other",
                };
                let child = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}/{name}")
                };
                entries.push(Entry {
                    path: child.clone(),
                    kind,
                    size: stat.map_or(0, |s| s.st_size as u64),
                });
                if recursive
                    && kind == "dir"
                    && let Ok(sub) = rustix::fs::openat2(
                        &fd,
                        name.as_str(),
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                        Mode::empty(),
                        BENEATH | ResolveFlags::NO_SYMLINKS,
                    )
                {
                    stack.push((sub, child));
                }
            }
        }
        Ok((entries, truncated))
    }

    /// Stages a write of `bytes` to `path` under a write root: parent
    /// directories are created (never through a symlink) and the content is
    /// written to an anonymous file (see `staging`). Nothing is visible at
    /// `path`, or under any other name the agent sees, until
    /// [`Staged::publish`], which the shell calls for a whole batch after one
    /// `syncfs` has made every staged file durable: the target never appears
    /// partial.
    ///
    /// `pending` are the writes staged earlier in the same batch, so that a
    /// second write to the same name without `overwrite` is refused.
    pub fn stage(
        &self,
        path: &str,
        bytes: &[u8],
        overwrite: bool,
        pending: &[&Staged],
    ) -> Result<Staged, PathError> {
        let parts = components(path)?;
        let (root, rest) = Self::locate(&self.write, &parts).ok_or_else(|| {
            Refusal::new(
                DenialReason::WriteOutsideOutput,
                format!("{path}: not under a writable root"),
            )
        })?;
        let mut rest: Vec<String> = rest
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        let Some(name) = rest.pop() else {
            return Err(Refusal::new(
                DenialReason::WrongFileType,
                format!("{path}: is a root directory"),
            )
            .into());
        };
        let mut dir = root.fd.try_clone()?;
        for part in &rest {
            match rustix::fs::mkdirat(&dir, part.as_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(errno_refusal(e, path)),
            }
            dir = rustix::fs::openat2(
                &dir,
                part.as_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                BENEATH | ResolveFlags::NO_SYMLINKS,
            )
            .map_err(|e| errno_refusal(e, path))?;
        }
        // The directory itself must be open for real for renameat and fsync.
        let dir = rustix::fs::openat(
            &dir,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        let dir_stat = rustix::fs::fstat(&dir).map_err(std::io::Error::from)?;
        let key = (dir_stat.st_dev, dir_stat.st_ino, name.clone());
        let exists = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile => {
                return Err(Refusal::new(
                    DenialReason::WrongFileType,
                    format!("{path}: exists and is not a regular file"),
                )
                .into());
            }
            Ok(_) => true,
            Err(Errno::NOENT) => false,
            Err(e) => return Err(errno_refusal(e, path)),
        };
        if !overwrite && (exists || pending.iter().any(|p| *p.key() == key)) {
            return Err(Refusal::new(
                DenialReason::AlreadyExists,
                format!("{path}: exists (set overwrite)"),
            )
            .into());
        }
        let target = Target {
            dir,
            name,
            overwrite,
            replace: exists,
            key,
            path: path.to_owned(),
        };
        Ok(Staged::write(target, bytes, &self.staging, true)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_refuse_escapes_and_keep_odd_names() {
        assert_eq!(
            components("output/./a/b/").unwrap(),
            vec!["output", "a", "b"]
        );
        assert_eq!(
            components("/etc/passwd").unwrap_err().reason,
            DenialReason::AbsolutePath
        );
        assert_eq!(
            components("a/../../x").unwrap_err().reason,
            DenialReason::PathOutsideWorkspace
        );
        assert_eq!(
            components("a\0b").unwrap_err().reason,
            DenialReason::InvalidArgs
        );
        assert_eq!(
            components("ｏｕｔｐｕｔ/x").unwrap(),
            vec!["ｏｕｔｐｕｔ", "x"]
        );
    }
}
