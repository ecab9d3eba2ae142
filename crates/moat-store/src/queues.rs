//! Each org's queues and key-value namespaces: the worker class's
//! control-plane half.
//!
//! A queue names the worker component that consumes it. A message is
//! delivered to a run of its own (placed and counted like any run, needing
//! a runner that offers the `worker` class) whose one operation invokes the
//! component; it is acknowledged only when that invocation succeeded, and
//! only then are the kv writes and sends it asked for made, in the same
//! transaction. A failed one is tried again after a backoff that doubles,
//! and after `max_attempts` it is dead-lettered, until a redrive queues it
//! again. A message sent with an idempotency key already taken in its
//! queue is not queued again.

use std::collections::BTreeMap;

use moat_core::EventData;
use moat_core::event_data::{QueueMessage, QueueMessageState};

use crate::db::{Row, Tx};
use crate::runs::typed_event;
use crate::{Store, StoreError, events};

/// A message's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Waiting for its next delivery (from `visible_ms`).
    Ready,
    /// Delivered to a run that has not settled it yet.
    Running,
    /// Its invocation succeeded.
    Done,
    /// Failed with no attempt left: waits for a redrive.
    Dead,
}

impl MessageState {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Ready => "ready",
            MessageState::Running => "running",
            MessageState::Done => "done",
            MessageState::Dead => "dead",
        }
    }

    pub fn parse(text: &str) -> Option<MessageState> {
        [
            MessageState::Ready,
            MessageState::Running,
            MessageState::Done,
            MessageState::Dead,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// A queue and the worker that consumes it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRow {
    pub org_id: String,
    pub name: String,
    /// The environment its delivery runs are created in.
    pub environment: String,
    /// The component's blob.
    pub module_sha256: String,
    /// The delivery run's inputs: the component and the files every
    /// invocation reads through `inputs` (`RunInput`s, whose blobs the
    /// org's artifacts hold).
    pub inputs: Vec<moat_core::event_data::RunInput>,
    /// The kv namespaces it is granted.
    pub namespaces: Vec<String>,
    pub max_attempts: i64,
    /// The first retry's wait; each later one doubles it.
    pub backoff_ms: i64,
    /// The rest of the consumer as the control plane keeps it (arguments,
    /// limits, the queues it may send to).
    pub consumer: serde_json::Value,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// A message.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageRow {
    pub id: String,
    pub org_id: String,
    pub queue: String,
    pub body: serde_json::Value,
    pub idempotency_key: Option<String>,
    pub state: MessageState,
    pub attempts: i64,
    pub visible_ms: i64,
    /// The run of its latest delivery.
    pub run_id: Option<String>,
    pub last_error: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// A message to queue.
pub struct NewMessage<'a> {
    pub org: &'a str,
    pub queue: &'a str,
    pub id: &'a str,
    pub body: &'a serde_json::Value,
    pub idempotency_key: Option<&'a str>,
}

/// What a delivery creates: its run and the one operation it runs.
pub struct Delivery {
    pub run_id: String,
    pub op_id: String,
    pub envelope: serde_json::Value,
    pub decision: serde_json::Value,
    /// The operation's decision events (`capability.requested`, `...granted`).
    pub events: Vec<moat_core::Event>,
    pub needs_classes: Vec<moat_core::WorkloadClass>,
}

/// How a delivery's invocation ended.
pub enum Settle<'a> {
    /// It succeeded: acknowledge it and make what it asked for.
    Succeeded {
        kv: &'a [effects::KvWrite],
        sends: &'a [effects::Send],
    },
    /// It failed (`error` says how).
    Failed { error: &'a str },
}

/// The shapes of a successful invocation's effects, as the store makes
/// them (the control plane checks them against the consumer's grants).
pub mod effects {
    /// Sets `key` (`Some`) or deletes it.
    pub struct KvWrite {
        pub namespace: String,
        pub key: String,
        pub value: Option<Vec<u8>>,
    }

    /// Queues `body` in the org's queue `queue`.
    pub struct Send {
        pub queue: String,
        pub id: String,
        pub body: serde_json::Value,
        pub idempotency_key: Option<String>,
    }
}

/// Namespaces as they are: namespace → key → value.
pub type KvSnapshot = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

const QUEUE_COLUMNS: &str = "org_id, name, environment, module_sha256, inputs, namespaces, \
     max_attempts, backoff_ms, consumer, created_ms, updated_ms";
const MESSAGE_COLUMNS: &str = "id, org_id, queue, body, idempotency_key, state, attempts, \
     visible_ms, run_id, last_error, created_ms, updated_ms";

/// Longest wait between two attempts.
const MAX_BACKOFF_MS: i64 = 3_600_000;

fn json(text: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Encode(e.to_string()))
}

fn decode_queue(row: &Row) -> Result<QueueRow, StoreError> {
    let inputs = row.text("inputs")?;
    let namespaces = row.text("namespaces")?;
    Ok(QueueRow {
        org_id: row.text("org_id")?,
        name: row.text("name")?,
        environment: row.text("environment")?,
        module_sha256: row.text("module_sha256")?,
        inputs: serde_json::from_str(&inputs)
            .map_err(|e| StoreError::Corrupt(format!("queue inputs: {e}")))?,
        namespaces: serde_json::from_str(&namespaces)
            .map_err(|e| StoreError::Corrupt(format!("queue namespaces: {e}")))?,
        max_attempts: row.int("max_attempts")?,
        backoff_ms: row.int("backoff_ms")?,
        consumer: json(&row.text("consumer")?, "queue consumer")?,
        created_ms: row.int("created_ms")?,
        updated_ms: row.int("updated_ms")?,
    })
}

fn decode_message(row: &Row) -> Result<MessageRow, StoreError> {
    let state = row.text("state")?;
    Ok(MessageRow {
        id: row.text("id")?,
        org_id: row.text("org_id")?,
        queue: row.text("queue")?,
        body: json(&row.text("body")?, "message body")?,
        idempotency_key: row.opt_text("idempotency_key")?,
        state: MessageState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("message state {state:?}")))?,
        attempts: row.int("attempts")?,
        visible_ms: row.int("visible_ms")?,
        run_id: row.opt_text("run_id")?,
        last_error: row.opt_text("last_error")?,
        created_ms: row.int("created_ms")?,
        updated_ms: row.int("updated_ms")?,
    })
}

/// The `queue.message` event of `message` in `state`.
fn step(message: &MessageRow, state: QueueMessageState) -> QueueMessage {
    QueueMessage {
        queue: message.queue.clone(),
        message_id: message.id.clone(),
        state,
        attempt: message.attempts,
        idempotency_key: message.idempotency_key.clone(),
        error: None,
        retry_at: None,
        kv_writes: None,
        sends: None,
    }
}

fn record(
    tx: &mut dyn Tx,
    message: &MessageRow,
    data: QueueMessage,
    now: i64,
) -> Result<(), StoreError> {
    let run = message.run_id.as_deref().unwrap_or("");
    events::append(
        tx,
        &message.org_id,
        &[typed_event(EventData::QueueMessage(data), run, now)],
    )?;
    Ok(())
}

fn message_in(tx: &mut dyn Tx, id: &str, lock: bool) -> Result<Option<MessageRow>, StoreError> {
    let sql = format!(
        "SELECT {MESSAGE_COLUMNS} FROM queue_messages WHERE id = ?{}",
        if lock { tx.for_update() } else { "" }
    );
    tx.query_one(&sql, &[id.into()])?
        .as_ref()
        .map(decode_message)
        .transpose()
}

fn queue_in(tx: &mut dyn Tx, org: &str, name: &str) -> Result<Option<QueueRow>, StoreError> {
    tx.query_one(
        &format!("SELECT {QUEUE_COLUMNS} FROM queues WHERE org_id = ? AND name = ?"),
        &[org.into(), name.into()],
    )?
    .as_ref()
    .map(decode_queue)
    .transpose()
}

/// Queues one message (`(row, false)`), or finds the one its idempotency
/// key already names (`(row, true)`); each recorded.
fn enqueue_in(
    tx: &mut dyn Tx,
    message: &NewMessage<'_>,
    now: i64,
) -> Result<(MessageRow, bool), StoreError> {
    let inserted = tx.query_one(
        &format!(
            "INSERT INTO queue_messages (id, org_id, queue, body, idempotency_key, state, attempts,
                 visible_ms, created_ms, updated_ms)
             VALUES (?, ?, ?, ?, ?, 'ready', 0, ?, ?, ?)
             ON CONFLICT DO NOTHING RETURNING {MESSAGE_COLUMNS}"
        ),
        &[
            message.id.into(),
            message.org.into(),
            message.queue.into(),
            message.body.to_string().into(),
            message.idempotency_key.map(str::to_owned).into(),
            now.into(),
            now.into(),
            now.into(),
        ],
    )?;
    if let Some(row) = inserted {
        let row = decode_message(&row)?;
        record(tx, &row, step(&row, QueueMessageState::Received), now)?;
        return Ok((row, false));
    }
    let Some(key) = message.idempotency_key else {
        return Err(StoreError::Conflict(format!("message {}", message.id)));
    };
    let first = tx
        .query_one(
            &format!(
                "SELECT {MESSAGE_COLUMNS} FROM queue_messages
                 WHERE org_id = ? AND queue = ? AND idempotency_key = ?"
            ),
            &[message.org.into(), message.queue.into(), key.into()],
        )?
        .as_ref()
        .map(decode_message)
        .transpose()?
        .ok_or_else(|| StoreError::Conflict(format!("message {}", message.id)))?;
    let mut seen = first.clone();
    // The duplicate is recorded apart from the first's run.
    seen.run_id = None;
    record(tx, &seen, step(&seen, QueueMessageState::Duplicate), now)?;
    Ok((first, true))
}

impl Store {
    /// Creates or replaces the org's queue `queue.name` and its consumer,
    /// with the bytes of the component and files its `inputs` name.
    pub fn put_queue(
        &self,
        queue: &QueueRow,
        blobs: &[crate::NewArtifact],
        now: i64,
    ) -> Result<QueueRow, StoreError> {
        self.tx(|tx| {
            for blob in blobs {
                crate::objects::insert_artifact(tx, &queue.org_id, "", "", blob, now)?;
            }
            tx.execute(
                "INSERT INTO queues (org_id, name, environment, module_sha256, inputs, namespaces,
                     max_attempts, backoff_ms, consumer, created_ms, updated_ms)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (org_id, name) DO UPDATE SET environment = excluded.environment,
                     module_sha256 = excluded.module_sha256, inputs = excluded.inputs,
                     namespaces = excluded.namespaces, max_attempts = excluded.max_attempts,
                     backoff_ms = excluded.backoff_ms, consumer = excluded.consumer,
                     updated_ms = excluded.updated_ms",
                &[
                    queue.org_id.as_str().into(),
                    queue.name.as_str().into(),
                    queue.environment.as_str().into(),
                    queue.module_sha256.as_str().into(),
                    encode(&queue.inputs)?.into(),
                    encode(&queue.namespaces)?.into(),
                    queue.max_attempts.into(),
                    queue.backoff_ms.into(),
                    queue.consumer.to_string().into(),
                    now.into(),
                    now.into(),
                ],
            )?;
            queue_in(tx, &queue.org_id, &queue.name)?
                .ok_or_else(|| StoreError::Corrupt("queue vanished".into()))
        })
    }

    /// The org's queue `name`.
    pub fn queue(&self, org: &str, name: &str) -> Result<Option<QueueRow>, StoreError> {
        self.read(|tx| queue_in(tx, org, name))
    }

    /// The org's queues, by name.
    pub fn queues(&self, org: &str) -> Result<Vec<QueueRow>, StoreError> {
        self.read(|tx| {
            tx.query(
                &format!("SELECT {QUEUE_COLUMNS} FROM queues WHERE org_id = ? ORDER BY name"),
                &[org.into()],
            )?
            .iter()
            .map(decode_queue)
            .collect()
        })
    }

    /// Queues a message in an existing queue of the org: `(row, duplicate)`.
    /// `NoSuch` when the queue does not exist.
    pub fn enqueue(
        &self,
        message: &NewMessage<'_>,
        now: i64,
    ) -> Result<(MessageRow, bool), StoreError> {
        self.tx(|tx| {
            if queue_in(tx, message.org, message.queue)?.is_none() {
                return Err(StoreError::NoSuch(format!("queue {}", message.queue)));
            }
            enqueue_in(tx, message, now)
        })
    }

    /// One of the org's messages.
    pub fn message(
        &self,
        org: &str,
        queue: &str,
        id: &str,
    ) -> Result<Option<MessageRow>, StoreError> {
        self.read(|tx| {
            Ok(message_in(tx, id, false)?.filter(|m| m.org_id == org && m.queue == queue))
        })
    }

    /// The message a delivery run was created for.
    pub fn message_of_run(&self, run: &str) -> Result<Option<MessageRow>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                &format!("SELECT {MESSAGE_COLUMNS} FROM queue_messages WHERE run_id = ?"),
                &[run.into()],
            )?
            .as_ref()
            .map(decode_message)
            .transpose()
        })
    }

    /// The queue's messages (in `state`, if given), oldest first, at most
    /// `limit`.
    pub fn messages(
        &self,
        org: &str,
        queue: &str,
        state: Option<MessageState>,
        limit: i64,
    ) -> Result<Vec<MessageRow>, StoreError> {
        self.read(|tx| {
            let (filter, mut params) = match state {
                Some(state) => (" AND state = ?", vec![state.as_str().into()]),
                None => ("", Vec::new()),
            };
            let mut all = vec![org.into(), queue.into()];
            all.append(&mut params);
            all.push(limit.into());
            tx.query(
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM queue_messages
                     WHERE org_id = ? AND queue = ?{filter} ORDER BY created_ms, id LIMIT ?"
                ),
                &all,
            )?
            .iter()
            .map(decode_message)
            .collect()
        })
    }

    /// Delivers up to `limit` messages that are due: each gets a run of its
    /// own with the one operation `plan` makes for it (given the message,
    /// its queue and the queue's namespaces as they are now), and is
    /// `running` until that run settles it. Messages are taken with
    /// `SKIP LOCKED`, so replicas deliver each once. The ids of the runs.
    pub fn deliver_due(
        &self,
        now: i64,
        limit: i64,
        plan: &mut dyn FnMut(&MessageRow, &QueueRow, &KvSnapshot) -> Result<Delivery, StoreError>,
    ) -> Result<Vec<String>, StoreError> {
        self.tx(|tx| {
            let sql = format!(
                "SELECT {MESSAGE_COLUMNS} FROM queue_messages
                 WHERE state = 'ready' AND visible_ms <= ? ORDER BY visible_ms, id LIMIT ?{}",
                tx.skip_locked()
            );
            let due = tx
                .query(&sql, &[now.into(), limit.into()])?
                .iter()
                .map(decode_message)
                .collect::<Result<Vec<_>, _>>()?;
            let mut runs = Vec::new();
            for mut message in due {
                let Some(queue) = queue_in(tx, &message.org_id, &message.queue)? else {
                    // Its queue was removed: nothing consumes it.
                    continue;
                };
                let snapshot = kv_snapshot(tx, &message.org_id, &queue.namespaces)?;
                message.attempts += 1;
                let delivery = plan(&message, &queue, &snapshot)?;
                crate::runs::create_run_in(
                    tx,
                    &crate::NewRun {
                        org: &message.org_id,
                        id: &delivery.run_id,
                        environment: &queue.environment,
                        inputs: &queue.inputs,
                        blobs: &[],
                        max_attempts: 1,
                        manifest_hash: None,
                        needs_classes: &delivery.needs_classes,
                        volumes: &[],
                    },
                    now,
                )?;
                crate::ops::insert_op_in(
                    tx,
                    &crate::NewOp {
                        org: &message.org_id,
                        run: &delivery.run_id,
                        id: &delivery.op_id,
                        op: "exec_argv",
                        state: crate::OpState::Queued,
                        envelope: &delivery.envelope,
                        decision: &delivery.decision,
                        result: None,
                        events: &delivery.events,
                        approval: None,
                    },
                    now,
                )?;
                tx.execute(
                    "UPDATE queue_messages SET state = 'running', attempts = ?, run_id = ?,
                         updated_ms = ? WHERE id = ?",
                    &[
                        message.attempts.into(),
                        delivery.run_id.as_str().into(),
                        now.into(),
                        message.id.as_str().into(),
                    ],
                )?;
                message.run_id = Some(delivery.run_id.clone());
                record(
                    tx,
                    &message,
                    step(&message, QueueMessageState::Delivered),
                    now,
                )?;
                runs.push(delivery.run_id);
            }
            Ok(runs)
        })
    }

    /// Settles the message `run` was delivering: acknowledged (its writes
    /// and sends made, in this transaction), retried after a backoff, or
    /// dead-lettered. `None` when `run` delivers no message, or one
    /// already settled.
    pub fn settle_message(
        &self,
        run: &str,
        settle: &Settle<'_>,
        now: i64,
    ) -> Result<Option<MessageRow>, StoreError> {
        self.tx(|tx| {
            let sql = format!(
                "SELECT {MESSAGE_COLUMNS} FROM queue_messages WHERE run_id = ? AND state = 'running'{}",
                tx.for_update()
            );
            let Some(row) = tx.query_one(&sql, &[run.into()])? else {
                return Ok(None);
            };
            let message = decode_message(&row)?;
            let org = message.org_id.clone();
            let mut event = step(&message, QueueMessageState::Acknowledged);
            let (state, visible, error) = match settle {
                Settle::Succeeded { kv, sends } => {
                    for write in *kv {
                        kv_write(tx, &org, write, now)?;
                    }
                    for send in *sends {
                        if queue_in(tx, &org, &send.queue)?.is_none() {
                            return Err(StoreError::NoSuch(format!("queue {}", send.queue)));
                        }
                        enqueue_in(
                            tx,
                            &NewMessage {
                                org: &org,
                                queue: &send.queue,
                                id: &send.id,
                                body: &send.body,
                                idempotency_key: send.idempotency_key.as_deref(),
                            },
                            now,
                        )?;
                    }
                    event.kv_writes = Some(kv.len() as u64);
                    event.sends = Some(sends.len() as u64);
                    (MessageState::Done, message.visible_ms, None)
                }
                Settle::Failed { error } => {
                    let queue = queue_in(tx, &org, &message.queue)?;
                    let max = queue.as_ref().map_or(1, |q| q.max_attempts);
                    event.error = Some((*error).to_owned());
                    if message.attempts >= max {
                        event.state = QueueMessageState::DeadLettered;
                        (MessageState::Dead, message.visible_ms, Some(*error))
                    } else {
                        let base = queue.as_ref().map_or(1_000, |q| q.backoff_ms);
                        let shift = u32::try_from(message.attempts - 1).unwrap_or(0).min(20);
                        let wait = base.saturating_mul(1_i64 << shift).min(MAX_BACKOFF_MS);
                        let at = now.saturating_add(wait);
                        event.state = QueueMessageState::Retrying;
                        event.retry_at = Some(moat_core::time::stamp_ms(at));
                        (MessageState::Ready, at, Some(*error))
                    }
                }
            };
            tx.execute(
                "UPDATE queue_messages SET state = ?, visible_ms = ?, last_error = ?, updated_ms = ?
                 WHERE id = ?",
                &[
                    state.as_str().into(),
                    visible.into(),
                    error.map(str::to_owned).into(),
                    now.into(),
                    message.id.as_str().into(),
                ],
            )?;
            record(tx, &message, event, now)?;
            message_in(tx, &message.id, false)
        })
    }

    /// Fails the deliveries whose run ended without settling its message
    /// (its lease lost, cancelled, the operation never reported): each is
    /// retried or dead-lettered as a failed invocation is. How many.
    pub fn settle_lost_deliveries(&self, now: i64) -> Result<usize, StoreError> {
        let lost = self.read(|tx| {
            tx.query(
                "SELECT m.run_id, r.state FROM queue_messages m JOIN runs r ON r.id = m.run_id
                 WHERE m.state = 'running'
                   AND r.state IN ('succeeded', 'failed', 'dead_lettered', 'cancelled')
                 LIMIT 100",
                &[],
            )?
            .iter()
            .map(|row| Ok((row.text("run_id")?, row.text("state")?)))
            .collect::<Result<Vec<_>, StoreError>>()
        })?;
        let mut settled = 0;
        for (run, state) in lost {
            let error = format!("its run ended ({state}) before the invocation reported");
            if self
                .settle_message(&run, &Settle::Failed { error: &error }, now)?
                .is_some()
            {
                settled += 1;
            }
        }
        Ok(settled)
    }

    /// Queues a dead-lettered message again, its attempts reset. `None`
    /// when it is not the org's or not dead.
    pub fn redrive(
        &self,
        org: &str,
        queue: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<MessageRow>, StoreError> {
        self.tx(|tx| {
            let updated = tx.execute(
                "UPDATE queue_messages SET state = 'ready', attempts = 0, visible_ms = ?,
                     run_id = NULL, updated_ms = ?
                 WHERE id = ? AND org_id = ? AND queue = ? AND state = 'dead'",
                &[now.into(), now.into(), id.into(), org.into(), queue.into()],
            )?;
            if updated == 0 {
                return Ok(None);
            }
            let Some(message) = message_in(tx, id, false)? else {
                return Ok(None);
            };
            record(
                tx,
                &message,
                step(&message, QueueMessageState::Redriven),
                now,
            )?;
            Ok(Some(message))
        })
    }

    /// The value of `key` in the org's `namespace`.
    pub fn kv_get(
        &self,
        org: &str,
        namespace: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(|tx| {
            tx.query_one(
                "SELECT value FROM kv_entries WHERE org_id = ? AND namespace = ? AND key = ?",
                &[org.into(), namespace.into(), key.into()],
            )?
            .map(|r| r.blob("value"))
            .transpose()
        })
    }

    /// Sets (`Some`) or deletes `key` in the org's `namespace`.
    pub fn kv_put(
        &self,
        org: &str,
        namespace: &str,
        key: &str,
        value: Option<&[u8]>,
        now: i64,
    ) -> Result<(), StoreError> {
        let write = effects::KvWrite {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            value: value.map(<[u8]>::to_vec),
        };
        self.tx(|tx| kv_write(tx, org, &write, now))
    }

    /// How many keys the org's `namespace` holds and the bytes of their
    /// values.
    pub fn kv_size(&self, org: &str, namespace: &str) -> Result<(i64, i64), StoreError> {
        self.read(|tx| {
            let row = tx.query_one(
                "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(LENGTH(value)), 0) AS BIGINT) AS bytes
                 FROM kv_entries WHERE org_id = ? AND namespace = ?",
                &[org.into(), namespace.into()],
            )?;
            match row {
                Some(row) => Ok((row.int("n")?, row.int("bytes")?)),
                None => Ok((0, 0)),
            }
        })
    }

    /// The org's `namespace`: key → value.
    pub fn kv_list(
        &self,
        org: &str,
        namespace: &str,
    ) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
        self.read(|tx| {
            Ok(kv_snapshot(tx, org, &[namespace.to_owned()])?
                .remove(namespace)
                .unwrap_or_default())
        })
    }
}

fn kv_write(
    tx: &mut dyn Tx,
    org: &str,
    write: &effects::KvWrite,
    now: i64,
) -> Result<(), StoreError> {
    match &write.value {
        Some(value) => tx.execute(
            "INSERT INTO kv_entries (org_id, namespace, key, value, updated_ms)
             VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (org_id, namespace, key) DO UPDATE SET value = excluded.value,
                 updated_ms = excluded.updated_ms",
            &[
                org.into(),
                write.namespace.as_str().into(),
                write.key.as_str().into(),
                value.clone().into(),
                now.into(),
            ],
        )?,
        None => tx.execute(
            "DELETE FROM kv_entries WHERE org_id = ? AND namespace = ? AND key = ?",
            &[
                org.into(),
                write.namespace.as_str().into(),
                write.key.as_str().into(),
            ],
        )?,
    };
    Ok(())
}

/// The org's `namespaces` as they are: namespace → key → value (a granted
/// namespace with no keys is there, empty).
fn kv_snapshot(
    tx: &mut dyn Tx,
    org: &str,
    namespaces: &[String],
) -> Result<KvSnapshot, StoreError> {
    let mut snapshot = BTreeMap::new();
    for namespace in namespaces {
        let mut entries = BTreeMap::new();
        for row in tx.query(
            "SELECT key, value FROM kv_entries WHERE org_id = ? AND namespace = ? ORDER BY key",
            &[org.into(), namespace.as_str().into()],
        )? {
            entries.insert(row.text("key")?, row.blob("value")?);
        }
        snapshot.insert(namespace.clone(), entries);
    }
    Ok(snapshot)
}
