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
-- longer references blobs (whatever V1's constraint came to be named).
DO $$
DECLARE
    name text;
BEGIN
    FOR name IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = 'artifacts'::regclass AND contype = 'f'
          AND confrelid = 'blobs'::regclass
    LOOP
        EXECUTE format('ALTER TABLE artifacts DROP CONSTRAINT %I', name);
    END LOOP;
END
$$;
