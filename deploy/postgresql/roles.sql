-- The database and role for Moat's control plane. Run once, as a superuser:
--   psql -v ON_ERROR_STOP=1 -f roles.sql
-- then set the password (kept out of this file and out of shell history):
--   psql -c '\password moat'
--
-- The role owns its database: `moat serve` creates its tables there when it
-- starts (CREATE TABLE IF NOT EXISTS, under an advisory lock so that replicas
-- starting together take turns). It is not a superuser and cannot create
-- roles or databases.

CREATE ROLE moat LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
CREATE DATABASE moat OWNER moat ENCODING 'UTF8' TEMPLATE template0;
REVOKE ALL ON DATABASE moat FROM PUBLIC;

-- Per-role limits (see postgresql.conf.d/moat.conf, "Timeouts").
ALTER ROLE moat SET statement_timeout = '60s';
ALTER ROLE moat SET lock_timeout = '10s';
ALTER ROLE moat SET idle_in_transaction_session_timeout = '60s';
-- `moat serve` has no upper bound of its own on connections: this is it.
-- Keep it below max_connections minus what maintenance and replication need.
ALTER ROLE moat CONNECTION LIMIT 80;

-- The ledger's durability, stated for the role as well, in case the server
-- default is ever relaxed for other users of the same server.
ALTER ROLE moat SET synchronous_commit = 'on';
