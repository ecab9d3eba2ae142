-- Files promoted at the export boundary whose bytes are in the trusted
-- output store (`moat serve --outputs`: a directory or an S3 bucket)
-- rather than in blobs. A row is written in the transaction that records
-- the promotion, after the bytes were stored.
CREATE TABLE IF NOT EXISTS outputs (
    sha256      TEXT PRIMARY KEY,
    size        BIGINT NOT NULL,
    created_ms  BIGINT NOT NULL
);

-- An artifact's bytes are in blobs or in the output store, so its hash no
-- longer references blobs. SQLite drops a constraint by rebuilding the
-- table (nothing references artifacts).
CREATE TABLE artifacts_v6 (
    org_id      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    op_id       TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    size        BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    label       TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    PRIMARY KEY (run_id, op_id, sha256, kind)
);
INSERT INTO artifacts_v6 (org_id, run_id, op_id, sha256, size, kind, label, created_ms)
    SELECT org_id, run_id, op_id, sha256, size, kind, label, created_ms FROM artifacts;
DROP TABLE artifacts;
ALTER TABLE artifacts_v6 RENAME TO artifacts;
CREATE INDEX artifacts_by_sha ON artifacts (org_id, sha256);
