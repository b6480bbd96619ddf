-- Each decision logs its candidate set (a few kB of JSONB), which Postgres compresses when it
-- moves it out of line. lz4 costs a fraction of the default pglz's CPU on the serving path.
-- Servers built without lz4 keep pglz.
DO $$
BEGIN
    ALTER TABLE decision_log ALTER COLUMN candidates SET COMPRESSION lz4;
    ALTER TABLE decision_log ALTER COLUMN context SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available; decision log columns keep the default compression';
END
$$;
