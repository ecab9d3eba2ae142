-- What each org's runs used, by UTC day of their end: added to as each run
-- ends (with its run.usage event, in the same transaction). Runs that ended
-- before this version are not in it; their run.usage events are.
CREATE TABLE IF NOT EXISTS usage_days (
    org_id TEXT NOT NULL,
    day TEXT NOT NULL,
    runs BIGINT NOT NULL DEFAULT 0,
    ops BIGINT NOT NULL DEFAULT 0,
    ops_failed BIGINT NOT NULL DEFAULT 0,
    programs BIGINT NOT NULL DEFAULT 0,
    cpu_ms BIGINT NOT NULL DEFAULT 0,
    program_wall_ms BIGINT NOT NULL DEFAULT 0,
    peak_memory_bytes BIGINT NOT NULL DEFAULT 0,
    egress_requests BIGINT NOT NULL DEFAULT 0,
    egress_bytes_out BIGINT NOT NULL DEFAULT 0,
    egress_bytes_in BIGINT NOT NULL DEFAULT 0,
    violations BIGINT NOT NULL DEFAULT 0,
    bytes_written BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, day)
);
