//! `moat mcp`: the shell's operations as MCP tools over stdio.

use std::process::ExitCode;

use clap::{ArgMatches, Args, Command, FromArgMatches};

use crate::shell::{self, ShellArgs};

/// `moat mcp`'s options: those of `moat shell`.
pub struct McpArgs {
    shell: ShellArgs,
}

// By hand rather than derived: the help's tool list comes from the server's
// router, and `defer` builds it only when `moat mcp` itself is parsed, not
// for every other subcommand (clap's derive has no per-struct `defer`).
impl Args for McpArgs {
    fn augment_args(command: Command) -> Command {
        describe(ShellArgs::augment_args(command))
    }

    fn augment_args_for_update(command: Command) -> Command {
        describe(ShellArgs::augment_args_for_update(command))
    }
}

impl FromArgMatches for McpArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self {
            shell: ShellArgs::from_arg_matches(matches)?,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.shell.update_from_arg_matches(matches)
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
          \"--trusted-key\", \"/etc/moat/moat.pub\", \"--workspace\", \"/srv/work\"]";

fn with_tool_list(command: Command) -> Command {
    let tools: String = moat_shell::mcp::tool_summaries()
        .into_iter()
        .map(|(name, summary)| format!("  {name}\n      {summary}\n"))
        .collect();
    command.after_long_help(format!(
        "Tools (JSON input schemas in tools/list; each call goes through `moat shell`: \
         the same manifest checks, the same ledger):\n\n{tools}\n{CLIENTS}"
    ))
}

pub fn main(args: McpArgs) -> ExitCode {
    // Refuse at start, with the shell's own checks, rather than on the first call.
    if let Err(e) = shell::open(args.shell.clone()) {
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
    command.args(args.shell.to_args());
    match moat_shell::mcp::serve(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat mcp: {e}");
            ExitCode::from(1)
        }
    }
}
