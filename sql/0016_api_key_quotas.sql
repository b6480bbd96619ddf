-- A key's own daily request quota (`arc-rec keys create|set-quota --daily-quota N`), overriding
-- its role's (`arc-rec serve --daily-quota ROLE=N`), and each key's requests per UTC day: every
-- server adds its admitted requests to the day's row about once a second and reads back the
-- total, which is how replicas share one quota.

ALTER TABLE api_keys ADD COLUMN daily_quota BIGINT CHECK (daily_quota >= 1);

CREATE TABLE api_key_usage (
    org_id    TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    day       DATE NOT NULL,
    requests  BIGINT NOT NULL CHECK (requests >= 0),
    PRIMARY KEY (key_id, day),
    FOREIGN KEY (org_id, key_id) REFERENCES api_keys (org_id, key_id)
);
