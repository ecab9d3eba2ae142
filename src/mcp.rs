//! `moat mcp`: the shell's operations as MCP tools over stdio.

use std::process::ExitCode;

use clap::Args;

use crate::shell::{self, ShellArgs};

/// Serve the operations as MCP tools on stdin/stdout (for Claude Code, Codex, IDEs).
#[derive(Args)]
#[command(after_long_help = "\
Example client configuration (Claude Code, .mcp.json):

  {\"mcpServers\": {\"moat\": {\"command\": \"moat\", \"args\": [\"mcp\",
    \"--manifest\", \"/etc/moat/manifest.json\", \"--trusted-key\", \"/etc/moat/cp.pub\",
    \"--workspace\", \"/srv/work\"]}}}

Tools: artifact_read, artifact_write, artifact_list, exec_argv, with JSON input
schemas. Each call goes through `moat shell`: same manifest checks, same ledger.")]
pub struct McpArgs {
    #[command(flatten)]
    shell: ShellArgs,
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
