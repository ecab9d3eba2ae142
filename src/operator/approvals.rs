//! `moat approvals`: the queue of operations waiting for a person.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Api, Target, segment};

const ABOUT: &str = "\
An operation whose policy rule is marked @approval(\"required\") waits,
paused, until an org admin approves or denies it here, over the API or in
the Inspector. Unresolved, it expires (moat serve --approval-ttl, 15
minutes by default) and fails closed. Each request, its resolution and
who resolved it (the token's fingerprint) go to the ledger.

  export MOAT_CONTROL_PLANE=http://127.0.0.1:7700 MOAT_TOKEN_FILE=org-admin-token
  moat approvals list
  moat approvals show apr_...
  moat approvals approve apr_... --reason \"ticket 4411\"
  moat approvals deny apr_... --reason \"not this customer's data\"";

/// List, inspect, approve or deny operations waiting for approval.
#[derive(Args)]
#[command(after_long_help = ABOUT)]
pub struct ApprovalsArgs {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: ApprovalsCommand,
}

#[derive(Subcommand)]
enum ApprovalsCommand {
    /// List approval requests (pending ones by default).
    List {
        /// pending, approved, denied, expired or all.
        #[arg(long, default_value = "pending")]
        state: String,
        /// Print the JSON answer as is.
        #[arg(long)]
        json: bool,
    },
    /// Show one request: the operation, the rule that asked, its risk.
    Show { id: String },
    /// Approve: the operation runs at once.
    Approve {
        id: String,
        /// Why (recorded in the ledger).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deny: the operation is refused with `approval_denied`.
    Deny {
        id: String,
        /// Why (required; the agent and the ledger get it).
        #[arg(long)]
        reason: String,
    },
}

pub fn main(args: ApprovalsArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat approvals: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: ApprovalsArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.target)?;
    match args.command {
        ApprovalsCommand::List { state, json } => {
            let answer = api.get(&format!("/v1/approvals?state={}", segment(&state)))?;
            if json {
                outln!("{answer:#}");
                return Ok(());
            }
            let rows = answer["approvals"].as_array().cloned().unwrap_or_default();
            if rows.is_empty() {
                outln!("no {state} approval requests");
            }
            for a in rows {
                outln!(
                    "{}  {:<8} {:<8} run {} op {}  {} {}  rule {}  expires {}",
                    text(&a["id"]),
                    text(&a["state"]),
                    text(&a["risk"]),
                    text(&a["runId"]),
                    text(&a["opId"]),
                    text(&a["summary"]["op"]),
                    text(&a["summary"]["resource"]),
                    text(&a["rule"]),
                    text(&a["expiresAt"]),
                );
            }
        }
        ApprovalsCommand::Show { id } => {
            let answer = api.get(&format!("/v1/approvals/{}", segment(&id)))?;
            outln!("{answer:#}");
        }
        ApprovalsCommand::Approve { id, reason } => {
            let answer = api.post(
                &format!("/v1/approvals/{}/approve", segment(&id)),
                &json!({"reason": reason}),
            )?;
            outln!(
                "approved {} (op {} of run {}): it runs now",
                text(&answer["id"]),
                text(&answer["opId"]),
                text(&answer["runId"])
            );
        }
        ApprovalsCommand::Deny { id, reason } => {
            let answer = api.post(
                &format!("/v1/approvals/{}/deny", segment(&id)),
                &json!({"reason": reason}),
            )?;
            outln!(
                "denied {} (op {} of run {})",
                text(&answer["id"]),
                text(&answer["opId"]),
                text(&answer["runId"])
            );
        }
    }
    Ok(())
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}
