-- Workload classes. A runner offers a set of classes and says what its
-- host can give (JSON); a run needs a set. Both sets are bit masks
-- (namespace = 1, microvm = 2), so that a claim compares them in one
-- expression: a runner takes a run only if it offers every class the run
-- needs. Runners registered before classes offer namespace only; runs
-- queued before them need nothing.
ALTER TABLE runners ADD COLUMN classes BIGINT NOT NULL DEFAULT 1;
ALTER TABLE runners ADD COLUMN host_features TEXT;
ALTER TABLE runs ADD COLUMN needs_classes BIGINT NOT NULL DEFAULT 0;
