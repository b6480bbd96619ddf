-- Acceptance counts kept up to date as decisions and answers are written, so analyst queries
-- read a few thousand summed rows instead of joining the whole decision log with its feedback
-- (which took seconds per query at a million decisions, and timed out under load).
--
-- Writers append deltas (never update a shared row, so concurrent writers never wait on each
-- other); `arc_rec_compact_acceptance()` folds committed deltas into `acceptance_counts`
-- (the server calls it every few seconds); readers sum both, so what they see is exact at any
-- moment. `analyst_shown_recommendations` (sql/0003, sql/0011) stays the row-level truth these
-- counts must equal.

-- How a shown item's source is named in analytics: `model:<version>`, its logged source, or
-- (for rows logged before sources were) the model flag of its candidate features.
CREATE FUNCTION arc_rec_source_key(model_version_id TEXT, source TEXT, candidate_features REAL[])
RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN model_version_id IS NOT NULL THEN 'model:' || model_version_id
                WHEN source IS NOT NULL THEN source
                WHEN candidate_features[14] > 0.5 THEN 'model'
                ELSE 'heuristic' END
$$;

CREATE TABLE acceptance_counts (
    org_id               TEXT NOT NULL,
    day                  DATE NOT NULL,
    cluster_id           TEXT NOT NULL,
    recommendation_type  TEXT NOT NULL,
    model_provider       TEXT NOT NULL,
    policy_version       TEXT NOT NULL,
    source_key           TEXT NOT NULL,
    shown                BIGINT NOT NULL CHECK (shown >= 0),
    accepted             BIGINT NOT NULL CHECK (accepted >= 0),
    PRIMARY KEY (org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key)
);

-- Written by `storage::decisions::insert_decisions` (shown) and by the feedback trigger below
-- (accepted); emptied into acceptance_counts by arc_rec_compact_acceptance().
-- Same columns and checks as acceptance_counts, without its key: many rows per combination.
CREATE TABLE acceptance_deltas (LIKE acceptance_counts INCLUDING CONSTRAINTS);
CREATE INDEX acceptance_deltas_org_idx ON acceptance_deltas (org_id);

-- An item is accepted once, at its first `accepted` or `applied` answer. Two such answers about
-- one item may arrive at once (on two replicas): the advisory lock, held to commit, orders them,
-- and the second's check (a new snapshot, after the wait) sees the first.
CREATE FUNCTION arc_rec_count_acceptance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        NEW.org_id || '/' || NEW.event_id::text || '/' || NEW.recommendation_id, 7001));
    IF NOT EXISTS (
        SELECT 1 FROM feedback f
        WHERE f.org_id = NEW.org_id AND f.event_id = NEW.event_id
          AND f.recommendation_id = NEW.recommendation_id
          AND f.outcome IN ('accepted', 'applied') AND f.outcome <> NEW.outcome
    ) THEN
        INSERT INTO acceptance_deltas
        SELECT l.org_id, (l.created_at AT TIME ZONE 'UTC')::date, coalesce(l.cluster_id, 'unassigned'),
               i.recommendation_type, coalesce(i.model_provider, 'unknown'), l.policy_version,
               arc_rec_source_key(i.model_version_id, i.source, i.candidate_features), 0, 1
        FROM decision_items i
        JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id
        WHERE i.org_id = NEW.org_id AND i.event_id = NEW.event_id
          AND i.recommendation_id = NEW.recommendation_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER feedback_counts_acceptance
AFTER INSERT ON feedback
FOR EACH ROW WHEN (NEW.outcome IN ('accepted', 'applied'))
EXECUTE FUNCTION arc_rec_count_acceptance();

-- Folds the committed deltas into acceptance_counts; returns how many delta rows it moved. One
-- caller at a time (a second replica calling meanwhile returns 0 at once); deltas committed
-- while it runs stay for the next call.
CREATE FUNCTION arc_rec_compact_acceptance() RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    moved BIGINT;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7002) THEN
        RETURN 0;
    END IF;
    WITH taken AS (
        DELETE FROM acceptance_deltas RETURNING *
    ), summed AS (
        SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version,
               source_key, sum(shown) AS shown, sum(accepted) AS accepted, count(*) AS n
        FROM taken
        GROUP BY 1, 2, 3, 4, 5, 6, 7
    ), folded AS (
        INSERT INTO acceptance_counts
        SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version,
               source_key, shown, accepted
        FROM summed
        ORDER BY 1, 2, 3, 4, 5, 6, 7
        ON CONFLICT (org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key)
        DO UPDATE SET shown = acceptance_counts.shown + EXCLUDED.shown,
                      accepted = acceptance_counts.accepted + EXCLUDED.accepted
    )
    SELECT coalesce(sum(n), 0) INTO moved FROM summed;
    RETURN moved;
END
$$;

-- Recounts everything from the row-level view: for a database written before this migration, or
-- rows written around the service (a fixture, a manual import). Takes the compaction lock so no
-- compaction interleaves; writers must be stopped.
CREATE FUNCTION arc_rec_recount_acceptance() RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    groups BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(7002);
    DELETE FROM acceptance_deltas;
    DELETE FROM acceptance_counts;
    INSERT INTO acceptance_counts
    SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key,
           count(*), count(*) FILTER (WHERE accepted)
    FROM analyst_shown_recommendations
    GROUP BY 1, 2, 3, 4, 5, 6, 7;
    GET DIAGNOSTICS groups = ROW_COUNT;
    RETURN groups;
END
$$;

CREATE OR REPLACE VIEW analyst_shown_recommendations AS
SELECT
    i.org_id,
    i.event_id,
    i.recommendation_id,
    i.position,
    i.recommendation_type,
    coalesce(i.model_provider, 'unknown') AS model_provider,
    coalesce(l.cluster_id, 'unassigned') AS cluster_id,
    l.policy_version,
    (l.created_at AT TIME ZONE 'UTC')::date AS day,
    i.propensity,
    EXISTS (
        SELECT 1 FROM feedback f
        WHERE f.org_id = i.org_id AND f.event_id = i.event_id
          AND f.recommendation_id = i.recommendation_id
          AND f.outcome IN ('accepted', 'applied')
    ) AS accepted,
    arc_rec_source_key(i.model_version_id, i.source, i.candidate_features) AS source_key
FROM decision_items i
JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id;

SELECT arc_rec_recount_acceptance();

-- The counts as of now (folded and pending), one row per combination of dimensions: what the
-- API, the CLI and the dashboard read, and the fast way to answer acceptance questions in psql.
CREATE VIEW analyst_acceptance_counts AS
SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key,
       sum(shown)::bigint AS shown, sum(accepted)::bigint AS accepted
FROM (
    SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key,
           shown, accepted
    FROM acceptance_counts
    UNION ALL
    SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key,
           shown, accepted
    FROM acceptance_deltas
) AS both_parts
GROUP BY 1, 2, 3, 4, 5, 6, 7;
