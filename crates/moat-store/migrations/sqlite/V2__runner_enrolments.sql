-- Runner enrolment by workload identity: an identity provider an org
-- trusts (issuer, audience, subject, public keys as a JWKS). Runners that
-- registered with one of its tokens name it, so that revoking it refuses
-- them from their next request.
CREATE TABLE runner_enrolments (
    id          TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES orgs (id),
    name        TEXT NOT NULL,
    issuer      TEXT NOT NULL,
    audience    TEXT NOT NULL,
    subject     TEXT NOT NULL,
    jwks        TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    revoked_ms  BIGINT,
    UNIQUE (org_id, name)
);
CREATE INDEX runner_enrolments_by_issuer ON runner_enrolments (issuer);
ALTER TABLE runners ADD COLUMN enrolment_id TEXT;
