-- A key's own request rate limit (`arc-rec keys create|set-rate-limit --rate-limit RATE/BURST`),
-- overriding its role's default (`arc-rec serve --rate-limit ROLE=...`). Both or neither.

ALTER TABLE api_keys
    ADD COLUMN rate_per_second DOUBLE PRECISION CHECK (rate_per_second > 0 AND rate_per_second < 'Infinity'),
    ADD COLUMN burst INTEGER CHECK (burst >= 1),
    ADD CONSTRAINT api_keys_rate_limit_whole CHECK ((rate_per_second IS NULL) = (burst IS NULL));
