//! Whether any live process or thread on the host holds an id.

use std::io;
use std::path::Path;

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO`).
const HOST_PID_NS: &str = "pid:[4026531836]";

/// True if a task anywhere on the host has `id` as one of its real,
/// effective, saved or filesystem uids or gids, or among its supplementary
/// groups. Tasks that end while they are read are skipped; anything else
/// that keeps a task from being read is an error, never "unused" — and so
/// is a launcher outside the host's pid namespace, whose /proc cannot show
/// every task.
pub(crate) fn id_in_use(id: u32) -> io::Result<bool> {
    let ns = std::fs::read_link("/proc/self/ns/pid")?;
    if ns.as_os_str() != HOST_PID_NS {
        return Err(io::Error::other(
            "this launcher is not in the host's pid namespace, so /proc does not show every task",
        ));
    }
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Some(tasks) = gone_is_none(std::fs::read_dir(entry.path().join("task")))? else {
            continue;
        };
        for task in tasks {
            let Some(task) = gone_is_none(task)? else {
                continue;
            };
            let Some(status) = gone_is_none(std::fs::read_to_string(task.path().join("status")))?
            else {
                continue;
            };
            if holds(&status, id) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A task that ended meanwhile (`ENOENT`, `ESRCH`) is `None`; other errors stay.
fn gone_is_none<T>(result: io::Result<T>) -> io::Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn holds(status: &str, id: u32) -> bool {
    status
        .lines()
        .filter_map(|line| {
            line.strip_prefix("Uid:")
                .or_else(|| line.strip_prefix("Gid:"))
                .or_else(|| line.strip_prefix("Groups:"))
        })
        .flat_map(str::split_whitespace)
        .any(|field| field.parse::<u32>() == Ok(id))
}

/// Whether this process's user namespace maps every id of `first..=last`
/// (always, in the host's own; in a container, only what its map holds).
pub(crate) fn mapped_here(map: &Path, first: u32, last: u32) -> io::Result<bool> {
    let text = std::fs::read_to_string(map)?;
    Ok(text.lines().any(|line| {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        f.len() == 3 && f[0] <= u64::from(first) && u64::from(last) < f[0] + f[2]
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_this_process_and_not_an_unused_id() {
        // SAFETY: plain id query.
        let me = unsafe { libc::getuid() };
        assert!(id_in_use(me).unwrap());
        assert!(!id_in_use(4_000_000_123).unwrap());
    }

    #[test]
    fn supplementary_groups_count() {
        let status = "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t7 4000000124 \n";
        assert!(holds(status, 4_000_000_124));
        assert!(!holds(status, 4_000_000_125));
    }

    #[test]
    fn the_host_namespace_maps_everything() {
        let map = Path::new("/proc/self/uid_map");
        assert!(mapped_here(map, 0, 4_294_967_294).unwrap());
    }
}
