//! Resource limits: the host stays fine whatever the program does.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::*;

#[test]
fn a_fork_bomb_is_contained_by_the_pids_limit() {
    let marker = format!("bomb{}", token());
    let script = format!("b() {{ b | b & }}; b; sleep 1 # {marker}");
    let run = exec(
        &["--pids", "64", "--timeout", "5s"],
        &["/bin/sh", "-c", &script],
    );
    assert!(
        run.stderr.contains("fork") || run.code != 0,
        "{}",
        run.stderr
    );
    assert!(
        run.report["enforcement"]["cgroup"]["detail"]
            .as_str()
            .unwrap()
            .contains("pids 64")
    );
    // The host can still fork, and nothing of the bomb is left.
    assert!(Command::new("/bin/true").status().unwrap().success());
    assert!(
        host_processes_with(&marker).is_empty(),
        "{:?}",
        host_processes_with(&marker)
    );
}

#[test]
fn the_memory_limit_kills_a_large_allocation_and_says_oom() {
    let run = probe_run(&["--memory", "128M"], &["alloc", "1024"]);
    assert_eq!(run.code, 137, "SIGKILL: {} {}", run.stdout, run.stderr);
    assert_eq!(run.report["oomKilled"], true, "{}", run.report);
    assert_eq!(run.report["exit"]["signal"], 9);
    let peak = run.report["peakMemoryBytes"].as_u64().unwrap();
    assert!(peak <= 128 << 20, "peak {peak}");
    assert!(run.stderr.contains("memory limit"), "{}", run.stderr);
}

/// The kernel's choice when memory runs out: a sandboxed process before the
/// runner or the shell, as root and as an ordinary user.
#[test]
fn sandboxed_programs_are_the_first_the_kernel_kills_when_memory_runs_out() {
    let bin = unprivileged_copy();
    let unprivileged = bin.path().join("moat");
    for (moat, uid, degraded) in [
        (MOAT, None, &[][..]),
        (
            unprivileged.to_str().unwrap(),
            Some(65534),
            &["--allow-degraded"][..],
        ),
    ] {
        let run = exec_as(
            moat,
            degraded,
            &["/bin/cat", "/proc/self/oom_score_adj"],
            uid,
        );
        assert_eq!(run.code, 0, "{uid:?}: {}", run.stderr);
        assert_eq!(run.stdout.trim(), "1000", "{uid:?}");
        // Nor can the program lower it again.
        let lowered = exec_as(
            moat,
            degraded,
            &[
                "/bin/sh",
                "-c",
                "echo 0 > /proc/self/oom_score_adj; cat /proc/self/oom_score_adj",
            ],
            uid,
        );
        assert_eq!(lowered.stdout.trim(), "1000", "{uid:?}: {}", lowered.stderr);
    }
}

/// An ordinary user has no cgroup it may write on these machines (cgroup v1
/// hybrid; the cgroup2 hierarchy offers no memory controller). With
/// `--allow-degraded` the memory limit still holds for each process, as
/// `RLIMIT_DATA`, and the report and the finished event say so.
#[test]
fn without_a_cgroup_the_memory_limit_falls_back_to_rlimit_data() {
    let bin = unprivileged_copy();
    let moat = bin.path().join("moat");
    let moat = moat.to_str().unwrap();
    let probe_dir = format!("{}:/probe", bin.path().display());
    let args = ["--allow-degraded", "--memory", "256M", "--ro", &probe_dir];

    let big = exec_as(moat, &args, &["/probe/probe", "alloc", "1024"], Some(65534));
    assert!(!big.stdout.contains("allocated"), "{}", big.stdout);
    // Rust's allocator reports the refused allocation and aborts.
    assert_eq!(big.code, 134, "SIGABRT: {} {}", big.stdout, big.stderr);
    assert!(
        big.stderr.contains("memory allocation of"),
        "{}",
        big.stderr
    );
    let peak = big.report["peakMemoryBytes"].as_u64().unwrap();
    assert!(peak <= 256 << 20, "peak {peak}");
    assert_eq!(big.layer("cgroup"), "not_enforced", "{}", big.report);
    let cgroup = big.report["enforcement"]["cgroup"]["detail"]
        .as_str()
        .unwrap();
    assert!(cgroup.contains("RLIMIT_DATA 256M"), "{cgroup}");
    let memory = &big.report["enforcement"]["memory"];
    assert_eq!(memory["status"], "degraded", "{memory}");
    assert_eq!(memory["mechanism"], "rlimit_data", "{memory}");
    assert_eq!(memory["limit"], 256u64 << 20, "{memory}");
    assert_eq!(
        big.report["enforcement"]["pids"]["mechanism"],
        "rlimit_nproc"
    );
    let finished = big.events_of("sandbox.exec.finished");
    assert_eq!(finished.len(), 1, "{:#?}", big.events);
    assert_eq!(finished[0]["data"]["enforcement"]["memory"], *memory);
    // Nothing of the run is left on the host.
    let left = host_processes_with(&bin.path().display().to_string());
    assert!(left.is_empty(), "left behind: {left:?}");

    let small = exec_as(moat, &args, &["/probe/probe", "alloc", "64"], Some(65534));
    assert_eq!(small.code, 0, "{}", small.stderr);
    assert_eq!(small.stdout.trim(), "allocated 64");
    assert_eq!(
        small.report["enforcement"]["memory"]["mechanism"],
        "rlimit_data"
    );

    // Declared with --without-cgroup-limits instead (what a Kubernetes pod
    // needs): the run goes ahead on the same floor, the report says why,
    // and nothing else is relaxed.
    let declared = exec_as(
        moat,
        &[
            "--without-cgroup-limits",
            "--memory",
            "256M",
            "--ro",
            &probe_dir,
        ],
        &["/probe/probe", "alloc", "64"],
        Some(65534),
    );
    assert_eq!(declared.code, 0, "{}", declared.stderr);
    assert_eq!(
        declared.layer("cgroup"),
        "not_enforced",
        "{}",
        declared.report
    );
    let detail = declared.report["enforcement"]["cgroup"]["detail"]
        .as_str()
        .unwrap();
    assert!(
        detail.contains("declared: the deployment's limits bound this run"),
        "{detail}"
    );
    assert_eq!(
        declared.report["enforcement"]["memory"]["mechanism"],
        "rlimit_data"
    );
    for layer in [
        "namespaces",
        "filesystem",
        "landlock",
        "seccomp",
        "privileges",
        "rlimits",
    ] {
        assert_eq!(
            declared.layer(layer),
            "enforced",
            "{layer}: {}",
            declared.report
        );
    }

    // Without --allow-degraded the floor is not enough: the run is refused.
    let refused = exec_as(
        moat,
        &args[1..],
        &["/probe/probe", "alloc", "64"],
        Some(65534),
    );
    assert_eq!(refused.code, 125, "{}", refused.stderr);
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    let denied = refused.events_of("sandbox.exec.denied");
    assert_eq!(denied.len(), 1, "{:#?}", refused.events);
    assert!(
        denied[0]["data"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("cgroup")
    );
}

/// With a cgroup, the report's memory and pids entries name it.
#[test]
fn the_report_names_the_cgroup_as_what_bounds_memory_and_pids() {
    let run = exec(&["--memory", "200M", "--pids", "32"], &["/bin/true"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let memory = &run.report["enforcement"]["memory"];
    assert_eq!(memory["status"], "enforced", "{memory}");
    assert_eq!(memory["mechanism"], "cgroup", "{memory}");
    assert_eq!(memory["limit"], 200u64 << 20, "{memory}");
    let pids = &run.report["enforcement"]["pids"];
    assert_eq!(pids["mechanism"], "cgroup", "{pids}");
    assert_eq!(pids["limit"], 32, "{pids}");
}

/// A unique number of seconds to sleep (the marker looked for on the host),
/// and a shell line that leaves a `setsid` daemon and a double-forked orphan
/// sleeping that long.
fn sleeping_daemons() -> (String, String) {
    let marker = format!(
        "9{}",
        &token()[..7].replace(|c: char| !c.is_ascii_digit(), "7")
    );
    let daemons = format!("setsid /bin/sh -c 'sleep {marker}' & (sleep {marker} &)");
    (marker, daemons)
}

#[test]
fn the_timeout_kills_a_double_forked_daemon() {
    let (marker, daemons) = sleeping_daemons();
    let script = format!("{daemons}; sleep {marker}");
    let run = exec(&["--timeout", "1s"], &["/bin/sh", "-c", &script]);
    assert_eq!(run.code, 124);
    assert_eq!(run.report["timedOut"], true);
    assert_eq!(
        run.events_of("process.timeout").len(),
        1,
        "{:#?}",
        run.events
    );
    let left: Vec<String> = host_processes_with(&format!("sleep {marker}"));
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn output_is_capped_while_reading_and_the_launcher_stays_small() {
    let run = exec(
        &["--max-output", "1M", "--timeout", "20s"],
        &["/usr/bin/yes"],
    );
    assert!(run.stdout.len() <= 1 << 20, "{}", run.stdout.len());
    assert_eq!(run.report["stdout"]["truncated"], true);
    assert_eq!(run.report["stdout"]["bytes"], 1 << 20);
    // yes died of SIGPIPE when the stream closed; it did not run to the timeout.
    assert_eq!(run.report["timedOut"], false);
    // Bounded whatever the child prints: a megabyte of output costs the
    // launcher about the megabyte it keeps, not more. (Its size at rest is a
    // property of the build: bench/startup.sh measures the release binary.)
    let rss = run.report["launcherPeakRssKib"].as_u64().unwrap();
    let quiet = exec(&["--max-output", "1M"], &["/bin/true"]);
    let base = quiet.report["launcherPeakRssKib"].as_u64().unwrap();
    assert!(
        rss.saturating_sub(base) < 4 * 1024,
        "launcher peak RSS {rss} KiB with 1M of output, {base} KiB without"
    );
}

#[test]
fn a_full_tmp_gives_enospc_not_a_full_host_disk() {
    let name = format!("fill-{}", token());
    let script = format!("dd if=/dev/zero of=/tmp/{name} bs=1M count=8");
    let run = exec(&["--tmp-size", "2M"], &["/bin/sh", "-c", &script]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains("No space left on device"),
        "{}",
        run.stderr
    );
    assert!(!std::path::Path::new("/tmp").join(&name).exists());
}

#[test]
fn a_reader_that_never_reads_does_not_stop_the_timeout() {
    let started = std::time::Instant::now();
    let mut child = Command::new(MOAT)
        .args(["exec", "--timeout", "1s", "--", "/usr/bin/yes"])
        .stdout(std::process::Stdio::piped()) // never read
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            let _ = child.kill();
            panic!("moat did not end with its reader stalled");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(124));
}

/// init enters the run's cgroup itself (see `cgroup::enter`): from the host,
/// init and the program sit in the run's cgroups (all four v1 hierarchies
/// with a CPU limit) while the launcher stays where it was, and the run's
/// cgroups are gone afterwards.
#[test]
fn init_and_the_program_run_in_the_runs_cgroups_and_the_launcher_does_not() {
    use std::io::{BufRead, Write};
    let marker = format!("cg{}", token());
    let script = format!("echo ready; read line # {marker}");
    // With a CPU limit: on v1 that is four hierarchies, the most files init
    // gets to enter (memory, pids, cpu, cpuacct).
    let mut child = Command::new(MOAT)
        .args(["exec", "--cpus", "1.5", "--", "/bin/sh", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let launcher = child.id().to_string();
    // The v1 hierarchy of `controller`, else the unified one (v2 hosts).
    let cgroup_of = |pid: &str, controller: &str| -> String {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let line = |wanted: &dyn Fn(&str) -> bool| {
            text.lines()
                .find(|l| wanted(l.split(':').nth(1).unwrap()))
                .map(|l| l.splitn(3, ':').nth(2).unwrap().to_owned())
        };
        line(&|c| c.split(',').any(|c| c == controller))
            .or_else(|| line(&str::is_empty))
            .unwrap()
    };
    // init is a clone of the launcher, so it has the launcher's command line.
    let sandboxed: Vec<String> = host_processes_with(&marker)
        .iter()
        .map(|p| p.split(':').next().unwrap().to_owned())
        .filter(|pid| *pid != launcher)
        .collect();
    assert_eq!(sandboxed.len(), 2, "init and sh: {sandboxed:?}");
    let mut runs = Vec::new();
    for controller in ["memory", "pids", "cpu", "cpuacct"] {
        assert!(
            !cgroup_of(&launcher, controller).contains("/moat/run-"),
            "the launcher moved: {}",
            cgroup_of(&launcher, controller)
        );
        for pid in &sandboxed {
            let path = cgroup_of(pid, controller);
            assert!(path.contains("/moat/run-"), "{pid} {controller}: {path}");
            runs.push((controller, path));
        }
    }
    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    assert!(child.wait().unwrap().success());
    for (controller, path) in runs {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mount_of = |wanted: &dyn Fn(&str) -> bool| {
            mountinfo
                .lines()
                .find(|l| wanted(l))
                .map(|l| l.split(' ').nth(4).unwrap().to_owned())
        };
        let dir = mount_of(&|l| l.contains(" - cgroup ") && l.ends_with(&format!(",{controller}")))
            .or_else(|| mount_of(&|l| l.contains(" - cgroup2 ")))
            .unwrap();
        let path = std::path::Path::new(&dir).join(path.trim_start_matches('/'));
        assert!(!path.exists(), "{} left behind", path.display());
    }
}

/// When the program exits, what it left running (a daemon holding its
/// stdout, an orphan) is killed and reaped before moat returns, and the exit
/// status is the program's own.
#[test]
fn what_the_program_leaves_running_is_killed_when_it_exits() {
    let (marker, daemons) = sleeping_daemons();
    let script = format!("{daemons}; echo left; exit 3");
    let run = exec(&["--timeout", "30s"], &["/bin/sh", "-c", &script]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.stdout, "left\n");
    assert_eq!(run.report["timedOut"], false);
    assert_eq!(run.report["exit"]["code"], 3, "{}", run.report);
    let left = host_processes_with(&format!("sleep {marker}"));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The report accounts what the program used: a one-second CPU loop at
/// 1000 ms and a 200 MiB allocation's peak, each within 10%, and the most
/// processes alive at once.
#[test]
fn cpu_time_and_peak_memory_are_accounted_within_ten_percent() {
    let busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass";
    let run = exec(&[], &["/usr/bin/python3", "-c", busy]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let cpu = run.report["cpuMs"].as_u64().unwrap();
    assert!((900..=1100).contains(&cpu), "cpuMs {cpu}: {}", run.report);

    let fill = "b = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1";
    let run = exec(&["--memory", "1G"], &["/usr/bin/python3", "-c", fill]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let peak = run.report["peakMemoryBytes"].as_u64().unwrap();
    let wanted = 200u64 << 20;
    assert!(
        peak >= wanted * 9 / 10 && peak <= wanted * 11 / 10,
        "peakMemoryBytes {peak}: {}",
        run.report
    );

    // Ten children alive at once, beside init and the shell.
    let run = exec(
        &[],
        &[
            "/bin/sh",
            "-c",
            "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.3 & done; wait",
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let pids = run.report["peakPids"].as_u64().unwrap();
    assert!((12..=14).contains(&pids), "peakPids {pids}: {}", run.report);
}
