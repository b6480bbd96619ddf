-- The recommender model's candidates carry a prior (issue 20): what the learned grader expects
-- of each (its posterior mean acceptance probability for the candidate's contexts, and the
-- standard deviation of that estimate), which serving adds to the bandit's score in place of
-- zero. Heuristic candidates have none.
ALTER TABLE candidate_recommendations
    ADD COLUMN prior_mean DOUBLE PRECISION CHECK (prior_mean >= 0 AND prior_mean <= 1),
    ADD COLUMN prior_sd DOUBLE PRECISION CHECK (prior_sd >= 0 AND prior_sd <= 1),
    ADD CHECK ((prior_mean IS NULL) = (prior_sd IS NULL));

-- Each shown recommendation knows where it came from and the prior it was ranked with: the
-- learner learns a priced candidate's residual (reward − prior_mean), and analysts compare the
-- model's ideas with the heuristics'. Rows logged before this migration have NULLs; their
-- source is still known from the candidate features (index 14, 1-based: `source_model`).
ALTER TABLE decision_items
    ADD COLUMN source TEXT CHECK (source IN ('heuristic', 'model')),
    ADD COLUMN model_version_id TEXT,
    ADD COLUMN prior_mean DOUBLE PRECISION,
    ADD COLUMN prior_sd DOUBLE PRECISION;

-- Only appending columns is allowed to CREATE OR REPLACE VIEW: `source_key` goes last.
-- 'heuristic', or 'model:<model version>' ('model' for rows logged without the version).
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
    CASE WHEN i.model_version_id IS NOT NULL THEN 'model:' || i.model_version_id
         WHEN i.source IS NOT NULL THEN i.source
         WHEN i.candidate_features[14] > 0.5 THEN 'model'
         ELSE 'heuristic' END AS source_key
FROM decision_items i
JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id;

-- A sixth grouping set: by source.
CREATE OR REPLACE VIEW analyst_acceptance AS
SELECT
    org_id,
    CASE WHEN GROUPING(cluster_id) = 0 THEN 'cluster'
         WHEN GROUPING(recommendation_type) = 0 THEN 'type'
         WHEN GROUPING(model_provider) = 0 THEN 'provider'
         WHEN GROUPING(policy_version) = 0 THEN 'policy_version'
         WHEN GROUPING(source_key) = 0 THEN 'source'
         ELSE 'day' END AS group_by,
    coalesce(cluster_id, recommendation_type, model_provider, policy_version, source_key, day::text) AS key,
    count(*) AS shown,
    count(*) FILTER (WHERE accepted) AS accepted,
    count(*) FILTER (WHERE accepted)::float8 / count(*) AS rate,
    arc_rec_wilson(count(*) FILTER (WHERE accepted), count(*), -1) AS ci95_low,
    arc_rec_wilson(count(*) FILTER (WHERE accepted), count(*), 1) AS ci95_high
FROM analyst_shown_recommendations
GROUP BY GROUPING SETS ((org_id, cluster_id), (org_id, recommendation_type),
                        (org_id, model_provider), (org_id, policy_version), (org_id, source_key),
                        (org_id, day));

CREATE VIEW analyst_acceptance_by_source AS
SELECT org_id, key, shown, accepted, rate, ci95_low, ci95_high
FROM analyst_acceptance WHERE group_by = 'source';
