-- The schema as first released (moat serve before versioned migrations).
-- IF NOT EXISTS: a database made by that release adopts it unchanged.
-- Times are milliseconds since the epoch (*_ms), except in event bodies.
CREATE TABLE IF NOT EXISTS orgs (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_ms  BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    hash        TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES orgs (id),
    kind        TEXT NOT NULL,
    expires_ms  BIGINT NOT NULL,
    used        BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS runs (
    id              TEXT PRIMARY KEY,
    org_id          TEXT NOT NULL REFERENCES orgs (id),
    state           TEXT NOT NULL,
    environment     TEXT NOT NULL,
    runner_id       TEXT,
    manifest_hash   TEXT,
    lease_until_ms  BIGINT NOT NULL DEFAULT 0,
    attempts        BIGINT NOT NULL DEFAULT 0,
    max_attempts    BIGINT NOT NULL,
    finish_wanted   BIGINT NOT NULL DEFAULT 0,
    inputs          TEXT NOT NULL,
    error           TEXT,
    created_ms      BIGINT NOT NULL,
    claimed_ms      BIGINT NOT NULL DEFAULT 0,
    updated_ms      BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_queue ON runs (org_id, state, created_ms);
CREATE TABLE IF NOT EXISTS ops (
    run_id      TEXT NOT NULL REFERENCES runs (id),
    id          TEXT NOT NULL,
    org_id      TEXT NOT NULL,
    n           BIGINT NOT NULL,
    op          TEXT NOT NULL,
    state       TEXT NOT NULL,
    envelope    TEXT NOT NULL,
    decision    TEXT NOT NULL,
    result      TEXT,
    created_ms  BIGINT NOT NULL,
    updated_ms  BIGINT NOT NULL,
    PRIMARY KEY (run_id, id)
);
CREATE INDEX IF NOT EXISTS ops_queue ON ops (run_id, state, n);
CREATE TABLE IF NOT EXISTS events (
    seq         BIGINT PRIMARY KEY,
    org_id      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    body        BLOB NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_run ON events (org_id, run_id, seq);
CREATE TABLE IF NOT EXISTS ledger_head (
    id    BIGINT PRIMARY KEY CHECK (id = 1),
    seq   BIGINT NOT NULL,
    hash  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    sha256  TEXT PRIMARY KEY,
    size    BIGINT NOT NULL,
    data    BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS artifacts (
    org_id      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    op_id       TEXT NOT NULL,
    sha256      TEXT NOT NULL REFERENCES blobs (sha256),
    size        BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    label       TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    PRIMARY KEY (run_id, op_id, sha256, kind)
);
CREATE INDEX IF NOT EXISTS artifacts_by_sha ON artifacts (org_id, sha256);
CREATE TABLE IF NOT EXISTS runner_builds (
    org_id      TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    label       TEXT NOT NULL,
    revoked     BIGINT NOT NULL DEFAULT 0,
    created_ms  BIGINT NOT NULL,
    PRIMARY KEY (org_id, sha256)
);
CREATE TABLE IF NOT EXISTS manifests (
    org_id        TEXT NOT NULL,
    hash          TEXT NOT NULL,
    environment   TEXT NOT NULL,
    signed        TEXT NOT NULL,
    signed_by     TEXT NOT NULL,
    expires_ms    BIGINT NOT NULL,
    published_ms  BIGINT NOT NULL,
    revoked       BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, hash)
);
CREATE TABLE IF NOT EXISTS revoked_keys (
    org_id      TEXT NOT NULL,
    public_key  TEXT NOT NULL,
    PRIMARY KEY (org_id, public_key)
);
CREATE TABLE IF NOT EXISTS runners (
    id             TEXT PRIMARY KEY,
    org_id         TEXT NOT NULL REFERENCES orgs (id),
    runner_hash    TEXT NOT NULL,
    manifest_hash  TEXT NOT NULL,
    policy_hash    TEXT NOT NULL,
    version        TEXT NOT NULL,
    environment    TEXT NOT NULL,
    ops            TEXT NOT NULL,
    sandbox_mode   TEXT NOT NULL,
    boot_time      TEXT NOT NULL,
    public_key     TEXT NOT NULL,
    registered_ms  BIGINT NOT NULL,
    seen_ms        BIGINT NOT NULL,
    slots          BIGINT NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS approvals (
    id            TEXT PRIMARY KEY,
    org_id        TEXT NOT NULL REFERENCES orgs (id),
    run_id        TEXT NOT NULL,
    op_id         TEXT NOT NULL,
    state         TEXT NOT NULL,
    rule          TEXT NOT NULL,
    risk          TEXT NOT NULL,
    summary       TEXT NOT NULL,
    requested_ms  BIGINT NOT NULL,
    expires_ms    BIGINT NOT NULL,
    resolved_ms   BIGINT,
    resolved_by   TEXT,
    reason        TEXT
);
CREATE INDEX IF NOT EXISTS approvals_by_org ON approvals (org_id, state, requested_ms);
CREATE INDEX IF NOT EXISTS approvals_due ON approvals (state, expires_ms);
CREATE INDEX IF NOT EXISTS runs_by_org ON runs (org_id, created_ms);
CREATE INDEX IF NOT EXISTS runs_by_runner ON runs (runner_id, state);
CREATE TABLE IF NOT EXISTS secrets (
    org_id      TEXT NOT NULL REFERENCES orgs (id),
    name        TEXT NOT NULL,
    nonce       BLOB NOT NULL,
    ciphertext  BLOB NOT NULL,
    updated_ms  BIGINT NOT NULL,
    PRIMARY KEY (org_id, name)
);
CREATE TABLE IF NOT EXISTS tools (
    org_id      TEXT NOT NULL REFERENCES orgs (id),
    name        TEXT NOT NULL,
    definition  TEXT NOT NULL,
    updated_ms  BIGINT NOT NULL,
    PRIMARY KEY (org_id, name)
);
CREATE TABLE IF NOT EXISTS tool_calls (
    run_id      TEXT NOT NULL,
    op_id       TEXT NOT NULL,
    started_ms  BIGINT NOT NULL,
    PRIMARY KEY (run_id, op_id)
);
CREATE TABLE IF NOT EXISTS tool_tokens (
    hash        TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    op_id       TEXT NOT NULL,
    tools       TEXT NOT NULL,
    expires_ms  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS tool_tokens_by_op ON tool_tokens (run_id, op_id);
CREATE TABLE IF NOT EXISTS request_nonces (
    runner_id   TEXT NOT NULL,
    nonce       TEXT NOT NULL,
    expires_ms  BIGINT NOT NULL,
    PRIMARY KEY (runner_id, nonce)
);
INSERT INTO ledger_head (id, seq, hash)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000')
ON CONFLICT (id) DO NOTHING;
