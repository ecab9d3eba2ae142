-- The worker class's control-plane half. Each org's key-value namespaces
-- (the kv binding); its queues, each with the worker component that
-- consumes it (the module and inputs are blobs, named by hash); and their
-- messages, each delivered to a run of its own, acknowledged only when
-- that invocation succeeded, retried with backoff, dead-lettered after
-- max_attempts, and sent once per idempotency key.
CREATE TABLE IF NOT EXISTS kv_entries (
    org_id TEXT NOT NULL,
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (org_id, namespace, key)
);
CREATE TABLE IF NOT EXISTS queues (
    org_id TEXT NOT NULL,
    name TEXT NOT NULL,
    environment TEXT NOT NULL,
    module_sha256 TEXT NOT NULL,
    inputs TEXT NOT NULL,
    namespaces TEXT NOT NULL,
    max_attempts BIGINT NOT NULL,
    backoff_ms BIGINT NOT NULL,
    consumer TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (org_id, name)
);
CREATE TABLE IF NOT EXISTS queue_messages (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    queue TEXT NOT NULL,
    body TEXT NOT NULL,
    idempotency_key TEXT,
    state TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    visible_ms BIGINT NOT NULL,
    run_id TEXT,
    last_error TEXT,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS queue_messages_idempotency
    ON queue_messages (org_id, queue, idempotency_key);
CREATE INDEX IF NOT EXISTS queue_messages_due ON queue_messages (state, visible_ms);
CREATE INDEX IF NOT EXISTS queue_messages_run ON queue_messages (run_id);
