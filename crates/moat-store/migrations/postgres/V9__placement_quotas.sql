-- Capacity, placement and quotas. A runner says how much CPU (millicores)
-- and memory (bytes) it may hand out (0: it did not say, so nothing is
-- reserved against it) and whether it is draining (claims nothing new). A
-- run holds a reservation of both while a runner holds it (0 otherwise),
-- and remembers the last reason it could not be placed, so that a refusal
-- is recorded once and its waiting reason shown.
ALTER TABLE runners ADD COLUMN cpu_millis BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN memory_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN draining BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cpu_millis BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN memory_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN placement_note TEXT;
-- An org's quotas (NULL: no limit), set by the deployment's admin. Usage
-- counts over the period (a UTC day or month) from usage_days; concurrent
-- runs count the runs runners hold now. Over quota, new runs wait, or are
-- refused when they are created (over = 'refuse').
CREATE TABLE IF NOT EXISTS org_quotas (
    org_id TEXT PRIMARY KEY,
    concurrent_runs BIGINT,
    cpu_seconds BIGINT,
    storage_bytes BIGINT,
    egress_bytes BIGINT,
    period TEXT NOT NULL DEFAULT 'day',
    over TEXT NOT NULL DEFAULT 'wait',
    updated_ms BIGINT NOT NULL
);
