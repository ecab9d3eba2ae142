//! The guest's init image: `moat` itself as `/init`, the kernel modules it
//! loads (virtio transport, consoles, 9p, the NIC), in a `newc` cpio that
//! the kernel unpacks as its first root. Built once per input and cached
//! under its content hash.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use moat_core::hash::Sha256Stream;

/// Modules the init loads, each after what it depends on. Modules the
/// kernel has built in are skipped.
pub(crate) const WANTED: &[&str] = &[
    "virtio_mmio",
    "virtio_console",
    "9pnet_virtio",
    "9p",
    "virtio_net",
];

/// Directory, inside the image, of the modules and their load order.
pub(crate) const MODULE_DIR: &str = "/modules";
pub(crate) const MODULE_ORDER: &str = "/modules/order";

/// Empty directories the init mounts on.
const DIRS: &[&str] = &["dev", "proc", "sys", "tmp", "run", "run/moat", "modules"];

#[derive(Debug, thiserror::Error)]
pub(crate) enum ImageError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "kernel module {name} is neither built into the guest kernel nor under {dir} (give the \
         kernel's modules directory)"
    )]
    MissingModule { name: String, dir: PathBuf },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The modules to put in the image, in load order, as paths under `dir`.
pub(crate) fn module_files(dir: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let dep_path = dir.join("modules.dep");
    let deps = fs::read_to_string(&dep_path).map_err(io_at(&dep_path))?;
    let builtin_path = dir.join("modules.builtin");
    let builtin = fs::read_to_string(&builtin_path).unwrap_or_default();
    let name_of = |path: &str| {
        let file = path.rsplit('/').next().unwrap_or(path);
        file.trim_end_matches(".ko")
            .trim_end_matches(".ko.xz")
            .trim_end_matches(".ko.zst")
            .trim_end_matches(".ko.gz")
            .replace('-', "_")
    };
    let entry = |name: &str| {
        deps.lines().find_map(|line| {
            let (module, needs) = line.split_once(':')?;
            (name_of(module) == name).then(|| {
                (
                    module.to_owned(),
                    needs
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect::<Vec<_>>(),
                )
            })
        })
    };
    let mut order: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for wanted in WANTED {
        if builtin.lines().any(|l| name_of(l) == *wanted) {
            continue;
        }
        let Some((module, needs)) = entry(wanted) else {
            return Err(ImageError::MissingModule {
                name: (*wanted).to_owned(),
                dir: dir.to_path_buf(),
            });
        };
        // modules.dep lists every dependency, deepest last: load in reverse.
        for path in needs.iter().rev().chain(std::iter::once(&module)) {
            if seen.insert(path.clone()) {
                order.push(path.clone());
            }
        }
    }
    Ok(order.into_iter().map(|p| dir.join(p)).collect())
}

/// One file of the image.
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) source: PathBuf,
    pub(crate) mode: u32,
}

/// What the image is made of: `/init` and the modules.
pub(crate) fn entries(moat: &Path, modules: &[PathBuf]) -> Vec<Entry> {
    let mut entries = vec![Entry {
        name: "init".into(),
        source: moat.to_path_buf(),
        mode: 0o755,
    }];
    for module in modules {
        let file = module
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        entries.push(Entry {
            name: format!("{}/{file}", &MODULE_DIR[1..]),
            source: module.clone(),
            mode: 0o644,
        });
    }
    entries
}

/// A cheap key for the inputs (device, inode, size and change time of each
/// file), so that an unchanged image is found without reading 20 MB.
pub(crate) fn inputs_key(entries: &[Entry]) -> Result<String, ImageError> {
    let mut key = Sha256Stream::new();
    for entry in entries {
        let meta = fs::metadata(&entry.source).map_err(io_at(&entry.source))?;
        key.update(
            format!(
                "{}\0{}:{}:{}:{}.{}\n",
                entry.name,
                meta.dev(),
                meta.ino(),
                meta.size(),
                meta.ctime(),
                meta.ctime_nsec()
            )
            .as_bytes(),
        );
    }
    Ok(key.finish())
}

/// Writes the image to `out` and returns its SHA-256.
pub(crate) fn write(entries: &[Entry], out: &mut dyn Write) -> Result<String, ImageError> {
    let mut cpio = Cpio {
        out: HashingWriter {
            inner: out,
            hash: Sha256Stream::new(),
        },
        ino: 1,
        written: 0,
    };
    let dest = Path::new("<image>");
    for dir in DIRS {
        cpio.header(dir, 0o040_755, 0, (0, 0))
            .map_err(io_at(dest))?;
    }
    // The kernel opens /dev/console for init's standard streams.
    cpio.header("dev/console", 0o020_600, 0, (5, 1))
        .map_err(io_at(dest))?;
    let mut order = String::new();
    for entry in entries {
        let data = fs::read(&entry.source).map_err(io_at(&entry.source))?;
        cpio.file(&entry.name, 0o100_000 | entry.mode, &data)
            .map_err(io_at(dest))?;
        if let Some(file) = entry.name.strip_prefix(&MODULE_DIR[1..]) {
            order.push_str(file.trim_start_matches('/'));
            order.push('\n');
        }
    }
    cpio.file(&MODULE_ORDER[1..], 0o100_644, order.as_bytes())
        .map_err(io_at(dest))?;
    cpio.header("TRAILER!!!", 0, 0, (0, 0))
        .map_err(io_at(dest))?;
    cpio.pad().map_err(io_at(dest))?;
    Ok(cpio.out.hash.finish())
}

struct HashingWriter<'a> {
    inner: &'a mut dyn Write,
    hash: Sha256Stream,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A `newc` cpio writer (the format the kernel's initramfs unpacker reads).
struct Cpio<'a> {
    out: HashingWriter<'a>,
    ino: u32,
    written: u64,
}

impl Cpio<'_> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn align(&mut self, to: u64) -> io::Result<()> {
        let pad = (to - self.written % to) % to;
        self.put(&vec![0; pad as usize])
    }

    fn pad(&mut self) -> io::Result<()> {
        self.align(512)
    }

    fn header(&mut self, name: &str, mode: u32, size: u32, rdev: (u32, u32)) -> io::Result<()> {
        let ino = self.ino;
        self.ino += 1;
        let nlink = if mode & 0o170_000 == 0o040_000 { 2 } else { 1 };
        let fields = [
            ino,
            mode,
            0,
            0,
            nlink,
            0,
            size,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        let mut text = String::from("070701");
        for field in fields {
            text.push_str(&format!("{field:08x}"));
        }
        self.put(text.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.align(4)
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        let size = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file over 4 GiB"))?;
        self.header(name, mode, size, (0, 0))?;
        self.put(data)?;
        self.align(4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_a_newc_archive_that_cpio_lists() {
        let dir = tempfile::tempdir().unwrap();
        let init = dir.path().join("init-binary");
        fs::write(&init, b"#!not really\n").unwrap();
        let mut image = Vec::new();
        let hash = write(&entries(&init, &[]), &mut image).unwrap();
        assert_eq!(hash, moat_core::hash::sha256_hex(&image));
        assert_eq!(image.len() % 512, 0);
        let path = dir.path().join("image.cpio");
        fs::write(&path, &image).unwrap();
        let listing = std::process::Command::new("cpio")
            .args(["-t", "-v", "--quiet", "-F"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(listing.status.success(), "{listing:?}");
        let text = String::from_utf8_lossy(&listing.stdout);
        for name in ["init", "dev/console", "modules/order", "run/moat"] {
            assert!(text.lines().any(|l| l.ends_with(name)), "{name} in {text}");
        }
    }
}
