-- A run's operations by number: queuing one takes the run's highest
-- number, which without this index read every operation of the run (a
-- run's thousandth operation took a millisecond more than its first).
CREATE INDEX IF NOT EXISTS ops_run_n ON ops (run_id, n);
