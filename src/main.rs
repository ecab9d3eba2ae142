//! `moat`: the command-line face of Moat.

mod exec;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run AI agents' operations without ambient authority.
#[derive(Parser)]
#[command(name = "moat", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Exec(exec::ExecArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Exec(args) => exec::main(args),
    }
}
