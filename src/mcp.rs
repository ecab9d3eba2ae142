//! `moat mcp`: the shell's operations as MCP tools over stdio, locally or as
//! a managed run of a control plane.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{ArgMatches, Args, Command, FromArgMatches};

use crate::shell::{self, ShellArgs};

/// `moat mcp`'s options: those of `moat shell`, or a control plane's.
pub enum McpArgs {
    Local(Box<ShellArgs>),
    Plane(PlaneArgs),
}

/// Fronting a control plane: each tool call an operation of a managed run.
#[derive(Args, Clone)]
pub struct PlaneArgs {
    /// Serve the tools as operations of a managed run of this control plane
    /// (policy, approvals, runners, its record), instead of a local shell.
    /// Needed for browser_step.
    #[arg(long, value_name = "URL")]
    control_plane: Option<String>,
    /// With --control-plane: file holding the org's agent token (or set
    /// MOAT_TOKEN).
    #[arg(
        long,
        value_name = "FILE",
        env = "MOAT_TOKEN_FILE",
        requires = "control_plane"
    )]
    token_file: Option<PathBuf>,
    /// With --control-plane: trust only the certificate authorities in this
    /// PEM file for an https:// control plane.
    #[arg(long, value_name = "FILE", requires = "control_plane")]
    ca_file: Option<PathBuf>,
    /// With --control-plane: serve this run (default: create one, finished
    /// when the client goes away).
    #[arg(long, value_name = "ID", requires = "control_plane")]
    run: Option<String>,
    /// With --control-plane: the environment (manifest) a new run is for.
    #[arg(
        long,
        value_name = "NAME",
        requires = "control_plane",
        conflicts_with = "run"
    )]
    environment: Option<String>,
    /// With --control-plane: how long a call waits for its result, a
    /// person's approval included.
    #[arg(long, value_name = "DURATION", default_value = "10m",
          value_parser = humantime::parse_duration, requires = "control_plane")]
    wait: Duration,
}

/// The local shell's options that a control plane's run does not take.
const LOCAL_ONLY: [&str; 3] = ["workspace", "manifest", "trusted_key"];

// By hand rather than derived: the help's tool list comes from the server's
// router, and `defer` builds it only when `moat mcp` itself is parsed, not
// for every other subcommand (clap's derive has no per-struct `defer`).
impl Args for McpArgs {
    fn augment_args(command: Command) -> Command {
        describe(PlaneArgs::augment_args(local(ShellArgs::augment_args(
            command,
        ))))
    }

    fn augment_args_for_update(command: Command) -> Command {
        describe(PlaneArgs::augment_args_for_update(local(
            ShellArgs::augment_args_for_update(command),
        )))
    }
}

/// The shell's options, its workspace asked for only without a control plane.
fn local(command: Command) -> Command {
    let mut command = command.mut_arg("workspace", |a| {
        a.required(false).required_unless_present("control_plane")
    });
    for name in LOCAL_ONLY {
        command = command.mut_arg(name, |a| a.conflicts_with("control_plane"));
    }
    command
}

impl FromArgMatches for McpArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let plane = PlaneArgs::from_arg_matches(matches)?;
        if plane.control_plane.is_some() {
            return Ok(McpArgs::Plane(plane));
        }
        Ok(McpArgs::Local(Box::new(ShellArgs::from_arg_matches(
            matches,
        )?)))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = McpArgs::from_arg_matches(matches)?;
        Ok(())
    }
}

fn describe(command: Command) -> Command {
    command
        .about("Serve the operations as MCP tools on stdin/stdout (for Claude Code, Codex, IDEs)")
        .long_about(None)
        .defer(with_tool_list)
}

const CLIENTS: &str = "\
Clients start the server with the command and arguments they are given, from
a directory of their choosing: give absolute paths (`moat` is on PATH only
once installed there). Claude Code:

  claude mcp add moat -- /usr/local/bin/moat mcp --manifest /etc/moat/signed.json \\
    --trusted-key /etc/moat/moat.pub --workspace /srv/work

or a project's .mcp.json:

  {\"mcpServers\": {\"moat\": {\"command\": \"/usr/local/bin/moat\", \"args\": [\"mcp\",
    \"--manifest\", \"/etc/moat/signed.json\", \"--trusted-key\", \"/etc/moat/moat.pub\",
    \"--workspace\", \"/srv/work\"]}}}

Codex, in ~/.codex/config.toml:

  [mcp_servers.moat]
  command = \"/usr/local/bin/moat\"
  args = [\"mcp\", \"--manifest\", \"/etc/moat/signed.json\",
          \"--trusted-key\", \"/etc/moat/moat.pub\", \"--workspace\", \"/srv/work\"]

Fronting a control plane instead (every call an operation of a managed run,
decided by its policy, approved by a person where a rule asks, with
browser_step):

  claude mcp add moat -- /usr/local/bin/moat mcp --control-plane https://moat.example \\
    --token-file /etc/moat/agent-token";

fn with_tool_list(command: Command) -> Command {
    let tools: String = moat_shell::mcp::tool_summaries()
        .into_iter()
        .map(|(name, summary)| format!("  {name}\n      {summary}\n"))
        .collect();
    command.after_long_help(format!(
        "Tools (JSON input schemas in tools/list; each call goes through `moat shell`: \
         the same manifest checks, the same ledger; or, with --control-plane, through a \
         managed run; browser_step only then):\n\n{tools}\n{CLIENTS}"
    ))
}

pub fn main(args: McpArgs) -> ExitCode {
    match args {
        McpArgs::Local(shell) => local_main(*shell),
        McpArgs::Plane(plane) => match plane_main(plane) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("moat mcp: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

fn local_main(args: ShellArgs) -> ExitCode {
    // Refuse at start, with the shell's own checks, rather than on the first call.
    if let Err(e) = shell::open(args.clone()) {
        eprintln!("moat mcp: refusing to start: {e:#}");
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("moat mcp: cannot find its own binary: {e}");
            return ExitCode::from(2);
        }
    };
    let mut command = std::process::Command::new(exe);
    command.args(args.to_args());
    match moat_shell::mcp::serve(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat mcp: {e}");
            ExitCode::from(1)
        }
    }
}

/// Serves a run of the control plane: checked at start (the token, the
/// run), so that a client sees a refusal before its first call.
fn plane_main(args: PlaneArgs) -> anyhow::Result<ExitCode> {
    let base = args.control_plane.unwrap_or_default();
    let token = crate::operator::read_token(args.token_file.as_deref(), "the org's agent token")?;
    let roots = args
        .ca_file
        .as_deref()
        .map(|path| moat_client::CaRoots::for_control_plane(path, &base))
        .transpose()?;
    // Each request waits at most 25 s on the control plane.
    let client =
        moat_client::OrgClient::with_roots(&base, &token, Duration::from_secs(60), roots.as_ref());
    let (run, created) = match &args.run {
        Some(run) => {
            let found: serde_json::Value = client
                .get(&format!("/v1/runs/{}", crate::operator::segment(run)))
                .with_context(|| format!("run {run}"))?;
            if found["state"].as_str().is_some_and(|s| {
                matches!(s, "succeeded" | "failed" | "dead_lettered" | "cancelled")
            }) {
                bail!(
                    "run {run} has ended ({})",
                    found["state"].as_str().unwrap_or_default()
                );
            }
            (run.clone(), false)
        }
        None => {
            let mut body = serde_json::json!({"inputs": []});
            if let Some(environment) = &args.environment {
                body["environment"] = environment.clone().into();
            }
            let made: serde_json::Value =
                client.post("/v1/runs", &body).context("creating a run")?;
            let id = made["id"]
                .as_str()
                .context("the control plane's run has no id")?
                .to_owned();
            (id, true)
        }
    };
    eprintln!("moat mcp: serving run {run} of {base}");
    let plane = Arc::new(crate::mcp_plane::Plane::new(client, run.clone(), args.wait));
    let served = moat_shell::mcp::serve_with(Arc::clone(&plane) as _, run.clone());
    // A run made for this client ends with it: its runner closes what it
    // left open (browser sessions).
    if created {
        let path = format!("/v1/runs/{}/finish", crate::operator::segment(&run));
        if let Err(e) = plane.finish(&path) {
            eprintln!("moat mcp: finishing run {run}: {e}");
        }
    }
    served.context("serving MCP")?;
    Ok(ExitCode::SUCCESS)
}
