#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The verifier's speed on this machine (issue target: at least 200 MB/s
//! for CSV): 100 MB of CSV in 1 M rows, and 1,000 small files (CSV, JSON,
//! text), each judged in full: read, hashed, type detected, validated,
//! scanned for an org secret and token shapes.
//!
//!   cargo bench -p moat-export --bench verify

use std::io::Write as _;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use moat_export::{Verdict, Verifier};

const RULES: &str = r#"{"rules":[
  {"path":"*.csv","types":["csv"],"maxBytes":209715200,"csv":{"header":["id","name","email","amount","date"]}},
  {"path":"small/*","types":["json","csv","text"]}
]}"#;

fn bench(c: &mut Criterion) {
    let rules = moat_export::parse(RULES.as_bytes()).unwrap();
    let verifier = Verifier::new(
        &rules,
        &[("api-key".into(), b"sk-test-0123456789abcdef".to_vec())],
    )
    .unwrap();

    let big = tempfile::tempdir().unwrap();
    let mut csv =
        std::io::BufWriter::new(std::fs::File::create(big.path().join("clean.csv")).unwrap());
    writeln!(csv, "id,name,email,amount,date").unwrap();
    let mut i = 0u64;
    let mut written = 0u64;
    while written < 100_000_000 {
        let line = format!(
            "{i},Customer number {i},customer{i}@example.com,{}.{:02},2026-{:02}-{:02}\n",
            i * 7 % 100_000,
            i % 100,
            i % 12 + 1,
            i % 28 + 1
        );
        written += line.len() as u64;
        csv.write_all(line.as_bytes()).unwrap();
        i += 1;
    }
    drop(csv);
    let size = std::fs::metadata(big.path().join("clean.csv"))
        .unwrap()
        .len();
    eprintln!("CSV: {size} bytes, {i} rows");

    let small = tempfile::tempdir().unwrap();
    std::fs::create_dir(small.path().join("small")).unwrap();
    for n in 0..1000 {
        let body = match n % 3 {
            0 => format!("{{\"n\":{n},\"items\":[1,2,3],\"name\":\"file {n}\"}}\n"),
            1 => format!("a,b,c\n{n},{},{}\n", n * 2, n * 3),
            _ => format!("line one of {n}\nline two\n"),
        };
        std::fs::write(small.path().join("small").join(format!("f{n:04}")), body).unwrap();
    }

    let mut group = c.benchmark_group("export verifier");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Bytes(size));
    group.bench_function("100 MB CSV, 1 M rows", |b| {
        b.iter(|| {
            let report = verifier.verify_dir(big.path()).unwrap();
            assert_eq!(
                report.files[0].verdict,
                Verdict::Promoted,
                "{:?}",
                report.files[0].reasons
            );
        })
    });
    group.throughput(Throughput::Elements(1000));
    group.bench_function("1,000 small files", |b| {
        b.iter(|| {
            let report = verifier.verify_dir(small.path()).unwrap();
            assert_eq!(report.promoted, 1000);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
