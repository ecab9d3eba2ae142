//! Whether any live process or thread on the host holds an id.

use std::path::Path;

/// True if a task anywhere in this pid namespace's view has `id` as one of
/// its real, effective, saved or filesystem uids or gids. Tasks that end
/// while they are read are skipped; an unreadable `/proc` is an error, never
/// "unused".
pub(crate) fn id_in_use(id: u32) -> std::io::Result<bool> {
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let tasks = match std::fs::read_dir(entry.path().join("task")) {
            Ok(tasks) => tasks,
            Err(_) => continue,
        };
        for task in tasks.flatten() {
            if task_holds(&task.path().join("status"), id) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn task_holds(status: &Path, id: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(status) else {
        return false;
    };
    text.lines()
        .filter_map(|line| {
            line.strip_prefix("Uid:")
                .or_else(|| line.strip_prefix("Gid:"))
        })
        .flat_map(str::split_whitespace)
        .any(|field| field.parse::<u32>() == Ok(id))
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
}
