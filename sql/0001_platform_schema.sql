-- The evaluation platform's tables, mirrored from Arc-Eval's schema (arc/database/schema/tables.sql)
-- so a real deployment can point arc-rec at the same shapes. Differences, on purpose:
--   * ids are TEXT (the platform's UUIDs or any unique strings), scoped by org_id;
--   * every table carries org_id and every reference includes it, so no row can point across
--     organizations (composite foreign keys);
--   * enums are TEXT with CHECK constraints (same labels as the platform);
--   * VECTOR(1536) columns are REAL[] (any fixed dimension per organization, no pgvector needed).

CREATE TABLE organizations (
    org_id      TEXT PRIMARY KEY CHECK (org_id ~ '^[A-Za-z0-9._-]{1,128}$'),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Not a platform table: the role and domain the acceptance model segments users by.
CREATE TABLE users (
    org_id      TEXT NOT NULL REFERENCES organizations (org_id),
    user_id     TEXT NOT NULL,
    user_role   TEXT,
    domain      TEXT,
    PRIMARY KEY (org_id, user_id)
);

CREATE TABLE configurations (
    org_id             TEXT NOT NULL REFERENCES organizations (org_id),
    config_id          TEXT NOT NULL,
    name               TEXT NOT NULL,
    user_id            TEXT,
    latest_version_id  TEXT,
    is_active          BOOLEAN NOT NULL DEFAULT true,
    modal_app_id       TEXT,
    sandbox_config     JSONB,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, config_id)
);

CREATE TABLE config_versions (
    org_id          TEXT NOT NULL,
    version_id      TEXT NOT NULL,
    config_id       TEXT NOT NULL,
    version_number  INTEGER NOT NULL CHECK (version_number >= 1),
    raw_yaml        TEXT,
    parsed_config   JSONB NOT NULL,
    config_hash     TEXT NOT NULL CHECK (config_hash ~ '^[0-9a-f]{64}$'),
    generated_by    TEXT NOT NULL DEFAULT 'manual'
                    CHECK (generated_by IN ('manual', 'llm_recommendation', 'diff_engine', 'api')),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, version_id),
    FOREIGN KEY (org_id, config_id) REFERENCES configurations (org_id, config_id),
    UNIQUE (org_id, config_id, version_number),
    -- The platform's rule: a configuration names a model and a temperature between 0 and 2.
    CONSTRAINT parsed_config_has_model_and_temperature
        CHECK (parsed_config ? 'model' AND parsed_config ? 'temperature'),
    CONSTRAINT parsed_config_temperature_range CHECK (
        CASE WHEN jsonb_typeof(parsed_config -> 'temperature') = 'number'
             THEN (parsed_config ->> 'temperature')::float8 BETWEEN 0 AND 2
             ELSE false END)
);
CREATE INDEX config_versions_config_idx ON config_versions (org_id, config_id, version_number);

CREATE TABLE scenarios (
    org_id              TEXT NOT NULL REFERENCES organizations (org_id),
    scenario_id         TEXT NOT NULL,
    name                TEXT NOT NULL,
    description         TEXT,
    expected_tools      TEXT[] NOT NULL DEFAULT '{}',
    difficulty_level    TEXT,
    domain              TEXT,
    scenario_embedding  REAL[],
    PRIMARY KEY (org_id, scenario_id)
);

CREATE TABLE simulations (
    org_id             TEXT NOT NULL,
    simulation_id      TEXT NOT NULL,
    config_version_id  TEXT NOT NULL,
    scenario_set       TEXT[],
    status             TEXT NOT NULL,
    overall_score      REAL CHECK (overall_score BETWEEN 0 AND 1),
    execution_time_ms  BIGINT CHECK (execution_time_ms >= 0),
    total_cost_usd     DOUBLE PRECISION CHECK (total_cost_usd >= 0),
    metadata           JSONB,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, simulation_id),
    FOREIGN KEY (org_id, config_version_id) REFERENCES config_versions (org_id, version_id)
);
CREATE INDEX simulations_version_idx ON simulations (org_id, config_version_id);

CREATE TABLE outcomes (
    org_id                TEXT NOT NULL,
    outcome_id            TEXT NOT NULL,
    simulation_id         TEXT NOT NULL,
    scenario_id           TEXT NOT NULL,
    execution_time        TIMESTAMPTZ NOT NULL,
    status                TEXT NOT NULL CHECK (status IN ('success', 'error', 'timeout', 'cancelled')),
    reliability_score     DOUBLE PRECISION NOT NULL CHECK (reliability_score BETWEEN 0 AND 1),
    execution_time_ms     BIGINT CHECK (execution_time_ms >= 0),
    tokens_used           BIGINT CHECK (tokens_used >= 0),
    cost_usd              DOUBLE PRECISION CHECK (cost_usd >= 0),
    trajectory            JSONB NOT NULL CHECK (trajectory ? 'start_time' AND trajectory ? 'status'),
    trajectory_embedding  REAL[],
    metrics               JSONB,
    retry_count           INTEGER NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    error_code            TEXT,
    error_category        TEXT CHECK (error_category IN
                              ('timeout', 'tool_error', 'model_error', 'validation_error',
                               'system_error', 'sandbox_error')),
    PRIMARY KEY (org_id, outcome_id),
    FOREIGN KEY (org_id, simulation_id) REFERENCES simulations (org_id, simulation_id),
    FOREIGN KEY (org_id, scenario_id) REFERENCES scenarios (org_id, scenario_id)
);
CREATE INDEX outcomes_simulation_idx ON outcomes (org_id, simulation_id);
CREATE INDEX outcomes_time_idx ON outcomes (org_id, execution_time);
-- Containment queries over trajectories (`trajectory @> '{"error_events": [...]}'`).
CREATE INDEX outcomes_trajectory_gin ON outcomes USING GIN (trajectory jsonb_path_ops);

CREATE TABLE failure_patterns (
    org_id                  TEXT NOT NULL,
    pattern_id              TEXT NOT NULL,
    outcome_id              TEXT NOT NULL,
    execution_time          TIMESTAMPTZ,
    failure_type            TEXT NOT NULL,
    failure_category        TEXT NOT NULL,
    error_message           TEXT NOT NULL,
    error_embedding         REAL[],
    pattern_cluster_id      TEXT,
    cluster_confidence      REAL CHECK (cluster_confidence BETWEEN 0 AND 1),
    similar_failures_count  INTEGER,
    recovery_attempted      BOOLEAN NOT NULL DEFAULT false,
    recovery_successful     BOOLEAN NOT NULL DEFAULT false,
    resolution_steps        JSONB,
    llm_analysis            JSONB,
    PRIMARY KEY (org_id, pattern_id),
    FOREIGN KEY (org_id, outcome_id) REFERENCES outcomes (org_id, outcome_id)
);
CREATE INDEX failure_patterns_outcome_idx ON failure_patterns (org_id, outcome_id);

-- Past recommendations as config diffs; approval_status is the accept/reject signal.
-- version_before/version_after are not foreign keys: the platform records a diff before the
-- version it would produce exists (pending and rejected diffs never get one).
CREATE TABLE config_diffs (
    org_id               TEXT NOT NULL,
    diff_id              TEXT NOT NULL,
    config_id            TEXT NOT NULL,
    version_before       TEXT NOT NULL,
    version_after        TEXT,
    diff_yaml            TEXT,
    change_summary       TEXT NOT NULL,
    diff                 JSONB NOT NULL CHECK (jsonb_typeof(diff) = 'object'),
    recommendation_type  TEXT,
    impact_prediction    JSONB,
    llm_generated        BOOLEAN NOT NULL DEFAULT false,
    approval_status      TEXT NOT NULL DEFAULT 'pending'
                         CHECK (approval_status IN ('pending', 'approved', 'rejected')),
    approved_by          TEXT,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, diff_id),
    FOREIGN KEY (org_id, config_id) REFERENCES configurations (org_id, config_id)
);
CREATE INDEX config_diffs_created_idx ON config_diffs (org_id, created_at);
CREATE INDEX config_diffs_before_idx ON config_diffs (org_id, version_before);

-- The platform's own recommendation records (kept for a faithful mirror; arc-rec's served
-- recommendations live in decision_log/decision_items).
CREATE TABLE recommendations (
    org_id                  TEXT NOT NULL REFERENCES organizations (org_id),
    recommendation_id       TEXT NOT NULL,
    source_type             TEXT NOT NULL CHECK (source_type IN
                                ('simulation', 'outcome', 'config_diff', 'pattern_analysis',
                                 'time_series_analysis')),
    source_id               TEXT,
    recommendation_type     TEXT NOT NULL CHECK (recommendation_type IN
                                ('config_change', 'scenario_addition', 'tool_optimization',
                                 'performance_tuning', 'modal_optimization')),
    description             TEXT NOT NULL,
    suggested_yaml_changes  TEXT,
    impact_estimate         JSONB,
    confidence              REAL CHECK (confidence BETWEEN 0 AND 1),
    llm_model_used          TEXT,
    llm_prompt_hash         TEXT,
    historical_data_window  TEXT,
    applied                 BOOLEAN NOT NULL DEFAULT false,
    applied_at              TIMESTAMPTZ,
    applied_by              TEXT,
    feedback_score          INTEGER CHECK (feedback_score BETWEEN 1 AND 5),
    created_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, recommendation_id)
);
