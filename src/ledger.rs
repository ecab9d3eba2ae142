//! `moat ledger`: verify the chain, print events.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use moat_ledger::Ledger;

use crate::state;

/// Verify and read the event ledger.
#[derive(Args)]
pub struct LedgerArgs {
    /// State directory (default: $MOAT_STATE, $XDG_STATE_HOME/moat or ~/.local/state/moat).
    #[arg(long, global = true, value_name = "DIR")]
    state: Option<PathBuf>,
    #[command(subcommand)]
    command: LedgerCommand,
}

#[derive(Subcommand)]
enum LedgerCommand {
    /// Recompute the hash chain; name the first edited, reordered or deleted event.
    Verify,
    /// Print events as JSON lines, oldest first.
    Tail {
        /// Only this run's events.
        #[arg(long, value_name = "ID")]
        run: Option<String>,
        /// Keep printing new events as they are appended.
        #[arg(long)]
        follow: bool,
        /// Start after this sequence number.
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        after: i64,
    },
}

pub fn main(args: LedgerArgs) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("moat ledger: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: LedgerArgs) -> anyhow::Result<ExitCode> {
    let dir = state::dir(args.state)?;
    let path = dir.join("ledger.db");
    if !path.exists() {
        anyhow::bail!("no ledger at {} (nothing recorded yet?)", path.display());
    }
    let ledger = Ledger::open(&path).with_context(|| format!("{}", path.display()))?;
    match args.command {
        LedgerCommand::Verify => match ledger.verify()? {
            Ok(ok) => {
                outln!("ok: {} events, head {}", ok.events, ok.head);
                Ok(ExitCode::SUCCESS)
            }
            Err(broken) => {
                outln!("BROKEN: {broken}");
                Ok(ExitCode::from(1))
            }
        },
        LedgerCommand::Tail { run, follow, after } => {
            let mut last = after;
            loop {
                let batch = ledger.events(run.as_deref(), last, 1000)?;
                for event in &batch {
                    outln!("{}", event.to_json());
                    last = event.seq;
                }
                if batch.len() < 1000 {
                    if !follow {
                        return Ok(ExitCode::SUCCESS);
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
}
