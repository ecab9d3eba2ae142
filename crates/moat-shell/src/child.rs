//! A `moat shell` child process serving one run over its stdin and stdout
//! (the runner's and replay's way to the shell): the sandbox launcher then
//! runs in that single-threaded child, never in the multi-threaded caller.

use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use moat_core::{Envelope, OpResult};
use moat_sandbox::hostid::IdRange;

/// Errors of a shell child.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error("starting moat shell ({program}): {source}")]
    Start {
        program: String,
        source: std::io::Error,
    },
    #[error("talking to the shell: {0}")]
    Io(#[from] std::io::Error),
    #[error("the shell ended before answering operation {0}")]
    Ended(String),
    #[error("the shell's result line for operation {op}: {message}")]
    BadLine { op: String, message: String },
    #[error("operation {0} cannot be written as JSON: {1}")]
    Encode(String, String),
}

/// The shell child serving one run; killed and reaped when dropped.
pub struct ShellChild {
    child: Child,
    /// Taken to end the shell: its input closing is its run's end.
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Drop for ShellChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ShellChild {
    /// Ends the shell as its run ends: its input closes, so it closes what
    /// the run left open (browser sessions) and records it in its ledger,
    /// within `wait`; past that it is killed.
    pub fn end(mut self, wait: std::time::Duration) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + wait;
        while std::time::Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
                _ => return,
            }
        }
    }

    /// The shell's pid, to stop it (and with it the sandbox it launched)
    /// from another thread while an operation runs.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `program shell` (`program` is the `moat` binary) over `workspace`
    /// with its state in `state`, `extra` flags (capabilities, manifest,
    /// resolver entries), and the block of host ids its sandboxes take
    /// theirs from (a root shell's default is the host's block: the
    /// child's environment is cleared, so an operator's MOAT_UID_RANGE
    /// reaches it only through this).
    pub fn start(
        program: &Path,
        state: &Path,
        workspace: &Path,
        extra: &[OsString],
        uid_range: Option<IdRange>,
    ) -> Result<ShellChild, ChildError> {
        let mut command = Command::new(program);
        command
            .arg("shell")
            .arg("--workspace")
            .arg(workspace)
            .arg("--state")
            .arg(state)
            .args(extra);
        if let Some(range) = uid_range {
            command.arg("--uid-range").arg(range.to_string());
        }
        // Nothing of this process's environment reaches the shell.
        command.env_clear().env("PATH", "/usr/bin:/bin");
        let start = |source| ChildError::Start {
            program: program.display().to_string(),
            source,
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(start)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(start(std::io::Error::other("no pipes to the child")));
        };
        Ok(ShellChild {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
        })
    }

    /// One operation: its envelope in (as JSON, with anything the caller
    /// added beside the typed fields), its result line out.
    pub fn ask_json(
        &mut self,
        envelope: &serde_json::Value,
        op_id: &str,
    ) -> Result<OpResult, ChildError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| ChildError::Ended(op_id.to_owned()))?;
        // One write for the whole line: formatted straight into the
        // unbuffered pipe, each JSON token was a system call of its own
        // (and a wake-up of the shell reading it).
        let mut sent = envelope.to_string();
        sent.push('\n');
        stdin.write_all(sent.as_bytes())?;
        stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(ChildError::Ended(op_id.to_owned()));
        }
        serde_json::from_str(&line).map_err(|e| ChildError::BadLine {
            op: op_id.to_owned(),
            message: e.to_string(),
        })
    }

    /// One operation from its envelope.
    pub fn ask(&mut self, envelope: &Envelope) -> Result<OpResult, ChildError> {
        let json = serde_json::to_value(envelope)
            .map_err(|e| ChildError::Encode(envelope.id.clone(), e.to_string()))?;
        self.ask_json(&json, &envelope.id)
    }
}
