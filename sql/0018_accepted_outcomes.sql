-- What accepted recommendations did, counted beside the acceptance counts (sql/0015), so the
-- dashboard reads the same few thousand summed rows instead of joining the feedback with the
-- decision log (seconds at a million decisions):
--   - the reliability delta the platform reports with an accepting answer: an item's delta is
--     the one its first accepting answer (`accepted` or `applied`) carried, the answer that
--     counted it as accepted (`reliability_reported` counts them, `reliability_delta_sum` adds
--     them up);
--   - the expected cost change per run an item was served with: each shown item now keeps its
--     `expected_cost_delta_usd`, and an accepted item adds it to `accepted_cost_delta_sum`
--     (`accepted_cost_known` counts the accepted items that had one).

ALTER TABLE decision_items ADD COLUMN expected_cost_delta_usd DOUBLE PRECISION;

ALTER TABLE acceptance_counts
    ADD COLUMN reliability_reported BIGINT NOT NULL DEFAULT 0 CHECK (reliability_reported >= 0),
    ADD COLUMN reliability_delta_sum DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN accepted_cost_known BIGINT NOT NULL DEFAULT 0 CHECK (accepted_cost_known >= 0),
    ADD COLUMN accepted_cost_delta_sum DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE acceptance_deltas
    ADD COLUMN reliability_reported BIGINT NOT NULL DEFAULT 0 CHECK (reliability_reported >= 0),
    ADD COLUMN reliability_delta_sum DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN accepted_cost_known BIGINT NOT NULL DEFAULT 0 CHECK (accepted_cost_known >= 0),
    ADD COLUMN accepted_cost_delta_sum DOUBLE PRECISION NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION arc_rec_count_acceptance() RETURNS trigger LANGUAGE plpgsql AS $$
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
               arc_rec_source_key(i.model_version_id, i.source, i.candidate_features), 0, 1,
               (NEW.reliability_delta IS NOT NULL)::int, coalesce(NEW.reliability_delta, 0),
               (i.expected_cost_delta_usd IS NOT NULL)::int, coalesce(i.expected_cost_delta_usd, 0)
        FROM decision_items i
        JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id
        WHERE i.org_id = NEW.org_id AND i.event_id = NEW.event_id
          AND i.recommendation_id = NEW.recommendation_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION arc_rec_compact_acceptance() RETURNS BIGINT LANGUAGE plpgsql AS $$
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
               source_key, sum(shown) AS shown, sum(accepted) AS accepted,
               sum(reliability_reported) AS reliability_reported,
               sum(reliability_delta_sum) AS reliability_delta_sum,
               sum(accepted_cost_known) AS accepted_cost_known,
               sum(accepted_cost_delta_sum) AS accepted_cost_delta_sum, count(*) AS n
        FROM taken
        GROUP BY 1, 2, 3, 4, 5, 6, 7
    ), folded AS (
        INSERT INTO acceptance_counts
        SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version,
               source_key, shown, accepted, reliability_reported, reliability_delta_sum,
               accepted_cost_known, accepted_cost_delta_sum
        FROM summed
        ORDER BY 1, 2, 3, 4, 5, 6, 7
        ON CONFLICT (org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key)
        DO UPDATE SET shown = acceptance_counts.shown + EXCLUDED.shown,
                      accepted = acceptance_counts.accepted + EXCLUDED.accepted,
                      reliability_reported = acceptance_counts.reliability_reported + EXCLUDED.reliability_reported,
                      reliability_delta_sum = acceptance_counts.reliability_delta_sum + EXCLUDED.reliability_delta_sum,
                      accepted_cost_known = acceptance_counts.accepted_cost_known + EXCLUDED.accepted_cost_known,
                      accepted_cost_delta_sum = acceptance_counts.accepted_cost_delta_sum + EXCLUDED.accepted_cost_delta_sum
    )
    SELECT coalesce(sum(n), 0) INTO moved FROM summed;
    RETURN moved;
END
$$;

-- Row-level truth of the new columns: each shown item's reliability delta as its first
-- accepting answer reported it (NULL when it was not accepted or the answer carried none), and
-- its expected cost change as it was served (NULL for items logged before this column).
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
    arc_rec_source_key(i.model_version_id, i.source, i.candidate_features) AS source_key,
    (SELECT f.reliability_delta FROM feedback f
     WHERE f.org_id = i.org_id AND f.event_id = i.event_id
       AND f.recommendation_id = i.recommendation_id
       AND f.outcome IN ('accepted', 'applied')
     ORDER BY f.received_at, f.outcome
     LIMIT 1) AS reliability_delta,
    i.expected_cost_delta_usd
FROM decision_items i
JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id;

CREATE OR REPLACE FUNCTION arc_rec_recount_acceptance() RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    groups BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(7002);
    DELETE FROM acceptance_deltas;
    DELETE FROM acceptance_counts;
    INSERT INTO acceptance_counts
    SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key,
           count(*), count(*) FILTER (WHERE accepted),
           count(reliability_delta), coalesce(sum(reliability_delta), 0),
           count(expected_cost_delta_usd) FILTER (WHERE accepted),
           coalesce(sum(expected_cost_delta_usd) FILTER (WHERE accepted), 0)
    FROM analyst_shown_recommendations
    GROUP BY 1, 2, 3, 4, 5, 6, 7;
    GET DIAGNOSTICS groups = ROW_COUNT;
    RETURN groups;
END
$$;

CREATE OR REPLACE VIEW analyst_acceptance_counts AS
SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key,
       sum(shown)::bigint AS shown, sum(accepted)::bigint AS accepted,
       sum(reliability_reported)::bigint AS reliability_reported,
       sum(reliability_delta_sum)::float8 AS reliability_delta_sum,
       sum(accepted_cost_known)::bigint AS accepted_cost_known,
       sum(accepted_cost_delta_sum)::float8 AS accepted_cost_delta_sum
FROM (
    SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key,
           shown, accepted, reliability_reported, reliability_delta_sum, accepted_cost_known,
           accepted_cost_delta_sum
    FROM acceptance_counts
    UNION ALL
    SELECT org_id, day, cluster_id, recommendation_type, model_provider, policy_version, source_key,
           shown, accepted, reliability_reported, reliability_delta_sum, accepted_cost_known,
           accepted_cost_delta_sum
    FROM acceptance_deltas
) AS both_parts
GROUP BY 1, 2, 3, 4, 5, 6, 7;

SELECT arc_rec_recount_acceptance();
