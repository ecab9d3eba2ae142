//! `moat`: the command-line face of Moat.
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

/// Writes a line to standard output. A reader that went away (`moat ledger
/// tail | head`) ends the command quietly, as with a default SIGPIPE.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

mod capability;
mod exec;
mod export;
mod files;
mod ledger;
mod manifest;
mod mcp;
mod mcp_plane;
mod operator;
mod replay;
mod runner;
mod serve;
mod shell;
mod state;
mod up;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run AI agents' operations without ambient authority.
#[derive(Parser)]
#[command(name = "moat", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    Exec(exec::ExecArgs),
    Manifest(manifest::ManifestArgs),
    Shell(shell::ShellArgs),
    Mcp(mcp::McpArgs),
    Ledger(ledger::LedgerArgs),
    Capability(capability::CapabilityArgs),
    Runner(runner::RunnerArgs),
    Serve(serve::ServeArgs),
    Approvals(operator::approvals::ApprovalsArgs),
    Runs(operator::runs::RunsArgs),
    Orgs(operator::orgs::OrgsArgs),
    Volumes(operator::volumes::VolumesArgs),
    Up(up::UpArgs),
    Audit(operator::audit::AuditArgs),
    Replay(replay::ReplayArgs),
    Export(export::ExportArgs),
    Worker(worker::WorkerArgs),
}

// `moat exec` alone: its start-up time is part of every sandboxed run, so
// it does not build the other subcommands' parsers (the same flags, help
// and errors as through `Cli`).
/// Run a program in a fresh sandbox and wait for it.
#[derive(Parser)]
#[command(name = "moat exec", version)]
struct ExecCli {
    #[command(flatten)]
    args: exec::ExecArgs,
}

/// `moat vm-relay PORT`, which QEMU starts inside a `microvm` jail for each
/// connection the guest opens to the egress proxy (not for people to run).
fn vm_relay(port: Option<std::ffi::OsString>) -> ExitCode {
    let Some(port) = port.and_then(|p| p.to_str()?.parse::<u16>().ok()) else {
        eprintln!("moat vm-relay: usage: moat vm-relay PORT (started by QEMU in a microvm jail)");
        return ExitCode::from(2);
    };
    match moat_sandbox::microvm::relay::relay(port) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat vm-relay: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    // The same binary is the init of every `microvm` guest.
    if moat_sandbox::microvm::guest::is_guest_init() {
        moat_sandbox::microvm::guest::main();
    }
    let mut argv = std::env::args_os();
    let first = argv.nth(1);
    if first.as_ref().is_some_and(|first| first == "vm-relay") {
        return vm_relay(argv.next());
    }
    if first.as_ref().is_some_and(|first| first == "vm-qemu") {
        let args: Vec<_> = argv.collect();
        let error = moat_sandbox::microvm::relay::exec_qemu(&args);
        eprintln!("moat vm-qemu: cannot start the emulator: {error}");
        return ExitCode::from(126);
    }
    if first.is_some_and(|first| first == "exec") {
        let cli = ExecCli::parse_from(std::iter::once("moat exec".into()).chain(argv));
        return exec::main(cli.args);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Exec(args) => exec::main(args),
        Command::Manifest(args) => manifest::main(args),
        Command::Shell(args) => shell::main(args),
        Command::Mcp(args) => mcp::main(args),
        Command::Ledger(args) => ledger::main(args),
        Command::Capability(args) => capability::main(args),
        Command::Runner(args) => runner::main(args),
        Command::Serve(args) => serve::main(args),
        Command::Approvals(args) => operator::approvals::main(args),
        Command::Runs(args) => operator::runs::main(args),
        Command::Orgs(args) => operator::orgs::main(args),
        Command::Volumes(args) => operator::volumes::main(args),
        Command::Up(args) => up::main(args),
        Command::Audit(args) => operator::audit::main(args),
        Command::Replay(args) => replay::main(args),
        Command::Export(args) => export::main(args),
        Command::Worker(args) => worker::main(args),
    }
}
