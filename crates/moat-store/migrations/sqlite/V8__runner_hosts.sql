-- The host a runner runs on (a stable id: /etc/machine-id or what the
-- operator named) and the operator's labels (JSON object), as it said at
-- registration; absent for runners registered before.
ALTER TABLE runners ADD COLUMN host_id TEXT;
ALTER TABLE runners ADD COLUMN labels TEXT;
