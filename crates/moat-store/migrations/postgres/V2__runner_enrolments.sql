-- Runner enrolment by workload identity: an identity provider an org
-- trusts (issuer, subject, public keys as a JWKS), and the audience the
-- control plane made for it (unique: a token's audience names its
-- enrolment, and so its org). Runners that
-- registered with one of its tokens name it, so that revoking it refuses
-- them from their next request.
CREATE TABLE runner_enrolments (
    id          TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES orgs (id),
    name        TEXT NOT NULL,
    issuer      TEXT NOT NULL,
    audience    TEXT NOT NULL UNIQUE,
    subject     TEXT NOT NULL,
    jwks        TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    revoked_ms  BIGINT,
    UNIQUE (org_id, name)
);
ALTER TABLE runners ADD COLUMN enrolment_id TEXT;
