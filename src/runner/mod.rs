//! `moat runner`: build and inspect sealed runners.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use moat_core::SignedManifest;

use moat_runner::seal;

use crate::manifest;

mod start;

/// Seal a manifest into a runner binary, and inspect sealed runners.
#[derive(Args)]
pub struct RunnerArgs {
    #[command(subcommand)]
    command: RunnerCommand,
}

#[derive(Subcommand)]
enum RunnerCommand {
    /// Copy this `moat` binary and append a signed manifest: the sealed
    /// runner, whose identity is the SHA-256 of the file.
    Build {
        /// The signed manifest (`moat manifest sign`).
        #[arg(long, value_name = "FILE")]
        manifest: PathBuf,
        /// The key the manifest must verify with (the control plane's public key).
        #[arg(long, value_name = "FILE")]
        trusted_key: PathBuf,
        /// Where to write the runner (must not exist).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Register with the control plane and serve its runs (sealed runners only).
    Start(Box<start::StartArgs>),
    /// Drain a registered runner: it claims nothing new, finishes the runs
    /// it holds, then stops (the org's admin token, or the deployment's).
    /// Its id is in `GET /v1/runners` and the Inspector's Runners page.
    Drain {
        #[arg(value_name = "RUNNER_ID")]
        runner: String,
        #[command(flatten)]
        target: crate::operator::Target,
    },
    /// Print a runner's identity and sealed manifest as JSON (default: this binary).
    Inspect {
        #[arg(value_name = "FILE")]
        runner: Option<PathBuf>,
    },
}

pub fn main(args: RunnerArgs) -> ExitCode {
    let result = match args.command {
        RunnerCommand::Build {
            manifest,
            trusted_key,
            out,
        } => build(manifest, trusted_key, out),
        RunnerCommand::Inspect { runner } => inspect(runner),
        RunnerCommand::Drain { runner, target } => drain(&runner, &target),
        RunnerCommand::Start(args) => return start::main(*args),
    };
    match result {
        Ok(text) => {
            outln!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("moat runner: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn drain(runner: &str, target: &crate::operator::Target) -> anyhow::Result<String> {
    let api = crate::operator::Api::new(target)?;
    let answer = api.post(
        &format!("/v1/runners/{}/drain", crate::operator::segment(runner)),
        &serde_json::json!({}),
    )?;
    Ok(format!(
        "runner {runner} is draining: it claims nothing new and stops once the {} run(s) it \
         holds have ended",
        answer["runsHeld"]
    ))
}

fn build(manifest_path: PathBuf, key: PathBuf, out: PathBuf) -> anyhow::Result<String> {
    let trusted = manifest::read_public_key(&key)?;
    let bytes =
        std::fs::read(&manifest_path).with_context(|| format!("{}", manifest_path.display()))?;
    let signed: SignedManifest =
        serde_json::from_slice(&bytes).with_context(|| format!("{}", manifest_path.display()))?;
    signed
        .verify(&trusted)
        .with_context(|| format!("{} does not verify", manifest_path.display()))?;
    let me = std::env::current_exe().context("finding this binary")?;
    if seal::read_trailer(&me)?.is_some() {
        bail!("this moat binary is itself a sealed runner: build from an unsealed one");
    }
    let binary = std::fs::read(&me).with_context(|| format!("{}", me.display()))?;
    // Written beside the target and renamed: never a partial runner.
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut temp = tempfile_in(dir)?;
    temp.1.write_all(&binary)?;
    temp.1.write_all(&seal::trailer(&bytes))?;
    temp.1.sync_all()?;
    use std::os::unix::fs::PermissionsExt;
    temp.1
        .set_permissions(std::fs::Permissions::from_mode(0o755))?;
    if out.exists() {
        let _ = std::fs::remove_file(&temp.0);
        bail!("{} exists", out.display());
    }
    std::fs::rename(&temp.0, &out).with_context(|| format!("{}", out.display()))?;
    inspect(Some(out))
}

/// A new file in `dir` with a random name, opened for writing.
fn tempfile_in(dir: &std::path::Path) -> anyhow::Result<(PathBuf, std::fs::File)> {
    for attempt in 0..16u32 {
        let name = moat_core::random::hex(8);
        let path = dir.join(format!(".moat-runner-{name}-{attempt}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("{}", dir.display())),
        }
    }
    bail!("could not create a temporary file in {}", dir.display())
}

fn inspect(runner: Option<PathBuf>) -> anyhow::Result<String> {
    let path = match runner {
        Some(path) => path,
        None => std::env::current_exe().context("finding this binary")?,
    };
    let Some((signed, _)) = seal::read_trailer(&path)? else {
        bail!(
            "{} is not a sealed runner (no manifest trailer)",
            path.display()
        );
    };
    let computed =
        moat_core::hash::canonical_hash(&signed.manifest).map_err(|e| anyhow::anyhow!("{e}"))?;
    if computed != signed.manifest_hash {
        bail!(
            "{}: the sealed manifest does not match its hash",
            path.display()
        );
    }
    let m = &signed.manifest;
    Ok(serde_json::to_string_pretty(&serde_json::json!({
        "runnerHash": seal::file_sha256(&path)?,
        "manifestHash": signed.manifest_hash,
        "signedBy": signed.signed_by,
        "policyHash": m.policy_hash,
        "environment": m.environment,
        "runnerVersion": m.runner_version,
        "allowedOps": m.allowed_ops,
        "expiresAt": m.expires_at,
    }))?)
}
