-- A run numbers its operations from a counter on its row instead of
-- `MAX(n)` over an index by number (see the PostgreSQL migration of the
-- same number: there, that index made the planner's choice for an
-- operation's lookup by id depend on statistics). SQLite keeps `ops_queue`:
-- its planner prefers a unique key fully matched by equalities without
-- statistics, and it uses a partial index only when the query repeats the
-- index's WHERE term for term.
ALTER TABLE runs ADD COLUMN last_op_n INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET last_op_n = COALESCE((SELECT MAX(n) FROM ops WHERE ops.run_id = runs.id), 0);
DROP INDEX IF EXISTS ops_run_n;
