//! Promotion: copying a verified file out, byte for byte what was verified.
//! The source is opened beneath its directory's handle (no link followed)
//! and hashed again while copied; a file changed since its verdict is not
//! promoted. The copy lands under a temporary name and is renamed into
//! place, mode 0644, so a reader never sees half a file.

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::ExportError;

const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// The content of `rel` under `from`, if it is still `size` bytes that hash
/// to `sha256`, and still a regular file of one link without setuid/setgid
/// bits, opened beneath `from` without following any link. Never reads
/// more than `size` and one byte.
pub fn read_verified(
    from: &Path,
    rel: &str,
    sha256: &str,
    size: u64,
) -> Result<Vec<u8>, ExportError> {
    let err = |what: &str, e: std::io::Error| ExportError::Io(format!("{what} {rel}"), e);
    let src_dir = open_dir(from).map_err(|e| err("opening the source of", e.into()))?;
    let src = rustix::fs::openat2(
        &src_dir,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )
    .map_err(|e| err("opening", e.into()))?;
    let stat = rustix::fs::fstat(&src).map_err(|e| err("stat of", e.into()))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile
        || stat.st_nlink > 1
        || stat.st_mode & 0o6000 != 0
        || u64::try_from(stat.st_size).ok() != Some(size)
    {
        return Err(ExportError::Changed(rel.to_owned()));
    }
    let mut content = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::fs::File::from(src)
        .take(size.saturating_add(1))
        .read_to_end(&mut content)
        .map_err(|e| err("reading", e))?;
    if content.len() as u64 != size || moat_core::hash::sha256_hex(&content) != sha256 {
        return Err(ExportError::Changed(rel.to_owned()));
    }
    Ok(content)
}

/// Copies `content` (read with [`read_verified`]) to `rel` under `to`.
/// Returns the bytes copied.
pub fn promote(content: &[u8], rel: &str, to: &Path) -> Result<u64, ExportError> {
    let err = |what: &str, e: std::io::Error| ExportError::Io(format!("{what} {rel}"), e);
    std::fs::create_dir_all(to).map_err(|e| err("creating the destination of", e))?;
    let mut dir = open_dir(to).map_err(|e| err("opening the destination of", e.into()))?;
    let mut parts: Vec<&str> = rel.split('/').collect();
    let name = parts.pop().unwrap_or_default();
    for part in parts {
        match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(err("creating a directory for", e.into())),
        }
        dir = rustix::fs::openat2(
            &dir,
            part,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )
        .map_err(|e| err("opening a directory for", e.into()))?;
    }
    let temp = format!(".{name}.moat-export-{}", std::process::id());
    let file = rustix::fs::openat(
        &dir,
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| err("creating the copy of", e.into()))?;
    let written = (|| {
        let mut file = std::fs::File::from(file);
        file.write_all(content)?;
        file.sync_all()?;
        rustix::fs::renameat(&dir, temp.as_str(), &dir, name).map_err(std::io::Error::from)
    })();
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&dir, temp.as_str(), rustix::fs::AtFlags::empty());
        return Err(err("writing the copy of", e));
    }
    Ok(content.len() as u64)
}

fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}
