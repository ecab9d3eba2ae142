-- Plans that stay right while the planner knows nothing.
--
-- A fresh database has no statistics until autovacuum first analyses it
-- (a minute or more), and every table looks one row long. Indexes then
-- tie, a tie is decided by details such as the trees' heights, and the
-- generic plan a pooled connection caches at a statement's sixth use
-- stays until the next ANALYZE. Measured on the benchmark's run: looking an operation up by
-- its id went through `ops_queue` (by run, then state) and read every
-- operation of the run, 1,000 buffers and 2.6 ms at its 1,800th.
--
-- So each hot lookup has an index it can use that reads only the rows it
-- is about, and no index that reads more can compete with it (a query
-- can use a partial index only when its WHERE implies the index's).
--
-- `ops`: the primary key for an operation by id; `ops_open`, which holds
-- only operations still open, for the queue and the open count.
DROP INDEX IF EXISTS ops_queue;
CREATE INDEX IF NOT EXISTS ops_open ON ops (run_id, n)
    WHERE state IN ('pending_approval', 'queued', 'dispatched');

-- A run numbers its operations from a counter on its row (locked anyway
-- when an operation is queued) instead of `MAX(n)` over an index by
-- number, which would have been one more index an operation's lookup by
-- id could tie with.
--
-- While replicas of an older build still run beside a new one (a rolling
-- upgrade), they number ops from MAX(n) and leave the counter alone: a
-- trigger keeps the counter at least the highest number any insert gave,
-- so the two ways agree. It is created before the backfill, whose
-- statement then sees every op committed before the trigger's lock.
ALTER TABLE runs ADD COLUMN last_op_n BIGINT NOT NULL DEFAULT 0;
CREATE OR REPLACE FUNCTION moat_op_numbered() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs SET last_op_n = NEW.n WHERE id = NEW.run_id AND last_op_n < NEW.n;
    RETURN NULL;
END
$$;
CREATE TRIGGER ops_numbered AFTER INSERT ON ops
    FOR EACH ROW EXECUTE FUNCTION moat_op_numbered();
UPDATE runs SET last_op_n = COALESCE((SELECT MAX(n) FROM ops WHERE ops.run_id = runs.id), 0);
DROP INDEX IF EXISTS ops_run_n;

-- `runs`: a run by id goes by the primary key alone. The org (and the
-- runner) such a lookup also names is written `IS NOT DISTINCT FROM`, which
-- no index can take (the same as `=` there: neither side is ever NULL), so
-- that the org's runs by time or by state, kept for listings, never compete
-- with the key: while the planner believes a table small, every index
-- narrowed by the org alone looks one row long too, and which of two
-- equally cheap indexes wins then turns on their trees' heights, which
-- depend on how much dead entries were cleared. (Before this, a lookup
-- through runs_by_org or runs_queue read 350 to 480 buffers on the
-- benchmark's throughput run; with a unique index on (org_id, id) beside
-- them, it still did whenever that index's tree had grown a level first.)
-- Queued runs, the runs a runner holds and an org's live runs have
-- partial indexes of those runs alone.
CREATE INDEX IF NOT EXISTS runs_queued ON runs (org_id, environment, created_ms)
    WHERE state = 'queued';
DROP INDEX IF EXISTS runs_by_runner;
CREATE INDEX IF NOT EXISTS runs_held ON runs (runner_id)
    WHERE state IN ('claimed', 'running', 'paused');
CREATE INDEX IF NOT EXISTS runs_live ON runs (org_id)
    WHERE state IN ('claimed', 'running', 'paused');
