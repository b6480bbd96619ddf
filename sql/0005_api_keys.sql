-- API keys: only a SHA-256 of the secret is stored. Roles: platform (recommend, feedback,
-- ingest), analyst (analytics, read only), admin (keys and analytics).

CREATE TABLE api_keys (
    org_id       TEXT NOT NULL REFERENCES organizations (org_id),
    key_id       TEXT NOT NULL UNIQUE CHECK (key_id ~ '^[0-9a-f]{16}$'),
    secret_hash  TEXT NOT NULL CHECK (secret_hash ~ '^[0-9a-f]{64}$'),
    role         TEXT NOT NULL CHECK (role IN ('platform', 'analyst', 'admin')),
    label        TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at   TIMESTAMPTZ,
    PRIMARY KEY (org_id, key_id)
);
