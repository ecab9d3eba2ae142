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
    /// The entries under `under` (relative roots; empty is the whole
    /// workspace), and nothing else: a large read-only input tree beside
    /// them costs nothing. A root whose path is not a directory all the
    /// way down (a link a program put in its place) is not walked.
    pub fn take(root: &Path, under: &[PathBuf]) -> Snapshot {
        let mut snapshot = Snapshot::default();
        let mut starts: Vec<&PathBuf> = under.iter().collect();
        starts.sort();
        starts.dedup();
        // A root inside another one is walked with it.
        let outer: Vec<&PathBuf> = starts
            .iter()
            .filter(|r| !starts.iter().any(|o| o != *r && r.starts_with(o)))
            .copied()
            .collect();
        for rel in outer {
            let mut dir = root.to_path_buf();
            let mut depth = 0;
            let mut real = true;
            for part in rel.components() {
                match part {
                    std::path::Component::Normal(name) => {
                        dir.push(name);
                        depth += 1;
                        // `symlink_metadata`: a link is not a directory.
                        real &= std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
                    }
                    _ => real = false,
                }
                if !real {
                    break;
                }
            }
            if !real || depth >= MAX_DEPTH {
                continue;
            }
            let prefix = if depth == 0 {
                String::new()
            } else {
                format!("{}/", rel.to_string_lossy())
            };
            snapshot.walk(&dir, &prefix, depth);
        }
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
        let roots = [PathBuf::from("output")];
        let before = Snapshot::take(ws, &roots);
        std::fs::write(ws.join("output/old.txt"), "new content")?;
        std::fs::write(ws.join("output/sub/new.csv"), "a,b\n")?;
        std::os::unix::fs::symlink("/etc/passwd", ws.join("output/link"))?;
        std::fs::write(ws.join("input/data.txt"), "changed outside the roots")?;
        let after = Snapshot::take(ws, &roots);
        let changed = before.changes(&after, &roots);
        let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
        assert_eq!(
            changed,
            ["output/link", "output/old.txt", "output/sub/new.csv"]
        );
        assert!(!after.incomplete);
        // Nothing outside the roots was looked at.
        assert!(after.entries.keys().all(|p| p.starts_with("output/")));
        Ok(())
    }

    #[test]
    fn only_the_roots_are_walked_and_a_link_in_place_of_one_is_not() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("input/big"))?;
        std::fs::create_dir_all(ws.join("out/a/deep"))?;
        std::fs::write(ws.join("input/big/data.csv"), "x")?;
        std::fs::write(ws.join("out/a/deep/r.csv"), "y")?;
        std::fs::write(ws.join("out/top.csv"), "z")?;
        // `out/a` inside `out`: walked once; `whole` covers everything.
        let nested = [PathBuf::from("out/a"), PathBuf::from("out")];
        let taken = Snapshot::take(&ws, &nested);
        let keys: Vec<&str> = taken.entries.keys().map(String::as_str).collect();
        assert_eq!(keys, ["out/a/deep/r.csv", "out/top.csv"]);
        let whole = Snapshot::take(&ws, &[PathBuf::new()]);
        assert_eq!(whole.entries.len(), 3);
        // A root replaced by a link to elsewhere is not followed.
        std::fs::create_dir_all(dir.path().join("elsewhere"))?;
        std::fs::write(dir.path().join("elsewhere/secret.txt"), "s")?;
        std::fs::remove_dir_all(ws.join("out"))?;
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), ws.join("out"))?;
        assert!(Snapshot::take(&ws, &nested).entries.is_empty());
        Ok(())
    }
}
