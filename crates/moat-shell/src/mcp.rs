//! The same operations as MCP tools over stdio, so any MCP client can use
//! Moat as its tool surface.
//!
//! The MCP server runs an async runtime, which starts threads; the sandbox
//! launcher must clone from a single-threaded process. So the tools do not
//! run here: each call becomes an envelope for a `moat shell` child process
//! (started once, single-threaded), and its result line becomes the tool's
//! result. Manifest checks, events and the ledger are therefore exactly the
//! shell's.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use moat_core::op::{
    ArtifactListArgs, ArtifactReadArgs, ArtifactWriteArgs, DirectRequestArgs, ExecArgvArgs,
    ProfileRequestArgs,
};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ErrorData, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::Mutex;

struct Backend {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// The MCP server: one `moat shell` behind it.
#[derive(Clone)]
pub struct MoatTools {
    backend: std::sync::Arc<Mutex<Backend>>,
    run_id: String,
    next: std::sync::Arc<AtomicU64>,
}

impl MoatTools {
    async fn call(&self, op: &str, args: Value) -> Result<CallToolResult, ErrorData> {
        let id = format!("mcp-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let envelope = json!({
            "id": id,
            "runId": self.run_id,
            "correlationId": id,
            "op": op,
            "args": args,
            "createdAt": moat_core::time::now_stamp(),
        });
        let mut backend = self.backend.lock().await;
        let line = envelope.to_string() + "\n";
        let io = |e: std::io::Error| ErrorData::internal_error(format!("moat shell: {e}"), None);
        backend.stdin.write_all(line.as_bytes()).await.map_err(io)?;
        backend.stdin.flush().await.map_err(io)?;
        let mut answer = String::new();
        if backend.stdout.read_line(&mut answer).await.map_err(io)? == 0 {
            return Err(ErrorData::internal_error("moat shell exited", None));
        }
        let result: Value = serde_json::from_str(&answer)
            .map_err(|e| ErrorData::internal_error(format!("moat shell answered: {e}"), None))?;
        let text = ContentBlock::text(serde_json::to_string_pretty(&result).unwrap_or(answer));
        Ok(if result["status"] == "ok" {
            CallToolResult::success(vec![text])
        } else {
            CallToolResult::error(vec![text])
        })
    }
}

fn to_value<T: serde::Serialize>(args: T) -> Result<Value, ErrorData> {
    serde_json::to_value(args).map_err(|e| ErrorData::invalid_params(e.to_string(), None))
}

#[tool_router]
impl MoatTools {
    #[tool(
        description = "Read a file under the workspace's readable roots (path relative to the workspace). \
                          Returns text or base64, size, sha256 and whether it was truncated."
    )]
    async fn artifact_read(
        &self,
        Parameters(args): Parameters<ArtifactReadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call("artifact_read", to_value(args)?).await
    }

    #[tool(
        description = "Write a file under the workspace's output roots, atomically; it becomes a \
                          content-addressed artifact. Give exactly one of content and contentBase64."
    )]
    async fn artifact_write(
        &self,
        Parameters(args): Parameters<ArtifactWriteArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call("artifact_write", to_value(args)?).await
    }

    #[tool(description = "List a directory under the workspace's readable roots.")]
    async fn artifact_list(
        &self,
        Parameters(args): Parameters<ArtifactListArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call("artifact_list", to_value(args)?).await
    }

    #[tool(
        description = "Run an allowlisted executable (argv, no shell) in Moat's OS sandbox, with the \
                          workspace mounted at /workspace. Returns exit code, output excerpts and what was enforced."
    )]
    async fn exec_argv(
        &self,
        Parameters(args): Parameters<ExecArgvArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call("exec_argv", to_value(args)?).await
    }

    #[tool(
        description = "Make an HTTP(S) request to a domain the manifest allows, through Moat's \
                          egress proxy. Credential headers (set-cookie, authorization...) are removed \
                          from the response; large bodies come back as an artifact."
    )]
    async fn http_request(
        &self,
        Parameters(args): Parameters<DirectRequestArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call("http_request", to_value(args)?).await
    }

    #[tool(
        description = "Call one of the manifest's named services (profiles) with a request stored \
                          as an artifact ({method, path, headers?, body?}); requestRef is its sha256."
    )]
    async fn http_request_profile(
        &self,
        Parameters(args): Parameters<ProfileRequestArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call("http_request", to_value(args)?).await
    }
}

#[tool_handler]
impl ServerHandler for MoatTools {
    fn get_info(&self) -> ServerConfig {
        // Without a server_info, rmcp names itself (its crate and version):
        // clients would show and log `rmcp`, not the program they started.
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("moat", env!("CARGO_PKG_VERSION")).with_title("Moat"),
            )
            .with_instructions(
                "Moat: structured, sandboxed operations on a workspace. Paths are relative to the \
                 workspace; denied operations answer with a reason from a closed set.",
            )
    }
}

/// The tools `tools/list` serves, by name, each with the first sentence of
/// its description: from the server's own router, so that `moat mcp --help`
/// cannot drift from what the server offers.
pub fn tool_summaries() -> Vec<(String, String)> {
    MoatTools::tool_router()
        .list_all()
        .into_iter()
        .map(|tool| {
            let description = tool.description.as_deref().unwrap_or_default();
            let first = match description.find(". ") {
                Some(end) => &description[..=end],
                None => description,
            };
            (tool.name.into_owned(), first.trim().to_owned())
        })
        .collect()
}

/// Serves MCP on stdin/stdout until the client goes away. `shell` is the
/// command line of the `moat shell` to delegate to.
pub fn serve(mut shell: std::process::Command) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        shell
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = tokio::process::Command::from(shell)
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let id = moat_core::random::bytes::<6>();
        let tools = MoatTools {
            backend: std::sync::Arc::new(Mutex::new(Backend {
                _child: child,
                stdin,
                stdout: BufReader::new(stdout),
            })),
            run_id: format!(
                "mcp-{}",
                id.iter().map(|b| format!("{b:02x}")).collect::<String>()
            ),
            next: std::sync::Arc::new(AtomicU64::new(1)),
        };
        let service = tools
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        service
            .waiting()
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(())
    })
}
