//! Snapshots of real directories into a real store on disk, and restores.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use moat_volume::store::{self, ChunkStore};
use moat_volume::{DirStore, EntryKind, Snapshot, Tracker, VolumeError};

/// Bytes that do not repeat (so chunks do not dedupe by accident).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Every entry under `root`: path → (kind, content or link target, mode).
fn tree(root: &Path) -> BTreeMap<String, (String, Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o777;
            if meta.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(
                    rel,
                    ("link".into(), target.display().to_string().into_bytes(), 0),
                );
            } else if meta.is_dir() {
                out.insert(rel, ("dir".into(), Vec::new(), 0));
                stack.push(path);
            } else {
                out.insert(
                    rel,
                    ("file".into(), std::fs::read(&path).unwrap(), mode & 0o100),
                );
            }
        }
    }
    out
}

fn sample_area(root: &Path) {
    std::fs::create_dir_all(root.join("state/deep/er")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::write(root.join("state/model.bin"), noise(5 << 20, 1)).unwrap();
    std::fs::write(root.join("state/deep/er/small.txt"), b"small").unwrap();
    std::fs::write(root.join("zero"), b"").unwrap();
    std::fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("state/model.bin", root.join("latest")).unwrap();
}

#[test]
fn an_area_restores_byte_for_byte_from_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (area, into) = (dir.path().join("area"), dir.path().join("into"));
    std::fs::create_dir_all(&area).unwrap();
    std::fs::create_dir_all(&into).unwrap();
    sample_area(&area);
    let store = DirStore::open(&dir.path().join("store")).unwrap();

    let taken = Tracker::new().take(&area, &store).unwrap();
    assert_eq!(taken.snapshot.bytes(), (5 << 20) + 5 + 18);
    assert_eq!(taken.costs.bytes_sent, taken.costs.bytes_read);
    // The stored snapshot is the one taken, under its id.
    let stored = store::get_snapshot(&store, &taken.id).unwrap();
    assert_eq!(stored, taken.snapshot);

    let mut other = Tracker::new();
    let restored = other.restore(&store, &taken.id, &into).unwrap();
    assert_eq!(restored.id, taken.id);
    assert_eq!(restored.files, 4);
    assert_eq!(tree(&area), tree(&into));
    // What was restored is known: the next snapshot sends nothing (it
    // checks the files it wrote just now), and the one after reads nothing.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let again = other.take(&into, &store).unwrap();
    assert_eq!(again.id, taken.id);
    assert_eq!(again.costs.bytes_sent, 0);
    let third = other.take(&into, &store).unwrap();
    assert_eq!(third.id, taken.id);
    assert_eq!(third.costs.bytes_read, 0);
    assert_eq!(third.costs.files_unchanged, 4);
}

#[test]
fn a_changed_megabyte_travels_as_a_few_chunks_and_unchanged_files_are_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    let big = noise(32 << 20, 2);
    std::fs::write(area.join("big.bin"), &big).unwrap();
    for i in 0..8 {
        std::fs::write(area.join(format!("f{i}")), noise(1 << 20, 10 + i)).unwrap();
    }
    let store = DirStore::open(&dir.path().join("store")).unwrap();
    let mut tracker = Tracker::new();
    // Older than a clock tick when taken, so their stamps are trusted.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let first = tracker.take(&area, &store).unwrap();
    assert_eq!(first.costs.files_unchanged, 0);

    // 1 MiB overwritten in the middle of the big file, one small file
    // deleted, one added.
    let mut changed = big.clone();
    changed[(12 << 20)..(13 << 20)].copy_from_slice(&noise(1 << 20, 99));
    std::fs::write(area.join("big.bin"), &changed).unwrap();
    std::fs::remove_file(area.join("f3")).unwrap();
    std::fs::write(area.join("new"), b"new file").unwrap();
    let second = tracker.take(&area, &store).unwrap();
    assert_eq!(second.costs.files_unchanged, 7, "{second:?}");
    assert_eq!(second.costs.bytes_read, (32 << 20) + 8);
    assert!(
        second.costs.bytes_sent <= 5 << 20,
        "a 1 MiB change sent {} bytes",
        second.costs.bytes_sent
    );
    let paths: Vec<&str> = second
        .snapshot
        .entries
        .iter()
        .map(|e| e.path.as_str())
        .collect();
    assert!(
        !paths.contains(&"f3") && paths.contains(&"new"),
        "{paths:?}"
    );

    // The new snapshot restores to the changed area; the first one still
    // restores to the first.
    for (taken, want) in [(&second, &changed), (&first, &big)] {
        let into = dir.path().join(format!("into-{}", taken.id));
        std::fs::create_dir(&into).unwrap();
        Tracker::new().restore(&store, &taken.id, &into).unwrap();
        assert_eq!(&std::fs::read(into.join("big.bin")).unwrap(), want);
    }
}

#[test]
fn a_link_in_the_area_is_kept_as_a_link_and_never_read_through() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    let canary = format!("host-secret-{}", moat_core::random::hex(8));
    let secret = dir.path().join("secret");
    std::fs::write(&secret, &canary).unwrap();
    std::os::unix::fs::symlink(&secret, area.join("leak")).unwrap();
    std::os::unix::fs::symlink(dir.path(), area.join("up")).unwrap();
    let store = DirStore::open(&dir.path().join("store")).unwrap();
    let taken = Tracker::new().take(&area, &store).unwrap();
    assert_eq!(taken.costs.bytes_read, 0);
    assert!(taken.snapshot.chunks().is_empty());
    assert!(
        taken
            .snapshot
            .entries
            .iter()
            .all(|e| matches!(e.kind, EntryKind::Symlink { .. }))
    );
    // Nothing of the secret reached the store.
    for entry in walkdir(&dir.path().join("store")) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&canary),
            "{}",
            entry.display()
        );
    }
}

fn walkdir(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn a_snapshot_that_would_write_through_a_link_or_outside_is_refused() {
    let file = |path: &str, size: u64, chunks: serde_json::Value| serde_json::json!({"path": path, "kind": "file", "mode": 420, "size": size, "chunks": chunks});
    let dir = |path: &str| serde_json::json!({"path": path, "kind": "dir", "mode": 493});
    let chunk = |len: u64| serde_json::json!([{"sha256": "ab".repeat(32), "len": len}]);
    let cases = [
        // A file under a link: the link would be followed.
        vec![
            serde_json::json!({"path": "a", "kind": "symlink", "target": "/etc"}),
            file("a/passwd", 0, serde_json::json!([])),
        ],
        // A file whose directory is not listed first.
        vec![file("x/y", 0, serde_json::json!([]))],
        // Twice the same path.
        vec![dir("x"), dir("x")],
        // A size its chunks do not add up to.
        vec![file("x", 5, serde_json::json!([]))],
        // Chunks of no bytes, or larger than any chunk is cut.
        vec![file("x", 0, chunk(0))],
        vec![file("x", 3 << 20, chunk(3 << 20))],
        // Set-id bits.
        vec![
            serde_json::json!({"path": "x", "kind": "file", "mode": 0o4755, "size": 0, "chunks": []}),
        ],
    ];
    for entries in cases {
        let case = serde_json::json!({"format": 1, "entries": entries});
        let bytes = serde_json::to_vec(&case).unwrap();
        match Snapshot::parse(&bytes) {
            Err(VolumeError::Invalid(why)) => assert!(!why.contains("does not parse"), "{why}"),
            other => panic!("{case}: {other:?}"),
        }
    }
    let wrong_format = serde_json::json!({"format": 2, "entries": []});
    assert!(Snapshot::parse(&serde_json::to_vec(&wrong_format).unwrap()).is_err());
    for path in ["../x", "/etc/passwd", "a/../../x", "", "a//b"] {
        let case =
            serde_json::json!({"format": 1, "entries": [file(path, 0, serde_json::json!([]))]});
        assert!(
            Snapshot::parse(&serde_json::to_vec(&case).unwrap()).is_err(),
            "{path}"
        );
    }
}

#[test]
fn fifos_and_sockets_are_skipped_without_blocking_and_modes_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(area.join("private")).unwrap();
    // A FIFO nobody writes to: opening it for reading would block.
    let made = std::process::Command::new("mkfifo")
        .arg(area.join("fifo"))
        .status()
        .unwrap();
    assert!(made.success());
    let _socket = std::os::unix::net::UnixListener::bind(area.join("sock")).unwrap();
    std::fs::write(area.join("private/key"), b"secret-ish").unwrap();
    std::fs::set_permissions(
        area.join("private/key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(area.join("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let store = DirStore::open(&dir.path().join("store")).unwrap();
    let taken = Tracker::new().take(&area, &store).unwrap();
    assert_eq!(taken.costs.skipped_count, 2, "{:?}", taken.costs.skipped);
    let into = dir.path().join("into");
    std::fs::create_dir(&into).unwrap();
    Tracker::new().restore(&store, &taken.id, &into).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&into.join("private")), 0o700);
    assert_eq!(mode(&into.join("private/key")), 0o600);
    assert!(!into.join("fifo").exists() && !into.join("sock").exists());
}

#[test]
fn a_same_size_rewrite_right_after_a_snapshot_or_a_restore_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    let store = DirStore::open(&dir.path().join("store")).unwrap();
    let mut tracker = Tracker::new();
    // Within the same clock tick as far as the file's times can tell.
    std::fs::write(area.join("f"), b"AAAA").unwrap();
    let first = tracker.take(&area, &store).unwrap();
    std::fs::write(area.join("f"), b"BBBB").unwrap();
    let second = tracker.take(&area, &store).unwrap();
    assert_ne!(first.id, second.id, "a same-size rewrite was missed");

    let into = dir.path().join("into");
    std::fs::create_dir(&into).unwrap();
    let mut resumed = Tracker::new();
    resumed.restore(&store, &second.id, &into).unwrap();
    std::fs::write(into.join("f"), b"CCCC").unwrap();
    let third = resumed.take(&into, &store).unwrap();
    let restored = dir.path().join("again");
    std::fs::create_dir(&restored).unwrap();
    Tracker::new()
        .restore(&store, &third.id, &restored)
        .unwrap();
    assert_eq!(std::fs::read(restored.join("f")).unwrap(), b"CCCC");
}

#[test]
fn a_chunk_left_short_by_a_crash_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    std::fs::write(area.join("data"), noise(300 << 10, 9)).unwrap();
    let root = dir.path().join("store");
    let taken = Tracker::new()
        .take(&area, &DirStore::open(&root).unwrap())
        .unwrap();
    let chunk = taken.snapshot.chunks()[0].clone();
    let stored = root
        .join("chunks")
        .join(&chunk.sha256.as_str()[..2])
        .join(chunk.sha256.as_str());
    std::fs::write(&stored, b"").unwrap();
    // What a crash before the sync would leave: a temporary file too.
    std::fs::write(root.join("tmp/left.part"), b"x").unwrap();
    let store = DirStore::open(&root).unwrap();
    assert!(!root.join("tmp/left.part").exists());
    assert_eq!(store.missing(&[&chunk]).unwrap().len(), 1);
    let again = Tracker::new().take(&area, &store).unwrap();
    assert_eq!(again.id, taken.id);
    assert_eq!(
        std::fs::metadata(&stored).unwrap().len(),
        u64::from(chunk.len)
    );
}

#[test]
fn random_edits_always_restore_to_the_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    let store = DirStore::open(&dir.path().join("store")).unwrap();
    let mut tracker = Tracker::new();
    let mut content = noise(6 << 20, 11);
    let mut x = 0x1234_5678_u64;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    for round in 0..12u64 {
        let len = content.len() as u64;
        let at = next(len + 1) as usize;
        match next(4) {
            0 => {
                let n = (next(1 << 20) as usize).min(content.len() - at);
                content[at..at + n].fill(round as u8);
            }
            1 => drop(content.splice(at..at, noise(next(1 << 20) as usize, round))),
            2 => {
                let n = (next(1 << 20) as usize).min(content.len() - at);
                drop(content.drain(at..at + n));
            }
            _ => content.truncate(at),
        }
        std::fs::write(area.join("f"), &content).unwrap();
        let taken = tracker.take(&area, &store).unwrap();
        let into = dir.path().join(format!("into-{round}"));
        std::fs::create_dir(&into).unwrap();
        Tracker::new().restore(&store, &taken.id, &into).unwrap();
        assert!(
            std::fs::read(into.join("f")).unwrap() == content,
            "round {round}"
        );
    }
}

#[test]
fn a_corrupt_or_missing_chunk_fails_the_restore() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    std::fs::write(area.join("data"), noise(1 << 20, 7)).unwrap();
    let store = DirStore::open(&dir.path().join("store")).unwrap();
    let taken = Tracker::new().take(&area, &store).unwrap();
    let chunk = taken.snapshot.chunks()[0].clone();
    let stored = dir
        .path()
        .join("store/chunks")
        .join(&chunk.sha256.as_str()[..2])
        .join(chunk.sha256.as_str());
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&stored, &bytes).unwrap();
    let into = dir.path().join("into");
    std::fs::create_dir(&into).unwrap();
    let err = Tracker::new()
        .restore(&store, &taken.id, &into)
        .unwrap_err();
    assert!(matches!(err, VolumeError::Corrupt { .. }), "{err}");

    std::fs::remove_file(&stored).unwrap();
    assert_eq!(store.missing(&[&chunk]).unwrap(), vec![chunk.clone()]);
    let into = dir.path().join("into2");
    std::fs::create_dir(&into).unwrap();
    let err = Tracker::new()
        .restore(&store, &taken.id, &into)
        .unwrap_err();
    assert!(matches!(err, VolumeError::Missing(_)), "{err}");
    // Known missing before anything was written: nothing was.
    assert_eq!(std::fs::read_dir(&into).unwrap().count(), 0);
}

#[test]
fn restore_needs_an_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    std::fs::write(area.join("data"), b"x").unwrap();
    let store = DirStore::open(&dir.path().join("store")).unwrap();
    let taken = Tracker::new().take(&area, &store).unwrap();
    let err = Tracker::new()
        .restore(&store, &taken.id, &area)
        .unwrap_err();
    assert!(matches!(err, VolumeError::NotEmpty(_)), "{err}");
    assert_eq!(std::fs::read(area.join("data")).unwrap(), b"x");
}

#[test]
fn a_file_edited_grown_or_shrunk_between_snapshots_restores_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    let store = DirStore::open(&dir.path().join("store")).unwrap();
    let mut tracker = Tracker::new();
    let mut content = noise(12 << 20, 3);
    std::fs::write(area.join("f"), &content).unwrap();
    tracker.take(&area, &store).unwrap();
    // Each edit, then what at most may travel for it.
    type Edit = (&'static str, Box<dyn Fn(&mut Vec<u8>)>, u64);
    let edits: Vec<Edit> = vec![
        (
            "overwrite",
            Box::new(|c| c[(5 << 20)..(5 << 20) + 4096].fill(1)),
            5 << 20,
        ),
        (
            "insert",
            Box::new(|c| drop(c.splice(3 << 20..3 << 20, noise(1000, 4)))),
            5 << 20,
        ),
        (
            "delete",
            Box::new(|c| drop(c.drain((7 << 20)..(7 << 20) + 70_000))),
            5 << 20,
        ),
        ("append", Box::new(|c| c.extend(noise(3 << 20, 5))), 6 << 20),
        ("truncate", Box::new(|c| c.truncate(9 << 20)), 3 << 20),
        ("rewrite", Box::new(|c| *c = noise(c.len(), 6)), 10 << 20),
        ("empty", Box::new(|c| c.clear()), 0),
        ("again", Box::new(|c| *c = noise(2 << 20, 7)), 3 << 20),
    ];
    for (what, edit, most) in edits {
        edit(&mut content);
        std::fs::write(area.join("f"), &content).unwrap();
        let taken = tracker.take(&area, &store).unwrap();
        assert!(
            taken.costs.bytes_sent <= most,
            "{what}: sent {}",
            taken.costs.bytes_sent
        );
        assert_eq!(taken.snapshot.bytes(), content.len() as u64, "{what}");
        let into = dir.path().join(format!("into-{what}"));
        std::fs::create_dir(&into).unwrap();
        Tracker::new().restore(&store, &taken.id, &into).unwrap();
        assert!(
            std::fs::read(into.join("f")).unwrap() == content,
            "{what}: restored differs"
        );
    }
}
