//! Incremental snapshots of a 1 GiB persistent area after a 1 MiB change:
//! how long the snapshot takes and how many bytes travel to the store.
//!
//! `cargo bench -p moat-volume --bench volume`. Two shapes of area, each
//! built once under target/bench/volume (about 2 GiB with the store):
//!   - one file of 1 GiB with 1 MiB overwritten at a random offset (the
//!     whole file is read again: its change time changed);
//!   - 1,024 files of 1 MiB with one of them rewritten (only it is read).
//!
//! Each is measured over `MOAT_VOLUME_ROUNDS` changes (default 5), on a
//! warm page cache (what a runner snapshotting right after the operation
//! that wrote the area sees). Writes target/bench/volume.json.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use moat_volume::{DirStore, Tracker};

const MIB: usize = 1 << 20;
const AREA: usize = 1 << 30;

fn noise(buf: &mut [u8], seed: &mut u64) {
    for byte in buf.iter_mut() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *byte = (*seed >> 24) as u8;
    }
}

struct Figures {
    shape: &'static str,
    full_ms: f64,
    rounds: Vec<(Duration, u64, u64)>,
}

fn measure(
    shape: &'static str,
    area: &Path,
    store: &DirStore,
    rounds: usize,
    change: &mut dyn FnMut(usize),
) -> Figures {
    let mut tracker = Tracker::new();
    let started = Instant::now();
    let full = tracker.take(area, store).unwrap();
    let full_ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(full.snapshot.bytes(), AREA as u64);
    let mut figures = Figures {
        shape,
        full_ms,
        rounds: Vec::new(),
    };
    for round in 0..rounds {
        change(round);
        let started = Instant::now();
        let taken = tracker.take(area, store).unwrap();
        let took = started.elapsed();
        figures
            .rounds
            .push((took, taken.costs.bytes_sent, taken.costs.bytes_read));
        eprintln!(
            "  {shape}: round {round}: {:.0} ms, sent {:.2} MiB, read {:.0} MiB",
            took.as_secs_f64() * 1e3,
            taken.costs.bytes_sent as f64 / MIB as f64,
            taken.costs.bytes_read as f64 / MIB as f64
        );
    }
    figures
}

fn main() {
    let rounds: usize = std::env::var("MOAT_VOLUME_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench");
    let base = target.join("volume");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let mut seed = 0x5eed_u64;
    let mut all = Vec::new();

    // One 1 GiB file.
    {
        let area = base.join("one-file");
        std::fs::create_dir_all(&area).unwrap();
        let path = area.join("model.bin");
        let mut file = std::fs::File::create(&path).unwrap();
        let mut buf = vec![0u8; 16 * MIB];
        for _ in 0..AREA / buf.len() {
            noise(&mut buf, &mut seed);
            file.write_all(&buf).unwrap();
        }
        drop(file);
        let store = DirStore::open(&base.join("store-one")).unwrap();
        let mut change_seed = 0xc4a6_u64;
        all.push(measure(
            "one 1 GiB file, 1 MiB overwritten",
            &area,
            &store,
            rounds,
            &mut |_| {
                let mut patch = vec![0u8; MIB];
                noise(&mut patch, &mut change_seed);
                let offset = (change_seed % ((AREA - MIB) as u64)) & !0xfff;
                let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                file.seek(SeekFrom::Start(offset)).unwrap();
                file.write_all(&patch).unwrap();
            },
        ));
        std::fs::remove_dir_all(&area).unwrap();
        std::fs::remove_dir_all(base.join("store-one")).unwrap();
    }

    // 1,024 files of 1 MiB.
    {
        let area = base.join("many-files");
        for d in 0..32 {
            std::fs::create_dir_all(area.join(format!("d{d:02}"))).unwrap();
        }
        let mut buf = vec![0u8; MIB];
        for i in 0..AREA / MIB {
            noise(&mut buf, &mut seed);
            std::fs::write(area.join(format!("d{:02}/f{i:04}", i % 32)), &buf).unwrap();
        }
        let store = DirStore::open(&base.join("store-many")).unwrap();
        let mut change_seed = 0xf11e_u64;
        all.push(measure(
            "1,024 files of 1 MiB, one rewritten",
            &area,
            &store,
            rounds,
            &mut |round| {
                let mut patch = vec![0u8; MIB];
                noise(&mut patch, &mut change_seed);
                let i = (round * 389) % (AREA / MIB);
                std::fs::write(area.join(format!("d{:02}/f{i:04}", i % 32)), &patch).unwrap();
            },
        ));
    }
    let _ = std::fs::remove_dir_all(&base);

    println!();
    println!("| area | full snapshot | incremental (median) | slowest | sent (max) | read (max) |");
    println!("|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for f in &all {
        let mut times: Vec<Duration> = f.rounds.iter().map(|r| r.0).collect();
        times.sort();
        let median = times[times.len() / 2].as_secs_f64() * 1e3;
        let slowest = times[times.len() - 1].as_secs_f64() * 1e3;
        let sent = f.rounds.iter().map(|r| r.1).max().unwrap_or(0) as f64 / MIB as f64;
        let read = f.rounds.iter().map(|r| r.2).max().unwrap_or(0) as f64 / MIB as f64;
        println!(
            "| {} | {:.0} ms | {median:.0} ms | {slowest:.0} ms | {sent:.2} MiB | {read:.0} MiB |",
            f.shape, f.full_ms
        );
        json.push(serde_json::json!({
            "area": f.shape, "fullMs": f.full_ms, "medianMs": median, "slowestMs": slowest,
            "maxSentMiB": sent, "maxReadMiB": read, "rounds": f.rounds.len(),
        }));
    }
    std::fs::write(
        target.join("volume.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();
}
