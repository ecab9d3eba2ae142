//! `moat mcp --control-plane`: the MCP tools as operations of a managed run.
//! Each call is submitted with the org's agent token, decided by the control
//! plane's policy (a person may approve it), taken by a runner, and waited
//! for; its result is the tool's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use moat_client::OrgClient;
use moat_core::url::encode_component as segment;
use moat_shell::mcp::{Backend, Fetched, Reply};
use serde_json::{Value, json};

/// How long one request waits on the control plane for an op to finish.
const POLL: Duration = Duration::from_secs(25);

/// One managed run, fronted.
pub struct Plane {
    client: OrgClient,
    run: String,
    /// How long a call waits for its result (an approval included).
    wait: Duration,
}

impl Plane {
    pub fn new(client: OrgClient, run: String, wait: Duration) -> Plane {
        Plane { client, run, wait }
    }

    /// `POST path` with nothing (the run's finish).
    pub fn finish(&self, path: &str) -> Result<(), String> {
        let answer = self
            .client
            .post_empty_answer(path)
            .map_err(|e| e.to_string())?;
        match answer.status {
            200..=299 => Ok(()),
            _ => Err(answer.refusal(&format!("POST {path}")).to_string()),
        }
    }

    /// Submits `envelope` and waits until its op is final or `wait` is up.
    fn submit(&self, envelope: &Value) -> Result<Value, String> {
        let id = envelope["id"].as_str().unwrap_or_default().to_owned();
        let ops = format!("/v1/runs/{}/ops", segment(&self.run));
        let answer = self
            .client
            .post_answer(&format!("{ops}?wait_ms={}", POLL.as_millis()), envelope)
            .map_err(|e| e.to_string())?;
        let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let mut op = match answer.status {
            200..=202 => body,
            // Refused by the policy or the manifest: its result says why.
            403 => body["op"].clone(),
            _ => return Err(answer.refusal(&format!("POST {ops}")).to_string()),
        };
        let deadline = Instant::now() + self.wait;
        let one = format!("{ops}/{}", segment(&id));
        loop {
            if is_final(&op) {
                return Ok(result_of(&op));
            }
            if Instant::now() >= deadline {
                return Err(still_waiting(&id, &op, self.wait));
            }
            let poll = POLL.min(deadline.saturating_duration_since(Instant::now()));
            op = self
                .client
                .get(&format!("{one}?wait_ms={}", poll.as_millis().max(1)))
                .map_err(|e| e.to_string())?;
        }
    }
}

impl Backend for Plane {
    fn call(self: Arc<Self>, envelope: Value) -> Reply {
        let plane = self;
        Box::pin(async move {
            tokio::task::spawn_blocking(move || plane.submit(&envelope))
                .await
                .map_err(|e| format!("the call to the control plane: {e}"))?
        })
    }

    fn artifact(self: Arc<Self>, sha256: String) -> Fetched {
        let plane = self;
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let answer = plane
                    .client
                    .get_answer(&format!("/v1/artifacts/{}", segment(&sha256)))
                    .ok()?;
                // Within an image's worth: a screenshot is a few hundred KiB.
                ((200..300).contains(&answer.status) && answer.body.len() <= MAX_IMAGE)
                    .then_some(answer.body)
            })
            .await
            .ok()
            .flatten()
        })
    }
}

/// The largest screenshot passed to a client as an image.
const MAX_IMAGE: usize = 16 << 20;

fn is_final(op: &Value) -> bool {
    matches!(
        op["state"].as_str(),
        Some("succeeded" | "failed" | "denied" | "interrupted")
    )
}

/// A final op's result; one that ended without one (its run ended) says so.
fn result_of(op: &Value) -> Value {
    match &op["result"] {
        Value::Object(_) => op["result"].clone(),
        _ => json!({
            "id": op["id"],
            "status": "error",
            "message": format!("operation {} ended {} without a result",
                op["id"].as_str().unwrap_or_default(), op["state"].as_str().unwrap_or_default()),
        }),
    }
}

fn still_waiting(id: &str, op: &Value, wait: Duration) -> String {
    let state = op["state"].as_str().unwrap_or("unknown");
    let why = if state == "pending_approval" {
        "it waits for a person to approve it (the Inspector's approvals page, or `moat approvals`)"
    } else {
        "no runner has finished it yet"
    };
    format!(
        "operation {id} is still {state} after {}: {why}; it goes on, and its result will be \
         in the run's record",
        humantime::format_duration(wait)
    )
}
