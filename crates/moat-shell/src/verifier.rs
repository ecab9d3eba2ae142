//! The export verifier in a sandbox of its own: this binary's hidden
//! `moat export --worker`, with the candidates, the rules and a copy of the
//! binary bound read-only, no network, bounded memory and time, secrets on
//! its stdin. It prints a JSON line before it reads a file and one per
//! verdict; a worker that dies on a file fails that file
//! (`verifier_failed`) and a new one goes on after it.
//!
//! Used by `moat export` and by the shell, which judges what each
//! `exec_argv` wrote against the manifest's `exports`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use moat_core::exports::{ExportRules, RejectRule, Rejection};
use moat_core::{EventSink, ExitStatus, NetworkMode, SandboxMode};
use moat_export::{ExportReport, FileVerdict, Progress, Verdict};
use moat_sandbox::hostid::IdRange;
use moat_sandbox::{BindMount, LaunchPolicy, OutputMode, SandboxSpec};

/// Most times the verifier is started again after it died on a file.
pub const MAX_RESTARTS: usize = 16;

/// Where the verifier sees its inputs.
const INSIDE: &str = "/export";

/// One verification.
pub struct VerifierRun<'a> {
    /// The `moat` binary (its `export --worker` judges).
    pub exe: &'a Path,
    pub rules: &'a ExportRules,
    /// The directory of candidates.
    pub from: &'a Path,
    /// The only files under `from` to judge (`None`: every file). A
    /// verdict on any other path is dropped, and a listed path the
    /// verifier says nothing of is rejected.
    pub only: Option<BTreeSet<String>>,
    /// A JSON object of secret name to value, or nothing.
    pub secrets: Vec<u8>,
    pub memory_bytes: u64,
    pub timeout: Duration,
    pub allow_degraded: bool,
    pub without_cgroup: bool,
    pub id_range: Option<IdRange>,
    pub launch_policy: LaunchPolicy,
    /// Read the candidates as their owner whoever that is (the shell, over
    /// a run's workspace); see `SandboxSpec::read_as_owner`.
    pub read_as_owner: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    #[error(transparent)]
    Rules(#[from] moat_export::ExportError),
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    #[error("the verifier's sandbox: {0}")]
    Spec(#[from] moat_sandbox::SpecError),
    #[error("the verifier's sandbox could not be set up: {0}")]
    Setup(String),
    #[error("the verifier failed ({why}){stderr}")]
    Died { why: String, stderr: String },
    #[error("the verifier died on {0} files in a row")]
    TooManyDeaths(usize),
}

/// Judges `run.from`, restarting the worker past each file it dies on.
pub fn verify(run: VerifierRun<'_>) -> Result<ExportReport, VerifierError> {
    let compiled = moat_export::compile(run.rules)?;
    // The binary and the rules go in as copies in a private directory: the
    // binary's own may sit where the launch policy refuses roots (a home).
    let scratch = Scratch::new()?;
    std::fs::copy(run.exe, scratch.0.join("moat"))
        .map_err(|e| VerifierError::Io("copying the moat binary", e))?;
    let write = |name: &str, bytes: serde_json::Result<Vec<u8>>| {
        bytes
            .map_err(std::io::Error::from)
            .and_then(|b| std::fs::write(scratch.0.join(name), b))
            .map_err(|e| VerifierError::Io("writing the verifier's inputs", e))
    };
    write("rules.json", serde_json::to_vec(run.rules))?;
    write("only.json", serde_json::to_vec(&run.only))?;
    let mut judged: Vec<FileVerdict> = Vec::new();
    // Judged already, or died on: what the next worker skips.
    let mut done: BTreeSet<String> = BTreeSet::new();
    for _ in 0..=MAX_RESTARTS {
        write("skip.json", serde_json::to_vec(&done))?;
        let worker = run_worker(&run, &scratch.0)?;
        let mut reading: Option<String> = None;
        for line in worker
            .stdout
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            match serde_json::from_slice::<Progress>(line) {
                Ok(Progress::Reading(path)) => reading = Some(path),
                // One verdict per path, the first: a worker cannot count a
                // file twice.
                Ok(Progress::Judged(verdict)) => {
                    reading = None;
                    if done.insert(verdict.path.clone()) {
                        judged.push(verdict);
                    }
                }
                // A line cut short by the worker's death is not a verdict.
                Err(_) => break,
            }
        }
        let Some(why) = worker.failure else {
            return Ok(moat_export::totals(
                &compiled,
                reconcile(judged, run.only.as_ref()),
            ));
        };
        let Some(path) = reading else {
            return Err(VerifierError::Died {
                why,
                stderr: worker.stderr_tail,
            });
        };
        let size = std::fs::symlink_metadata(run.from.join(&path)).map_or(0, |m| m.len());
        if done.insert(path.clone()) {
            judged.push(failed(
                path,
                size,
                format!("the verifier died on it: {why}"),
            ));
        }
    }
    Err(VerifierError::TooManyDeaths(MAX_RESTARTS + 1))
}

/// Only verdicts on `only`'s paths, and one for each of them: a listed
/// file the verifier said nothing of is rejected.
fn reconcile(mut judged: Vec<FileVerdict>, only: Option<&BTreeSet<String>>) -> Vec<FileVerdict> {
    let Some(only) = only else {
        return judged;
    };
    judged.retain(|v| only.contains(&v.path));
    let seen: BTreeSet<String> = judged.iter().map(|v| v.path.clone()).collect();
    for path in only.difference(&seen) {
        judged.push(failed(
            path.clone(),
            0,
            "the verifier gave no verdict on it (under a directory it could not enter?)".into(),
        ));
    }
    judged
}

fn failed(path: String, size: u64, detail: String) -> FileVerdict {
    FileVerdict {
        path,
        size,
        sha256: None,
        detected: "not judged".into(),
        exported_as: None,
        verdict: Verdict::Rejected,
        reasons: vec![Rejection {
            rule: RejectRule::VerifierFailed,
            detail,
        }],
    }
}

/// One sandboxed worker's output, and why it ended early if it did.
struct Worker {
    stdout: Vec<u8>,
    failure: Option<String>,
    stderr_tail: String,
}

fn run_worker(run: &VerifierRun<'_>, scratch: &Path) -> Result<Worker, VerifierError> {
    let inside = |name: &str| format!("{INSIDE}/{name}");
    let mut spec = SandboxSpec::new(
        format!("export-{}", moat_core::random::hex(6)),
        vec![
            inside("moat"),
            "export".into(),
            "--worker".into(),
            "--rules".into(),
            inside("rules.json"),
            "--skip".into(),
            inside("skip.json"),
            "--only".into(),
            inside("only.json"),
            "--from".into(),
            inside("candidates"),
        ],
    );
    spec.mode = SandboxMode::ReadOnly;
    spec.network = NetworkMode::Off;
    spec.allow_degraded = run.allow_degraded;
    spec.without_cgroup = run.without_cgroup;
    spec.id_range = run.id_range;
    spec.launch_policy = run.launch_policy.clone();
    spec.stdin_data = Some(run.secrets.clone());
    // A root runner's workspace is root's, mode 0700: the shell's verifier
    // reads the candidates as their owner (and nothing else of the host's).
    // `moat export` does not: there, what its user could not hand to
    // another user stays unreadable, as for any sandbox.
    if run.read_as_owner {
        spec.read_as_owner = Some(inside("candidates").into());
    }
    spec.limits.memory_bytes = run.memory_bytes;
    spec.limits.timeout_ms = u64::try_from(run.timeout.as_millis()).unwrap_or(u64::MAX);
    spec.limits.max_output_bytes = 256 << 20;
    let bind = |host: PathBuf, name: &str| BindMount {
        host,
        inside: inside(name).into(),
        writable: false,
    };
    spec.mounts = vec![
        bind(scratch.join("moat"), "moat"),
        bind(scratch.join("rules.json"), "rules.json"),
        bind(scratch.join("skip.json"), "skip.json"),
        bind(scratch.join("only.json"), "only.json"),
        bind(run.from.to_path_buf(), "candidates"),
    ];
    let outcome = moat_sandbox::run(spec, OutputMode::Capture, &mut Discard)?;
    let report = &outcome.report;
    let stderr = String::from_utf8_lossy(&outcome.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
    let stderr_tail = if tail.is_empty() {
        String::new()
    } else {
        format!(
            ": {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )
    };
    if let Some(setup) = &report.setup_error {
        return Err(VerifierError::Setup(setup.clone()));
    }
    let failure = if report.timed_out {
        Some(format!(
            "over its {} limit",
            humantime::format_duration(run.timeout)
        ))
    } else if report.oom_killed {
        Some(format!(
            "out of its {} of memory",
            moat_core::size::format_size(run.memory_bytes)
        ))
    } else {
        match report.exit {
            ExitStatus::Exited { code: 0 } => None,
            ExitStatus::Exited { code } => Some(format!("exit status {code}")),
            ExitStatus::Signaled { signal } => Some(format!("killed by signal {signal}")),
            other => Some(format!("{other:?}")),
        }
    };
    Ok(Worker {
        stdout: outcome.stdout,
        failure,
        stderr_tail,
    })
}

/// The verifier's launch events are not kept: its verdicts are the record.
struct Discard;

impl EventSink for Discard {
    fn emit(&mut self, _event: moat_core::Event) {}
}

/// A private directory of this process, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, VerifierError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let path = std::env::temp_dir().join(format!("moat-export-{}", moat_core::random::hex(8)));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| VerifierError::Io("making a scratch directory", e))?;
        Ok(Scratch(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
