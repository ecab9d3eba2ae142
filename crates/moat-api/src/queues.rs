//! An org's queues and key-value namespaces (the `worker` class's
//! control-plane half): a queue's consumer, messages sent to it, and the
//! values its workers read and write.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::org::NewInput;

/// `PUT /v1/queues/{name}`: the worker component that consumes the queue,
/// invoked once per message in a run of its own.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PutQueue {
    /// The component (WASI 0.2, e.g. from `moat worker build`), base64.
    pub module_base64: String,
    /// Its arguments after its name.
    #[serde(default)]
    pub args: Vec<String>,
    /// Files every invocation reads through its `inputs` binding (each
    /// path under `input/`).
    #[serde(default)]
    pub inputs: Vec<NewInput>,
    /// The kv namespaces it may read and write.
    #[serde(default)]
    pub kv: Vec<String>,
    /// The queues it may send to.
    #[serde(default)]
    pub send_to: Vec<String>,
    /// Where its runs are placed (default: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// Invocations of one message before it is dead-lettered (1 to 20,
    /// default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i64>,
    /// The wait before the first retry, doubled for each next one (0 to
    /// 3,600,000 ms, default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_ms: Option<i64>,
    /// One invocation's deadline (at most the manifest's timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// A queue and its consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    pub name: String,
    pub environment: String,
    pub module_sha256: String,
    pub args: Vec<String>,
    pub inputs: Vec<String>,
    pub kv: Vec<String>,
    pub send_to: Vec<String>,
    pub max_attempts: i64,
    pub backoff_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueueList {
    pub queues: Vec<QueueView>,
}

/// `POST /v1/queues/{name}/messages`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SendMessage {
    /// The message: any JSON value (at most 256 KiB as text).
    pub body: Value,
    /// A message sent again with a key already taken in this queue is not
    /// queued again: the answer names the first (`duplicate: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// A message and where it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageView {
    pub id: String,
    pub queue: String,
    /// `ready` (waiting for its next delivery), `running`, `done`, `dead`
    /// (dead-lettered: redrive it).
    pub state: String,
    /// Invocations so far.
    pub attempts: i64,
    pub body: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The run of its latest delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it is next delivered (`ready`).
    pub visible_at: String,
    pub created_at: String,
    pub updated_at: String,
}

/// The answer to a message sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageSent {
    pub message: MessageView,
    /// Its idempotency key was taken: `message` is the first one's.
    pub duplicate: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MessageList {
    pub messages: Vec<MessageView>,
}

/// A kv namespace's keys and values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvNamespace {
    pub namespace: String,
    /// Key → value, base64.
    pub entries: std::collections::BTreeMap<String, String>,
}
