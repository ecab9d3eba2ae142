//! What a program wrote: the workspace's entries before and after an
//! `exec_argv`, compared by inode, size, mode and change time, never
//! following a link. Those that are new or changed under a writable root
//! (not an artifact-only one) are the export candidates.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Most entries looked at; past it, the snapshot says it is incomplete.
const MAX_ENTRIES: usize = 200_000;
/// Deepest nesting looked at.
const MAX_DEPTH: usize = 64;

/// One entry's identity and state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    ino: u64,
    size: u64,
    mode: u32,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

/// The workspace's entries (relative `/`-separated paths), directories
/// left out.
#[derive(Debug, Default)]
pub struct Snapshot {
    entries: BTreeMap<String, Meta>,
    /// Too many entries or too deep: some were not looked at.
    pub incomplete: bool,
}

impl Snapshot {
    pub fn take(root: &Path) -> Snapshot {
        let mut snapshot = Snapshot::default();
        snapshot.walk(root, "", 0);
        snapshot
    }

    fn walk(&mut self, dir: &Path, prefix: &str, depth: usize) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if self.entries.len() >= MAX_ENTRIES {
                self.incomplete = true;
                return;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = format!("{prefix}{name}");
            // `DirEntry::metadata` does not follow a symbolic link.
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                if depth + 1 >= MAX_DEPTH {
                    self.incomplete = true;
                } else {
                    self.walk(&entry.path(), &format!("{path}/"), depth + 1);
                }
                continue;
            }
            self.entries.insert(
                path,
                Meta {
                    ino: meta.ino(),
                    size: meta.size(),
                    mode: meta.mode(),
                    ctime: (meta.ctime(), meta.ctime_nsec()),
                    mtime: (meta.mtime(), meta.mtime_nsec()),
                },
            );
        }
    }

    /// Entries of `after` that are new or changed since `self`, under one
    /// of `roots` (relative; empty is the whole workspace).
    pub fn changes(&self, after: &Snapshot, roots: &[PathBuf]) -> BTreeSet<String> {
        after
            .entries
            .iter()
            .filter(|(path, meta)| {
                roots.iter().any(|root| Path::new(path).starts_with(root))
                    && self.entries.get(*path) != Some(*meta)
            })
            .map(|(path, _)| path.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_and_changed_files_under_the_roots_are_candidates() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let ws = dir.path();
        std::fs::create_dir_all(ws.join("output/sub"))?;
        std::fs::create_dir_all(ws.join("input"))?;
        std::fs::write(ws.join("output/old.txt"), "old")?;
        std::fs::write(ws.join("output/same.txt"), "same")?;
        std::fs::write(ws.join("input/data.txt"), "in")?;
        let before = Snapshot::take(ws);
        std::fs::write(ws.join("output/old.txt"), "new content")?;
        std::fs::write(ws.join("output/sub/new.csv"), "a,b\n")?;
        std::os::unix::fs::symlink("/etc/passwd", ws.join("output/link"))?;
        std::fs::write(ws.join("input/data.txt"), "changed outside the roots")?;
        let after = Snapshot::take(ws);
        let changed = before.changes(&after, &[PathBuf::from("output")]);
        let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
        assert_eq!(
            changed,
            ["output/link", "output/old.txt", "output/sub/new.csv"]
        );
        assert!(!after.incomplete);
        Ok(())
    }
}
