-- The manifest a run was created for (NULL: any), kept apart from
-- manifest_hash, which a claim sets to the claiming runner's: a run given
-- back (released by a stopping runner, or retried after a lost lease)
-- returns to the queue with the pin it was created with, not tied to a
-- manifest a rollout may have retired. Runs from before keep the manifest
-- they have now.
ALTER TABLE runs ADD COLUMN manifest_pin TEXT;
UPDATE runs SET manifest_pin = manifest_hash;
