#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Descriptors a spec passes to its program arrive as 3, 4, ... and nothing
//! else of the launcher's does, in a real sandbox. Without libtest's
//! harness: the launcher must be the process's only thread.

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use moat_core::Event;
use moat_sandbox::{OutputMode, SandboxSpec};

fn pipe() -> (OwnedFd, OwnedFd) {
    let (read, write) = std::io::pipe().expect("pipe");
    (read.into(), write.into())
}

fn passed_descriptors_are_the_programs_3_and_4_and_nothing_else_leaks() {
    let (to_program, for_us) = pipe();
    let (from_program, theirs) = pipe();
    // A descriptor of the launcher's own that must not reach the program.
    let (_kept_read, _kept_write) = pipe();
    let mut spec = SandboxSpec::new(
        "pass-fds",
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "read line <&3; echo \"got $line\" >&4; \
             for n in 5 6 7 8 9 10 11 12; do [ -e /proc/self/fd/$n ] && echo leaked $n; done; \
             true"
                .into(),
        ],
    );
    spec.pass_fds = vec![Arc::new(to_program), Arc::new(theirs)];
    spec.id_range = std::env::var("MOAT_UID_RANGE")
        .ok()
        .map(|r| r.parse().expect("MOAT_UID_RANGE"));
    // The machine's cgroups may not be delegated (the shell tests say so).
    spec.without_cgroup = true;
    let mut writer = std::fs::File::from(for_us);
    writer.write_all(b"hello\n").unwrap();
    drop(writer);
    let mut events: Vec<Event> = Vec::new();
    let outcome = moat_sandbox::run(spec, OutputMode::Capture, &mut events).expect("a valid spec");
    assert_eq!(
        outcome.report.exit_code,
        0,
        "{} {events:#?}",
        String::from_utf8_lossy(&outcome.stderr)
    );
    let mut said = String::new();
    std::fs::File::from(from_program)
        .read_to_string(&mut said)
        .unwrap();
    assert_eq!(said, "got hello\n");
    let stdout = String::from_utf8_lossy(&outcome.stdout);
    assert!(!stdout.contains("leaked"), "{stdout}");
}

fn more_descriptors_than_allowed_are_refused_before_anything_starts() {
    let mut spec = SandboxSpec::new("pass-fds-many", vec!["/bin/true".into()]);
    spec.pass_fds = (0..=moat_sandbox::spec::MAX_PASSED_FDS)
        .map(|_| Arc::new(pipe().0))
        .collect();
    let mut events: Vec<Event> = Vec::new();
    let refused = moat_sandbox::run(spec, OutputMode::Capture, &mut events);
    assert!(refused.is_err());
    assert!(events.is_empty(), "{events:?}");
}

fn main() {
    for (name, test) in [
        (
            "passed_descriptors_are_the_programs_3_and_4_and_nothing_else_leaks",
            passed_descriptors_are_the_programs_3_and_4_and_nothing_else_leaks as fn(),
        ),
        (
            "more_descriptors_than_allowed_are_refused_before_anything_starts",
            more_descriptors_than_allowed_are_refused_before_anything_starts,
        ),
    ] {
        test();
        println!("test {name} ... ok");
    }
}
