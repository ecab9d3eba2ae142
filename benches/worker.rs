#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The worker class's invocation cost, for a trivial component (its
//! `wasi:cli/run` returns `ok`):
//! - warm: the component precompiled (its hash seen before), one
//!   invocation in a runtime that is already up — instantiation and run
//!   (target: under 1 ms);
//! - cold: the first use of a module hash — a new runtime compiling it;
//! - throughput: invocations per second on this machine's cores, one
//!   thread per core sharing one runtime (target: at least 1,000/s);
//! - whole process: `moat exec --class worker` of the component next to
//!   `moat exec -- /bin/true` (a sandbox around wasmtime, compiling the
//!   component as each run does today).
//!
//!   cargo bench --bench worker          (as root, like the other benches)

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::MOAT;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use moat_worker::{Grants, Runtime, WorkerExit, WorkerLimits};

const TRIVIAL: &str = r#"(component
  (core module $m (func (export "run") (result i32) (i32.const 0)))
  (core instance $i (instantiate $m))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $ri (export "run" (func $run)))
  (export "wasi:cli/run@0.2.6" (instance $ri)))"#;

fn limits() -> WorkerLimits {
    WorkerLimits {
        timeout: Duration::from_secs(10),
        memory_bytes: 16 << 20,
        max_output_bytes: 4096,
    }
}

fn in_process(c: &mut Criterion) {
    let args = vec!["trivial".to_owned()];
    let runtime = Runtime::new(None).unwrap();
    let loaded = runtime.load(TRIVIAL.as_bytes()).unwrap();
    let mut group = c.benchmark_group("worker");
    group.bench_function("warm invocation (precompiled)", |b| {
        b.iter(|| {
            let outcome = runtime.invoke(&loaded, &args, &limits(), &Grants::default());
            assert_eq!(outcome.exit, WorkerExit::Exited { code: 0 });
        })
    });
    group.sample_size(20);
    group.bench_function("cold invocation (first use of the hash)", |b| {
        b.iter(|| {
            let runtime = Runtime::new(None).unwrap();
            let loaded = runtime.load(TRIVIAL.as_bytes()).unwrap();
            assert!(loaded.compiled);
            let outcome = runtime.invoke(&loaded, &args, &limits(), &Grants::default());
            assert_eq!(outcome.exit, WorkerExit::Exited { code: 0 });
        })
    });
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = 500u64;
    group.throughput(Throughput::Elements(per_thread * threads as u64));
    let shared = Arc::new((runtime, loaded));
    group.bench_function(
        format!("{threads} threads x {per_thread} invocations"),
        |b| {
            b.iter_custom(|iterations| {
                let started = Instant::now();
                for _ in 0..iterations {
                    let workers: Vec<_> = (0..threads)
                        .map(|_| {
                            let shared = shared.clone();
                            std::thread::spawn(move || {
                                let args = vec!["trivial".to_owned()];
                                for _ in 0..per_thread {
                                    let outcome = shared.0.invoke(
                                        &shared.1,
                                        &args,
                                        &limits(),
                                        &Grants::default(),
                                    );
                                    assert_eq!(outcome.exit, WorkerExit::Exited { code: 0 });
                                }
                            })
                        })
                        .collect();
                    for worker in workers {
                        worker.join().unwrap();
                    }
                }
                started.elapsed()
            })
        },
    );
    group.finish();
}

fn whole_process(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("trivial.wasm");
    std::fs::write(&module, wat::parse_str(TRIVIAL).unwrap()).unwrap();
    common::make_world_accessible(dir.path());
    let run = |program: &[&str], class: &str| {
        let status = Command::new(MOAT)
            .args(["exec", "--class", class, "--"])
            .args(program)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    };
    let module = module.to_str().unwrap().to_owned();
    let mut group = c.benchmark_group("whole process");
    group.sample_size(20);
    group.bench_function("moat exec -- /bin/true", |b| {
        b.iter(|| run(&["/bin/true"], "namespace"))
    });
    group.bench_function("moat exec --class worker -- trivial.wasm", |b| {
        b.iter(|| run(&[&module], "worker"))
    });
    group.finish();
}

criterion_group!(benches, in_process, whole_process);
criterion_main!(benches);
