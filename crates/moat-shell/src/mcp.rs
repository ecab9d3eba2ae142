//! The same operations as MCP tools over stdio, so any MCP client can use
//! Moat as its tool surface.
//!
//! The tools do not run here: each call becomes an operation envelope for a
//! [`Backend`], and its result becomes the tool's. Locally that is a `moat
//! shell` child process ([`serve`]: the MCP server runs an async runtime,
//! which starts threads, and the sandbox launcher must clone from a
//! single-threaded process), so manifest checks, events and the ledger are
//! exactly the shell's. Fronting a control plane ([`serve_with`]), each call
//! is an operation of a managed run, decided by its policy (a person may
//! approve it), run by a runner and recorded there; only that way do the
//! browser's steps, which need the control plane's capability, run.

use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use moat_core::op::{
    ArtifactListArgs, ArtifactReadArgs, ArtifactWriteArgs, DirectRequestArgs, ExecArgvArgs,
    ProfileRequestArgs,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ErrorData, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::Mutex;

/// Where a tool's operation goes.
pub trait Backend: Send + Sync + 'static {
    /// Carries out one operation envelope and answers its result (an
    /// `OpResult`, as JSON), or why it could not.
    fn call(self: Arc<Self>, envelope: Value) -> Reply;

    /// The bytes of artifact `sha256`, if this backend can fetch them (a
    /// browser step's screenshot, shown to the client as an image).
    fn artifact(self: Arc<Self>, sha256: String) -> Fetched {
        let _ = sha256;
        Box::pin(async { None })
    }
}

/// What [`Backend::artifact`] answers, later.
pub type Fetched = Pin<Box<dyn Future<Output = Option<Vec<u8>>> + Send>>;

/// What a [`Backend`] answers, later.
pub type Reply = Pin<Box<dyn Future<Output = Result<Value, String>> + Send>>;

/// A `moat shell` child: one envelope line in, one result line out.
struct ShellBackend {
    io: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    _child: Child,
}

impl Backend for ShellBackend {
    fn call(self: Arc<Self>, envelope: Value) -> Reply {
        let me = self;
        Box::pin(async move {
            let mut io = me.io.lock().await;
            let (stdin, stdout) = &mut *io;
            let line = envelope.to_string() + "\n";
            let failed = |e: std::io::Error| format!("moat shell: {e}");
            stdin.write_all(line.as_bytes()).await.map_err(failed)?;
            stdin.flush().await.map_err(failed)?;
            let mut answer = String::new();
            if stdout.read_line(&mut answer).await.map_err(failed)? == 0 {
                return Err("moat shell exited".into());
            }
            serde_json::from_str(&answer).map_err(|e| format!("moat shell answered: {e}"))
        })
    }
}

/// The MCP server: its tools, each call an envelope for the backend.
#[derive(Clone)]
pub struct MoatTools {
    backend: Arc<dyn Backend>,
    router: ToolRouter<MoatTools>,
    run_id: String,
    /// Unique per server: a managed run may outlive it and take another.
    prefix: String,
    next: Arc<AtomicU64>,
}

impl MoatTools {
    async fn call(&self, op: &str, args: Value) -> Result<CallToolResult, ErrorData> {
        let id = format!(
            "{}-{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let envelope = json!({
            "id": id,
            "runId": self.run_id,
            "correlationId": id,
            "op": op,
            "args": args,
            "createdAt": moat_core::time::now_stamp(),
        });
        let result = Arc::clone(&self.backend)
            .call(envelope)
            .await
            .map_err(|e| ErrorData::internal_error(e, None))?;
        let mut content = vec![ContentBlock::text(
            serde_json::to_string_pretty(&result).unwrap_or_else(|_| result.to_string()),
        )];
        // A page step's screenshot, as an image a client can look at.
        if let Some(sha) = result["result"]["screenshot"]["sha256"].as_str()
            && let Some(png) = Arc::clone(&self.backend).artifact(sha.to_owned()).await
            && png.starts_with(b"\x89PNG\r\n\x1a\n")
            && moat_core::hash::sha256_hex(&png) == sha
        {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD.encode(&png);
            content.push(ContentBlock::image(data, "image/png"));
        }
        Ok(if result["status"] == "ok" {
            CallToolResult::success(content)
        } else {
            CallToolResult::error(content)
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

    #[tool(
        description = "One step of a headless browser session in Moat's sandbox, whose only way out \
                          is the egress proxy (the manifest's domains). Actions: open, navigate {url}, \
                          click {selector}, type {selector, text}, fill_secret {selector, secret} (an org \
                          secret by name: its value never reaches you), select {selector, value}, \
                          wait_for {selector | text, timeoutMs?}, extract {selector?}, screenshot, close. \
                          Acting steps are decided on the element they act on and may wait for a person. \
                          Needs a control plane (moat mcp --control-plane)."
    )]
    async fn browser_step(
        &self,
        Parameters(args): Parameters<BrowserStepTool>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call("browser_step", args.into_args()).await
    }
}

/// `browser_step`'s input, flat (an MCP tool's input schema is one
/// object): each action takes the fields it names; the step itself checks
/// them strictly.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BrowserStepTool {
    /// The session (1-64 letters, digits, `.`, `_`, `-`), opened by `open`.
    pub session_id: String,
    /// open, navigate, click, type, fill_secret, select, wait_for, extract,
    /// screenshot or close.
    pub action: BrowserAction,
    /// navigate: an http(s) URL.
    #[serde(default)]
    pub url: Option<String>,
    /// click, type, fill_secret, select; wait_for and extract (optional):
    /// a CSS selector.
    #[serde(default)]
    pub selector: Option<String>,
    /// type: what to type; wait_for: text to wait for on the page.
    #[serde(default)]
    pub text: Option<String>,
    /// select: an option's value or text.
    #[serde(default)]
    pub value: Option<String>,
    /// fill_secret: the org secret's name.
    #[serde(default)]
    pub secret: Option<String>,
    /// navigate, click, wait_for: how long to wait, in ms (at most 60000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// open: keep a trace (navigations, requests, console), saved at close.
    #[serde(default)]
    pub trace: Option<bool>,
}

#[derive(Debug, Clone, Copy, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BrowserAction {
    Open,
    Navigate,
    Click,
    Type,
    FillSecret,
    Select,
    WaitFor,
    Extract,
    Screenshot,
    Close,
}

impl BrowserStepTool {
    /// The step's arguments as `browser_step` takes them (the fields given).
    fn into_args(self) -> Value {
        let mut args = json!({"sessionId": self.session_id, "action": self.action});
        let fields = [
            ("url", self.url.map(Value::from)),
            ("selector", self.selector.map(Value::from)),
            ("text", self.text.map(Value::from)),
            ("value", self.value.map(Value::from)),
            ("secret", self.secret.map(Value::from)),
            ("timeoutMs", self.timeout_ms.map(Value::from)),
            ("trace", self.trace.map(Value::from)),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                args[name] = value;
            }
        }
        args
    }
}

#[tool_handler(router = self.router)]
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

/// Serves MCP on stdin/stdout until the client goes away, each call an
/// envelope for a `moat shell` (`shell`, its command line). The browser's
/// tool is not offered: a local shell has no control plane to approve it.
pub fn serve(mut shell: std::process::Command) -> std::io::Result<()> {
    runtime()?.block_on(async move {
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
        let backend = Arc::new(ShellBackend {
            io: Mutex::new((stdin, BufReader::new(stdout))),
            _child: child,
        });
        let id = moat_core::random::bytes::<6>();
        let run_id = format!(
            "mcp-{}",
            id.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let mut router = MoatTools::tool_router();
        router.remove_route("browser_step");
        serving(MoatTools {
            backend,
            router,
            run_id,
            prefix: "mcp".into(),
            next: Arc::new(AtomicU64::new(1)),
        })
        .await
    })
}

/// Serves MCP on stdin/stdout until the client goes away, each call an
/// operation of run `run_id` through `backend` (a control plane), every
/// tool offered.
pub fn serve_with(backend: Arc<dyn Backend>, run_id: String) -> std::io::Result<()> {
    // 64 bits: servers that share a run never pick the same ids.
    let prefix = format!("mcp-{}", moat_core::random::hex(8));
    runtime()?.block_on(serving(MoatTools {
        backend,
        router: MoatTools::tool_router(),
        run_id,
        prefix,
        next: Arc::new(AtomicU64::new(1)),
    }))
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

async fn serving(tools: MoatTools) -> std::io::Result<()> {
    let service = tools
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    service
        .waiting()
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(())
}
