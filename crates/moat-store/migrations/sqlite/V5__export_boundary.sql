-- Files a program wrote that the export boundary rejected: never stored
-- as bytes, only what was judged and why, so that a download by hash can
-- answer with the reason and an admin can see what was held back.
CREATE TABLE IF NOT EXISTS quarantine (
    org_id      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    op_id       TEXT NOT NULL,
    path        TEXT NOT NULL,
    sha256      TEXT,
    size        BIGINT NOT NULL,
    reasons     TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    PRIMARY KEY (run_id, op_id, path)
);
CREATE INDEX IF NOT EXISTS quarantine_by_sha ON quarantine (org_id, sha256);

-- Files that passed the export rules and wait for the approval the policy
-- asks for: their bytes are in blobs, but no artifact names them (so they
-- cannot be downloaded) until the approval promotes or rejects them.
CREATE TABLE IF NOT EXISTS held_exports (
    approval_id TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    op_id       TEXT NOT NULL,
    path        TEXT NOT NULL,
    sha256      TEXT NOT NULL REFERENCES blobs (sha256),
    size        BIGINT NOT NULL,
    exported_as TEXT NOT NULL,
    created_ms  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS held_exports_by_sha ON held_exports (org_id, sha256);
