-- Persistent volumes: an org's named work areas, kept as content-addressed
-- snapshots. `head` is the newest snapshot; `writer_run_id` the run that
-- attached it read-write (it holds the volume while it is live).
CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    name TEXT NOT NULL,
    head TEXT,
    files BIGINT NOT NULL DEFAULT 0,
    bytes BIGINT NOT NULL DEFAULT 0,
    writer_run_id TEXT,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    UNIQUE (org_id, name)
);
-- A chunk an org stored: what a runner of that org may ask for back. The
-- bytes are kept once whatever the number of orgs (volume_blobs, or the
-- output store's objects), but whether an org holds them is answered from
-- its own rows only.
CREATE TABLE IF NOT EXISTS volume_chunks (
    org_id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (org_id, sha256)
);
-- A snapshot of a volume, stored whole (every chunk it names held by the
-- org) before any result may make it the head.
CREATE TABLE IF NOT EXISTS volume_snapshots (
    volume_id TEXT NOT NULL,
    id TEXT NOT NULL,
    org_id TEXT NOT NULL,
    files BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    size BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (volume_id, id)
);
-- Chunk and snapshot bytes, by SHA-256, when the output store is the
-- database.
CREATE TABLE IF NOT EXISTS volume_blobs (
    sha256 TEXT PRIMARY KEY,
    data BYTEA NOT NULL
);
-- A run's attached volumes (JSON: volume id and name, path, read-only, the
-- snapshot it started from and the one it stands at); NULL: none.
ALTER TABLE runs ADD COLUMN volumes TEXT;
