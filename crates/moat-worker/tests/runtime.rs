#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The worker runtime on small components written here in WebAssembly's
//! text format (wasmtime parses it): what a guest is refused, and the
//! limits that end it. The Python guests of tests/worker.rs run the same
//! runtime through `moat exec --class worker`.

use std::time::{Duration, Instant};

use moat_worker::{Denial, Grants, Runtime, WorkerError, WorkerExit, WorkerLimits};

/// A component whose `wasi:cli/run` runs `BODY` (core instructions that
/// leave an i32 on the stack: 0 is `ok`, 1 `err`) with one page of memory.
fn command(body: &str) -> String {
    format!(
        r#"(component
  (core module $m
    (memory (export "mem") 1)
    (func (export "run") (result i32) {body}))
  (core instance $i (instantiate $m))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $ri (export "run" (func $run)))
  (export "wasi:cli/run@0.2.6" (instance $ri)))"#
    )
}

/// A component that asks WASI for a TCP socket `times` times and ends
/// `err` if the last ask was refused.
fn socket_asker(times: u32) -> String {
    let codes = "\"unknown\" \"access-denied\" \"not-supported\" \"invalid-argument\" \
        \"out-of-memory\" \"timeout\" \"concurrency-conflict\" \"not-in-progress\" \
        \"would-block\" \"invalid-state\" \"new-socket-limit\" \"address-not-bindable\" \
        \"address-in-use\" \"remote-unreachable\" \"connection-refused\" \"connection-reset\" \
        \"connection-aborted\" \"datagram-too-large\" \"name-unresolvable\" \
        \"temporary-resolver-failure\" \"permanent-resolver-failure\"";
    format!(
        r#"(component $C
  (import "wasi:sockets/tcp@0.2.6" (instance $tcp
    (export "tcp-socket" (type (sub resource)))))
  (alias export $tcp "tcp-socket" (type $tcp-socket))
  (import "wasi:sockets/tcp-create-socket@0.2.6" (instance $create
    (alias outer $C $tcp-socket (type $outer))
    (export "tcp-socket" (type $ts (eq $outer)))
    (type $fam (enum "ipv4" "ipv6"))
    (export "ip-address-family" (type $famx (eq $fam)))
    (type $ec (enum {codes}))
    (export "error-code" (type $ecx (eq $ec)))
    (type $own (own $ts))
    (type $res (result $own (error $ecx)))
    (export "create-tcp-socket" (func (param "address-family" $famx) (result $res)))))
  (core module $libc (memory (export "mem") 1))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "mem" (core memory $mem))
  (alias export $create "create-tcp-socket" (func $create-f))
  (core func $create (canon lower (func $create-f) (memory $mem)))
  (core module $m
    (import "env" "create" (func $create (param i32 i32)))
    (import "env" "mem" (memory 1))
    (func (export "run") (result i32) (local $n i32)
      (local.set $n (i32.const {times}))
      (block $done
        (loop $again
          (call $create (i32.const 0) (i32.const 8))
          (local.set $n (i32.sub (local.get $n) (i32.const 1)))
          (br_if $again (local.get $n))))
      (i32.load8_u (i32.const 8))))
  (core instance $i (instantiate $m (with "env" (instance
    (export "create" (func $create))
    (export "mem" (memory $mem))))))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $ri (export "run" (func $run)))
  (export "wasi:cli/run@0.2.6" (instance $ri)))"#
    )
}

fn limits() -> WorkerLimits {
    WorkerLimits {
        timeout: Duration::from_secs(10),
        memory_bytes: 1 << 20,
        max_output_bytes: 4096,
    }
}

fn run(runtime: &Runtime, component: &str, limits: &WorkerLimits) -> moat_worker::Outcome {
    let loaded = runtime.load(component.as_bytes()).expect("loads");
    runtime.invoke(&loaded, &["guest".into()], limits, &Grants::default())
}

#[test]
fn a_component_is_compiled_once_per_content_hash() {
    let runtime = Runtime::new(None).expect("runtime");
    let component = command("(i32.const 0)");
    let first = runtime.load(component.as_bytes()).expect("loads");
    assert!(first.compiled);
    let again = runtime.load(component.as_bytes()).expect("loads");
    assert!(!again.compiled);
    assert_eq!(first.hash, again.hash);
    let outcome = runtime.invoke(&again, &["guest".into()], &limits(), &Grants::default());
    assert_eq!(outcome.exit, WorkerExit::Exited { code: 0 });
    assert_eq!(outcome.module_hash, first.hash);
    let failing = run(&runtime, &command("(i32.const 1)"), &limits());
    assert_eq!(failing.exit, WorkerExit::Exited { code: 1 });
}

#[test]
fn the_disk_cache_spares_a_new_runtime_the_compilation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let component = command("(i32.const 0)");
    let first = Runtime::new(Some(dir.path())).expect("runtime");
    assert!(first.load(component.as_bytes()).expect("loads").compiled);
    drop(first);
    let second = Runtime::new(Some(dir.path())).expect("runtime");
    assert!(!second.load(component.as_bytes()).expect("loads").compiled);
}

#[test]
fn an_endless_loop_ends_at_the_deadline() {
    let runtime = Runtime::new(None).expect("runtime");
    let limits = WorkerLimits {
        timeout: Duration::from_millis(200),
        ..limits()
    };
    let started = Instant::now();
    let outcome = run(
        &runtime,
        &command("(loop $l (br $l)) (i32.const 0)"),
        &limits,
    );
    assert_eq!(outcome.exit, WorkerExit::TimedOut);
    assert_eq!(outcome.exit.status(), 124);
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[test]
fn memory_past_the_limit_is_refused_and_the_guest_that_then_fails_is_out_of_memory() {
    let runtime = Runtime::new(None).expect("runtime");
    // One page held; 32 more (2 MiB) is past the 1 MiB limit: memory.grow
    // answers -1 and the guest traps on it.
    let body = "(if (i32.eq (memory.grow (i32.const 32)) (i32.const -1)) (then unreachable)) \
                (i32.const 0)";
    let outcome = run(&runtime, &command(body), &limits());
    assert_eq!(outcome.exit, WorkerExit::MemoryExceeded);
    assert_eq!(outcome.exit.status(), 137);
    assert!(outcome.peak_memory_bytes <= 1 << 20);
    // Within the limit, growing works.
    let body = "(drop (memory.grow (i32.const 4))) (i32.const 0)";
    let outcome = run(&runtime, &command(body), &limits());
    assert_eq!(outcome.exit, WorkerExit::Exited { code: 0 });
    assert_eq!(outcome.peak_memory_bytes, 5 * 65536);
}

#[test]
fn a_socket_is_refused_and_recorded_and_no_host_socket_is_made() {
    let runtime = Runtime::new(None).expect("runtime");
    let before = sockets_of_this_process();
    let outcome = run(&runtime, &socket_asker(1), &limits());
    assert_eq!(outcome.exit, WorkerExit::Exited { code: 1 }, "{outcome:?}");
    assert_eq!(
        outcome.denials,
        vec![Denial::Socket {
            address: "ipv4".into(),
            purpose: "create a tcp socket".into()
        }]
    );
    assert_eq!(sockets_of_this_process(), before);
}

#[test]
fn a_guest_asking_again_and_again_cannot_grow_the_record_without_bound() {
    let runtime = Runtime::new(None).expect("runtime");
    let outcome = run(&runtime, &socket_asker(10_000), &limits());
    assert_eq!(outcome.exit, WorkerExit::Exited { code: 1 });
    assert_eq!(outcome.denials.len(), 64);
}

#[test]
fn a_core_module_or_garbage_is_not_a_component() {
    let runtime = Runtime::new(None).expect("runtime");
    for bytes in [&b"\0asm\x01\0\0\0"[..], b"not wasm at all"] {
        assert!(matches!(
            runtime.load(bytes),
            Err(WorkerError::NotAComponent(_))
        ));
    }
    // A component that exports no `wasi:cli/run` is refused as such.
    let none = "(component)";
    assert!(matches!(
        runtime.load(none.as_bytes()),
        Err(WorkerError::NoEntryPoint(_))
    ));
}

fn sockets_of_this_process() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|t| t.to_string_lossy().starts_with("socket:"))
                .unwrap_or(false)
        })
        .count()
}
