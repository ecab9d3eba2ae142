//! A `moat shell` child serving one run (the sandbox launcher stays
//! single-threaded there), and the run's inputs written into its workspace.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, bail};
use base64::Engine as _;
use moat_sandbox::hostid::IdRange;
use serde_json::Value;

const B64: base64::engine::general_purpose::GeneralPurpose =
    base64::engine::general_purpose::STANDARD;

/// The shell child serving one run.
pub struct ShellChild {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Drop for ShellChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ShellChild {
    /// `moat shell` over `workspace` with its state in `state`, `extra`
    /// flags (capabilities, manifest, resolver entries), and the block of
    /// host ids its sandboxes take theirs from (a root shell's default is
    /// the host's block: the child's environment is cleared, so an
    /// operator's MOAT_UID_RANGE reaches it only through this).
    pub fn start(
        state: &Path,
        workspace: &Path,
        extra: &[std::ffi::OsString],
        uid_range: Option<IdRange>,
    ) -> anyhow::Result<ShellChild> {
        let me = std::env::current_exe()?;
        let mut command = Command::new(me);
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
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting moat shell")?;
        let stdin = child.stdin.take().context("shell stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("shell stdout")?);
        Ok(ShellChild {
            child,
            stdin,
            stdout,
        })
    }

    /// One operation: its envelope in, its result line out.
    pub fn ask(&mut self, envelope: &Value, op_id: &str) -> anyhow::Result<Value> {
        writeln!(self.stdin, "{envelope}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the shell ended before answering operation {op_id}");
        }
        serde_json::from_str(&line).context("the shell's result line")
    }
}

pub fn write_inputs(workspace: &Path, inputs: &Value) -> anyhow::Result<()> {
    for input in inputs.as_array().into_iter().flatten() {
        let path = input["path"].as_str().context("input without a path")?;
        if path.starts_with('/')
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            bail!("input path {path:?} is not a plain relative path");
        }
        let content = input["contentBase64"]
            .as_str()
            .with_context(|| format!("input {path}: no content"))?;
        let bytes = B64
            .decode(content)
            .with_context(|| format!("input {path}"))?;
        // Exactly the bytes the agent gave: checked against the recorded hash.
        if input["sha256"].as_str() != Some(moat_core::hash::sha256_hex(&bytes).as_str()) {
            bail!("input {path}: content does not match its sha256");
        }
        let target = workspace.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, bytes).with_context(|| format!("writing input {path}"))?;
    }
    Ok(())
}
