//! `moat runs`: an org's runs, as its agents or its admin see them, and
//! cancelling one.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

use super::{Api, Target, segment};

const ABOUT: &str = "\
A run goes queued, claimed, running (paused while an operation waits for
approval), then ends succeeded, failed, dead_lettered or cancelled.
Cancelling ends it at once: its pending operations fail (run_ended), its
pending approvals expire, and the runner holding it stops the operation in
flight within about two seconds, then tears the run down on its host
(run.destroyed). An agent token of the org or its admin token may cancel.

  export MOAT_CONTROL_PLANE=http://127.0.0.1:7700 MOAT_TOKEN_FILE=org-admin-token
  moat runs list
  moat runs show demo-1a2b3c4d
  moat runs cancel demo-1a2b3c4d";

/// List, inspect or cancel an org's runs.
#[derive(Args)]
#[command(after_long_help = ABOUT)]
pub struct RunsArgs {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: RunsCommand,
}

#[derive(Subcommand)]
enum RunsCommand {
    /// List the org's runs (the newest first).
    List,
    /// Show one run as the API answers it.
    Show { run: String },
    /// Cancel a run that has not ended (exit 1 if it already had).
    Cancel { run: String },
}

pub fn main(args: RunsArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat runs: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: RunsArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.target)?;
    match args.command {
        RunsCommand::List => {
            let answer = api.get("/v1/runs")?;
            let runs = answer["runs"].as_array().cloned().unwrap_or_default();
            if runs.is_empty() {
                outln!("no runs");
            }
            for r in runs {
                outln!(
                    "{}  {:<13} attempts {}  runner {}",
                    r["id"].as_str().unwrap_or("?"),
                    r["state"].as_str().unwrap_or("?"),
                    r["attempts"],
                    r["runnerId"].as_str().unwrap_or("-"),
                );
            }
        }
        RunsCommand::Show { run } => {
            let answer = api.get(&format!("/v1/runs/{}", segment(&run)))?;
            outln!("{answer:#}");
        }
        RunsCommand::Cancel { run } => {
            let answer = api.post(&format!("/v1/runs/{}/cancel", segment(&run)), &json!({}))?;
            outln!(
                "cancelled {}: {}",
                answer["id"].as_str().unwrap_or("?"),
                answer["state"].as_str().unwrap_or("?")
            );
        }
    }
    Ok(())
}
