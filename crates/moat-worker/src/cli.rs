//! The `moat-worker` binary: runs one WebAssembly component. `moat exec
//! --class worker` starts it inside a namespace sandbox; run by hand
//! outside one it works, with the wasmtime process itself unconfined.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::{Grants, Runtime, WorkerLimits};
use clap::{Parser, Subcommand};
use moat_core::size::parse_size;

/// Run WebAssembly components (WASI 0.2) with only the bindings granted.
#[derive(Parser)]
#[command(name = "moat-worker", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a component's `wasi:cli/run` once. The guest's output is this
    /// process's; its exit status is the guest's (124: the deadline
    /// passed, 137: memory ran out, 134: it trapped, 125: it could not be
    /// loaded).
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The component (a `.wasm` file).
    module: PathBuf,
    /// Wall-clock deadline in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    timeout_ms: u64,
    /// Linear memory the guest may hold (e.g. 64M).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    memory: u64,
    /// Bytes of stdout and of stderr kept (each).
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_size)]
    max_output: u64,
    /// Grant the `inputs` binding: files under DIR, read-only.
    #[arg(long, value_name = "DIR")]
    inputs: Option<PathBuf>,
    /// Grant the `outputs` binding: files written under DIR.
    #[arg(long, value_name = "DIR")]
    outputs: Option<PathBuf>,
    /// Grant the `http` binding: requests through the egress proxy that
    /// this process's HTTP_PROXY names (its sandbox's, in allowlist mode).
    #[arg(long)]
    http: bool,
    /// Grant the `kv` binding over the namespaces of FILE (a JSON
    /// snapshot: {"namespaces": {NAME: {KEY: BASE64}}}); writes go to
    /// --effects.
    #[arg(long, value_name = "FILE")]
    kv: Option<PathBuf>,
    /// Let `queue.send` send to NAME (repeatable); sends go to --effects.
    #[arg(long = "queue", value_name = "NAME")]
    queues: Vec<String>,
    /// The message (a JSON file) `queue.message` returns.
    #[arg(long, value_name = "FILE")]
    message: Option<PathBuf>,
    /// Write the kv writes and queue sends the guest asked for to FILE
    /// (JSON; made new, never overwritten).
    #[arg(long, value_name = "FILE")]
    effects: Option<PathBuf>,
    /// Bytes all outputs together may hold.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    max_write: u64,
    /// Keep compiled code in DIR (the host's alone: it is run as code).
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// Write the outcome (JSON, without the output) to this open
    /// descriptor.
    #[arg(long, value_name = "FD")]
    result_fd: Option<i32>,
    /// The guest's arguments after its name.
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

/// The binary's whole `main`.
pub fn main() -> ExitCode {
    let Command::Run(args) = Cli::parse().command;
    match run(args) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("moat-worker: {e:#}");
            ExitCode::from(125)
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<u8> {
    use anyhow::Context;
    let mut result = match args.result_fd {
        None => None,
        Some(fd) if fd > 2 => {
            // The descriptor is one the caller opened for us; a number that
            // is not open fails at the first write.
            Some(fd_file(fd)?)
        }
        Some(fd) => anyhow::bail!("--result-fd {fd}: must be above 2"),
    };
    let kv = match &args.kv {
        None => None,
        Some(path) => {
            let text =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let snapshot: moat_worker_api::KvSnapshot = serde_json::from_slice(&text)
                .with_context(|| format!("{}: not a kv snapshot", path.display()))?;
            Some(snapshot)
        }
    };
    let message = match &args.message {
        None => None,
        Some(path) => {
            let text =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let value: serde_json::Value = serde_json::from_slice(&text)
                .with_context(|| format!("{}: the message is not JSON", path.display()))?;
            Some(value.to_string())
        }
    };
    for queue in &args.queues {
        if !moat_worker_api::valid_name(queue) {
            anyhow::bail!("--queue {queue:?}: not a queue's name (a-z 0-9 _ . -, at most 64)");
        }
    }
    if (args.kv.is_some() || !args.queues.is_empty()) && args.effects.is_none() {
        anyhow::bail!("--kv and --queue need --effects FILE, where the writes and sends go");
    }
    let bytes = std::fs::read(&args.module)
        .with_context(|| format!("reading {}", args.module.display()))?;
    let runtime = Runtime::new(args.cache.as_deref())?;
    let loaded = runtime.load(&bytes)?;
    let name = args
        .module
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "worker".into());
    let mut argv = vec![name];
    argv.extend(args.args);
    let limits = WorkerLimits {
        timeout: Duration::from_millis(args.timeout_ms),
        memory_bytes: args.memory,
        max_output_bytes: args.max_output,
    };
    let grants = Grants {
        inputs: args.inputs,
        outputs: args.outputs,
        max_output_bytes: args.max_write,
        // A read lands in the guest's memory: no more than it may hold.
        max_read_bytes: args.memory,
        http_proxy: match args.http {
            false => None,
            true => Some(std::env::var("HTTP_PROXY").map_err(|_| {
                anyhow::anyhow!("--http: HTTP_PROXY is not set (run in an allowlist sandbox)")
            })?),
        },
        kv,
        queues: args.queues,
        message,
    };
    let mut outcome = runtime.invoke(&loaded, &argv, &limits, &grants);
    // A closed reader loses the output, not the outcome.
    let _ = std::io::stdout().write_all(&outcome.stdout);
    let _ = std::io::stderr().write_all(&outcome.stderr);
    outcome.stdout.clear();
    outcome.stderr.clear();
    if let Some(path) = &args.effects {
        let text = serde_json::to_vec(&outcome.effects)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .and_then(|mut f| f.write_all(&text))
            .with_context(|| format!("writing the effects to {}", path.display()))?;
    }
    if let Some(file) = &mut result {
        let mut line = serde_json::to_string(&outcome)?;
        // Denials are bounded, but a reader may wait on a full pipe: the
        // outcome always fits.
        while line.len() > crate::MAX_OUTCOME_BYTES {
            if outcome.bindings.pop().is_some() {
                outcome.bindings_dropped += 1;
            } else if outcome.denials.pop().is_none() {
                break;
            }
            line = serde_json::to_string(&outcome)?;
        }
        writeln!(file, "{line}").context("writing the outcome")?;
    }
    Ok(outcome.exit.status())
}

/// The descriptor the caller left open for the outcome.
fn fd_file(fd: i32) -> anyhow::Result<File> {
    use anyhow::Context;
    let owned = moat_sandbox::inherited::take(fd).with_context(|| format!("--result-fd {fd}"))?;
    Ok(File::from(owned))
}
