//! The VM cache: guest kernels and init images by content hash, what the
//! accelerator probe found, and each run's state directory.
//!
//! Root's cache is `/var/cache/moat/microvm`; anyone else's is under
//! `$XDG_CACHE_HOME` (or `~/.cache`); `MOAT_VM_CACHE` overrides both. The
//! directory is the caller's alone (0700); the files in it are 0644 so that
//! the jail, as the run's own host uid, can read the ones bound into it.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use moat_core::hash::Sha256Stream;

use super::config::{CONFIG_FILE, GuestConfig, GuestStatus};
use super::initramfs;

/// A file of the cache and its SHA-256.
pub(crate) struct Cached {
    pub(crate) path: PathBuf,
    pub(crate) sha256: String,
}

pub(crate) struct Cache {
    dir: PathBuf,
}

fn other(message: String) -> io::Error {
    io::Error::other(message)
}

impl Cache {
    pub(crate) fn open() -> io::Result<Cache> {
        let dir = match std::env::var_os("MOAT_VM_CACHE") {
            Some(dir) => PathBuf::from(dir),
            // SAFETY: a plain id query.
            None if unsafe { libc::geteuid() } == 0 => PathBuf::from("/var/cache/moat/microvm"),
            None => match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
                (Some(cache), _) => Path::new(&cache).join("moat/microvm"),
                (None, Some(home)) => Path::new(&home).join(".cache/moat/microvm"),
                (None, None) => {
                    return Err(other(
                        "neither MOAT_VM_CACHE, XDG_CACHE_HOME nor HOME is set".into(),
                    ));
                }
            },
        };
        for sub in ["", "index", "runs"] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir.join(sub))
                .map_err(|e| other(format!("{}: {e}", dir.join(sub).display())))?;
        }
        // Root makes KVM nodes and state directories in it, and boots what
        // it finds there: it must be root's alone.
        // SAFETY: a plain id query.
        if unsafe { libc::geteuid() } == 0 {
            use std::os::unix::fs::MetadataExt;
            let meta = fs::symlink_metadata(&dir)?;
            if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
                return Err(other(format!(
                    "{}: the VM cache of root must be a directory of root's that no one else \
                     may write",
                    dir.display()
                )));
            }
        }
        Ok(Cache { dir })
    }

    /// The guest kernel, copied into the cache (a kernel under /boot is a
    /// host system path no sandbox is given).
    pub(crate) fn kernel(&self, source: &Path) -> io::Result<Cached> {
        let entry = initramfs::Entry {
            name: "kernel".into(),
            source: source.to_path_buf(),
            mode: 0o644,
        };
        self.by_inputs("kernel", &[entry], |out| {
            let mut file =
                File::open(source).map_err(|e| other(format!("{}: {e}", source.display())))?;
            let mut hash = Sha256Stream::new();
            let mut buf = vec![0; 1 << 16];
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                hash.update(&buf[..n]);
                out.write_all(&buf[..n])?;
            }
            Ok(hash.finish())
        })
    }

    /// The kernel inside a compressed `bzImage`, when it can be booted
    /// directly (an ELF with the PVH entry note): cached beside it. QEMU
    /// then jumps to it at once, where a `bzImage` first decompresses
    /// itself in the guest, seconds under emulation. `None` when it cannot
    /// be had (not XZ-compressed, no `xz`, no PVH entry): the `bzImage` is
    /// booted as it is.
    pub(crate) fn uncompressed(&self, kernel: &Cached) -> Option<PathBuf> {
        let path = self.dir.join(format!("vmlinux-{}", kernel.sha256));
        if path.is_file() {
            return Some(path);
        }
        let image = fs::read(&kernel.path).ok()?;
        let start = find(&image, b"\xfd7zXZ\0")?;
        let temp = self
            .dir
            .join(format!(".vmlinux-{}", moat_core::random::hex(8)));
        let made = (|| {
            let out = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&temp)
                .ok()?;
            let mut xz = std::process::Command::new("xz")
                .args(["--decompress", "--stdout", "--single-stream"])
                .stdin(std::process::Stdio::piped())
                .stdout(out)
                .stderr(std::process::Stdio::null())
                .spawn()
                .ok()?;
            let mut input = xz.stdin.take()?;
            let fed = input.write_all(&image[start..]);
            drop(input);
            let done = xz.wait().ok()?;
            // xz stops reading after its stream: a broken pipe is expected.
            let _ = fed;
            if !done.success() {
                return None;
            }
            let elf = fs::read(&temp).ok()?;
            let pvh = elf.starts_with(b"\x7fELF") && has_pvh_note(&elf);
            pvh.then_some(())?;
            fs::rename(&temp, &path).ok()
        })();
        if made.is_none() {
            let _ = fs::remove_file(&temp);
        }
        made.map(|()| path)
    }

    /// The guest's init image for this `moat` and these modules.
    pub(crate) fn initramfs(&self, moat: &Path, modules: &Path) -> io::Result<Cached> {
        let files = initramfs::module_files(modules).map_err(|e| other(e.to_string()))?;
        let entries = initramfs::entries(moat, &files);
        self.by_inputs("initramfs", &entries, |out| {
            initramfs::write(&entries, out).map_err(|e| other(e.to_string()))
        })
    }

    /// Finds the file made from these inputs, or makes it: written to a
    /// temporary file, named by its content hash, indexed by the inputs.
    fn by_inputs(
        &self,
        kind: &str,
        inputs: &[initramfs::Entry],
        make: impl FnOnce(&mut dyn Write) -> io::Result<String>,
    ) -> io::Result<Cached> {
        let key = initramfs::inputs_key(inputs).map_err(|e| other(e.to_string()))?;
        let index = self.dir.join("index").join(format!("{kind}-{key}"));
        if let Ok(sha256) = fs::read_to_string(&index) {
            let sha256 = sha256.trim().to_owned();
            let path = self.dir.join(format!("{kind}-{sha256}"));
            if path.is_file() {
                return Ok(Cached { path, sha256 });
            }
        }
        let temp = self
            .dir
            .join(format!(".{kind}-{}", moat_core::random::hex(8)));
        let result = (|| {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&temp)?;
            let mut out = io::BufWriter::new(&mut file);
            let sha256 = make(&mut out)?;
            out.flush()?;
            drop(out);
            file.sync_all()?;
            let path = self.dir.join(format!("{kind}-{sha256}"));
            fs::rename(&temp, &path)?;
            write_atomically(&index, sha256.as_bytes())?;
            Ok(Cached { path, sha256 })
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }

    /// What an earlier probe found for `key`.
    pub(crate) fn probe_result(&self, key: &str) -> Option<String> {
        fs::read_to_string(self.dir.join("index").join(format!("accel-{key}"))).ok()
    }

    pub(crate) fn keep_probe_result(&self, key: &str, result: &str) {
        // A lost result costs only another probe.
        let _ = write_atomically(
            &self.dir.join("index").join(format!("accel-{key}")),
            result.as_bytes(),
        );
    }

    /// A fresh directory for one run, owned, when root makes it, by `owner`
    /// (the owner of its first writable root, whom the jail acts as; anyone
    /// else's jail acts as its launcher).
    pub(crate) fn state_dir(
        &self,
        run_id: &str,
        owner: Option<(u32, u32)>,
    ) -> io::Result<StateDir> {
        let runs = self.dir.join("runs");
        sweep_stale_runs(&runs);
        let path = runs.join(format!("{run_id}.{}", moat_core::random::hex(8)));
        fs::DirBuilder::new().mode(0o700).create(&path)?;
        let held = lock_dir(&path, libc::LOCK_EX).inspect_err(|_| {
            let _ = fs::remove_dir_all(&path);
        })?;
        let dir = StateDir { path, _held: held };
        // SAFETY: a plain id query.
        let root = unsafe { libc::geteuid() } == 0;
        if let (Some((uid, gid)), true) = (owner, root) {
            std::os::unix::fs::chown(&dir.path, Some(uid), Some(gid))?;
        }
        Ok(dir)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Whether `elf` holds the Xen PVH entry note (name `Xen`, type 18), which
/// QEMU needs to boot an uncompressed kernel.
fn has_pvh_note(elf: &[u8]) -> bool {
    const TYPE_AND_NAME: &[u8] = b"\x12\0\0\0Xen\0";
    elf.windows(TYPE_AND_NAME.len())
        .enumerate()
        .any(|(i, w)| w == TYPE_AND_NAME && i >= 8 && elf[i - 8..i - 4] == [4, 0, 0, 0])
}

fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = path.with_extension(format!("tmp-{}", moat_core::random::hex(6)));
    fs::write(&temp, bytes)?;
    fs::rename(&temp, path).inspect_err(|_| {
        let _ = fs::remove_file(&temp);
    })
}

/// One run's files: the guest's configuration (shared read-only), the
/// status port's file and the serial console's log. Removed with the run;
/// locked while it lives, so that the directory of a run whose launcher
/// was killed (no destructor ran) is found and removed by a later one.
pub(crate) struct StateDir {
    path: PathBuf,
    _held: File,
}

/// How old an unlocked run directory must be to be taken for a dead run's:
/// a new one is locked right after it is made.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// `dir`, opened and `flock`ed with `how` (not following a link).
fn lock_dir(dir: &Path, how: libc::c_int) -> io::Result<File> {
    use std::os::fd::AsRawFd as _;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)?;
    // SAFETY: flock on a descriptor this function owns.
    crate::sys::cvt(unsafe { libc::flock(file.as_raw_fd(), how) })?;
    Ok(file)
}

/// Removes the run directories no live run holds, older than
/// [`STALE_AFTER`]: what a launcher killed outright left.
fn sweep_stale_runs(runs: &Path) {
    let Ok(entries) = fs::read_dir(runs) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if old && lock_dir(&path, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// The most of the console's log quoted in an error.
const CONSOLE_TAIL: u64 = 2048;
/// The most of a status read: a status is a few hundred bytes.
const MAX_STATUS: u64 = 64 << 10;

impl StateDir {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn write_config(&self, config: &GuestConfig) -> io::Result<()> {
        let json = serde_json::to_vec(config).map_err(io::Error::other)?;
        let path = self.path.join(CONFIG_FILE);
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)?
            .write_all(&json)?;
        Ok(())
    }

    /// The guest's last status line, if it wrote a whole one.
    pub(crate) fn status(&self) -> Option<GuestStatus> {
        let file = open_regular(&self.path.join("status"))?;
        let mut text = String::new();
        file.take(MAX_STATUS).read_to_string(&mut text).ok()?;
        let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
        serde_json::from_str(line).ok()
    }

    /// The end of what the guest printed on its serial console.
    pub(crate) fn console_tail(&self) -> String {
        let Some(mut file) = open_regular(&self.path.join("console")) else {
            return "(nothing)".into();
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut bytes = Vec::new();
        use std::io::Seek;
        let _ = file.seek(io::SeekFrom::Start(len.saturating_sub(CONSOLE_TAIL)));
        let _ = file.take(CONSOLE_TAIL).read_to_end(&mut bytes);
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        if text.is_empty() {
            "(nothing)".into()
        } else {
            super::printable(&text.replace(['\r', '\n'], " | "))
        }
    }
}

/// Opens a file the jail wrote, refusing anything but a regular file (the
/// jail owns the directory and could leave a FIFO or a link there).
fn open_regular(path: &Path) -> Option<File> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// The KVM device a jail gets at `/dev/kvm`. Launched by root, a node of
/// its own, usable by whoever holds it, in a directory only root can
/// traverse: the jail's host uid is in no `kvm` group, and the host's
/// `/dev/kvm` keeps its own mode. Launched by anyone else, the host's
/// node, which that user may open or not.
pub(crate) struct KvmNode {
    dir: Option<PathBuf>,
    pub(crate) node: PathBuf,
    /// Its directory's lock, as a run's state directory's.
    _held: Option<File>,
}

impl Cache {
    pub(crate) fn kvm_node(&self) -> io::Result<KvmNode> {
        let host = Path::new("/dev/kvm");
        // SAFETY: a plain id query.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(KvmNode {
                dir: None,
                node: host.to_path_buf(),
                _held: None,
            });
        }
        use std::os::unix::fs::FileTypeExt;
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(host)?;
        if !meta.file_type().is_char_device() {
            return Err(other("/dev/kvm is not a character device".into()));
        }
        let dir = self
            .dir
            .join("runs")
            .join(format!("kvm.{}", moat_core::random::hex(8)));
        fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let held = lock_dir(&dir, libc::LOCK_EX).inspect_err(|_| {
            let _ = fs::remove_dir_all(&dir);
        })?;
        let guard = KvmNode {
            node: dir.join("kvm"),
            dir: Some(dir),
            _held: Some(held),
        };
        let path = crate::sys::cstring(&guard.node)?;
        // SAFETY: a NUL-terminated path; the node is the host's KVM device.
        crate::sys::cvt(unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o600, meta.rdev()) })?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&guard.node, fs::Permissions::from_mode(0o666))?;
        Ok(guard)
    }
}

impl Drop for KvmNode {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod sweep_tests {
    use super::*;

    #[test]
    fn only_old_unlocked_run_directories_are_swept() {
        let runs = tempfile::tempdir().expect("tempdir");
        let make = |name: &str, age: u64| {
            let dir = runs.path().join(name);
            fs::create_dir(&dir).expect("mkdir");
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            File::open(&dir)
                .and_then(|d| d.set_modified(when))
                .expect("mtime");
            dir
        };
        let dead = make("dead.1", 600);
        let live = make("live.2", 600);
        let young = make("young.3", 0);
        let _held = lock_dir(&live, libc::LOCK_EX).expect("lock");
        sweep_stale_runs(runs.path());
        assert!(!dead.exists());
        assert!(live.exists() && young.exists());
    }
}
