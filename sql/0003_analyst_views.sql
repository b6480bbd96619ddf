-- Analyst views: acceptance rate of served recommendations by cluster, recommendation type,
-- model provider, policy version and day, each with a Wilson 95% interval. A shown item counts
-- as accepted when any 'accepted' or 'applied' feedback arrived for it.

CREATE VIEW analyst_shown_recommendations AS
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
    ) AS accepted
FROM decision_items i
JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id;

-- Wilson score interval for k successes out of n at z = 1.96.
CREATE FUNCTION arc_rec_wilson(k BIGINT, n BIGINT, bound INTEGER) RETURNS DOUBLE PRECISION
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN n = 0 THEN NULL ELSE
        ((k::float8 / n) + 1.9208 / n
         + bound * 1.96 * sqrt((k::float8 / n) * (1 - k::float8 / n) / n + 0.9604 / (n::float8 * n)))
        / (1 + 3.8416 / n)
    END
$$;

-- All five groupings in one pass; `group_by` names the dimension, `key` its value.
CREATE VIEW analyst_acceptance AS
SELECT
    org_id,
    CASE WHEN GROUPING(cluster_id) = 0 THEN 'cluster'
         WHEN GROUPING(recommendation_type) = 0 THEN 'type'
         WHEN GROUPING(model_provider) = 0 THEN 'provider'
         WHEN GROUPING(policy_version) = 0 THEN 'policy_version'
         ELSE 'day' END AS group_by,
    coalesce(cluster_id, recommendation_type, model_provider, policy_version, day::text) AS key,
    count(*) AS shown,
    count(*) FILTER (WHERE accepted) AS accepted,
    count(*) FILTER (WHERE accepted)::float8 / count(*) AS rate,
    arc_rec_wilson(count(*) FILTER (WHERE accepted), count(*), -1) AS ci95_low,
    arc_rec_wilson(count(*) FILTER (WHERE accepted), count(*), 1) AS ci95_high
FROM analyst_shown_recommendations
GROUP BY GROUPING SETS ((org_id, cluster_id), (org_id, recommendation_type),
                        (org_id, model_provider), (org_id, policy_version), (org_id, day));

CREATE VIEW analyst_acceptance_by_cluster AS
SELECT org_id, key, shown, accepted, rate, ci95_low, ci95_high
FROM analyst_acceptance WHERE group_by = 'cluster';

CREATE VIEW analyst_acceptance_by_type AS
SELECT org_id, key, shown, accepted, rate, ci95_low, ci95_high
FROM analyst_acceptance WHERE group_by = 'type';

CREATE VIEW analyst_acceptance_by_provider AS
SELECT org_id, key, shown, accepted, rate, ci95_low, ci95_high
FROM analyst_acceptance WHERE group_by = 'provider';

CREATE VIEW analyst_acceptance_by_policy AS
SELECT org_id, key, shown, accepted, rate, ci95_low, ci95_high
FROM analyst_acceptance WHERE group_by = 'policy_version';

CREATE VIEW analyst_acceptance_by_day AS
SELECT org_id, key, shown, accepted, rate, ci95_low, ci95_high
FROM analyst_acceptance WHERE group_by = 'day';

-- The platform's historical signal: approval rate of past config diffs by recommendation type.
CREATE VIEW analyst_diff_approval_by_type AS
SELECT org_id, coalesce(recommendation_type, 'unknown') AS key,
       count(*) AS decided, count(*) FILTER (WHERE approval_status = 'approved') AS approved,
       count(*) FILTER (WHERE approval_status = 'approved')::float8 / count(*) AS rate,
       arc_rec_wilson(count(*) FILTER (WHERE approval_status = 'approved'), count(*), -1) AS ci95_low,
       arc_rec_wilson(count(*) FILTER (WHERE approval_status = 'approved'), count(*), 1) AS ci95_high
FROM config_diffs WHERE approval_status <> 'pending'
GROUP BY org_id, coalesce(recommendation_type, 'unknown');
