//! `moat volumes`: an org's persistent volumes, created and listed.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Api, Target, segment};

const ABOUT: &str = "\
A volume is an org's persistent work area: a run attaches it at one of its
manifest's persistent roots (filesystem.persistentRoots), read-write (one
live run at a time) or read-only (any number), and finds it as the last run
that wrote it left it. After each operation that changed it, the runner
stores an incremental snapshot (only changed chunks travel) before the
operation's result is acknowledged, so a run whose runner dies resumes on
another runner from its last acknowledged operation.

  export MOAT_CONTROL_PLANE=http://127.0.0.1:7700 MOAT_TOKEN_FILE=org-token
  moat volumes create model-cache
  moat volumes list
  moat volumes show model-cache

A run attaches it when it is created (POST /v1/runs):
  {\"volumes\": [{\"volume\": \"model-cache\", \"path\": \"state\"}]}
and a later run continues from the same volumes with {\"resumeFrom\": \"RUN_ID\"}.";

/// An org's persistent volumes.
#[derive(Args)]
#[command(after_long_help = ABOUT)]
pub struct VolumesArgs {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: VolumesCommand,
}

#[derive(Subcommand)]
enum VolumesCommand {
    /// Create an empty volume (lower-case letters, digits, `.`, `_`, `-`).
    Create { name: String },
    /// The org's volumes: newest snapshot, size, the run writing it.
    List,
    /// One volume.
    Show { name: String },
}

pub fn main(args: VolumesArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat volumes: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: VolumesArgs) -> anyhow::Result<()> {
    if let VolumesCommand::Create { name } | VolumesCommand::Show { name } = &args.command {
        // Refused here, with the rule, rather than as a 400 or a 404.
        name.parse::<moat_core::ids::VolumeName>()?;
    }
    let api = Api::new(&args.target)?;
    match args.command {
        VolumesCommand::Create { name } => {
            let volume = api.post("/v1/volumes", &json!({ "name": name }))?;
            print_one(&volume);
        }
        VolumesCommand::List => {
            let list = api.get("/v1/volumes")?;
            let volumes = list["volumes"].as_array().cloned().unwrap_or_default();
            if volumes.is_empty() {
                outln!("no volumes (moat volumes create NAME)");
            }
            for volume in &volumes {
                print_one(volume);
            }
        }
        VolumesCommand::Show { name } => {
            let volume = api.get(&format!("/v1/volumes/{}", segment(&name)))?;
            print_one(&volume);
        }
    }
    Ok(())
}

fn print_one(v: &Value) {
    let head = v["head"].as_str().map_or("empty".to_owned(), |h| {
        format!("snapshot {}", h.get(..12).unwrap_or(h))
    });
    outln!(
        "{}: {head}, {} files, {} bytes{}",
        v["name"].as_str().unwrap_or("?"),
        v["files"].as_u64().unwrap_or(0),
        v["bytes"].as_u64().unwrap_or(0),
        v["writer"]
            .as_str()
            .map(|r| format!(", written by run {r}"))
            .unwrap_or_default()
    );
}
