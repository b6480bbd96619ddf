-- arc-rec's own tables: failure clusters, candidates, the decision log and feedback, bandit
-- state, training runs and model versions. All scoped by org_id like the platform's tables.

CREATE TABLE training_runs (
    org_id        TEXT NOT NULL REFERENCES organizations (org_id),
    run_id        TEXT NOT NULL,
    status        TEXT NOT NULL DEFAULT 'running'
                  CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled')),
    config        JSONB NOT NULL,
    metrics       JSONB,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at   TIMESTAMPTZ,
    PRIMARY KEY (org_id, run_id)
);

CREATE TABLE model_versions (
    org_id            TEXT NOT NULL,
    model_version_id  TEXT NOT NULL,
    run_id            TEXT,
    base_model        TEXT NOT NULL,
    adapter_path      TEXT,
    metrics           JSONB,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, model_version_id),
    FOREIGN KEY (org_id, run_id) REFERENCES training_runs (org_id, run_id)
);

-- Cluster ids are stable across re-clustering: new centroids are matched to old ones.
CREATE TABLE failure_clusters (
    org_id       TEXT NOT NULL REFERENCES organizations (org_id),
    cluster_id   TEXT NOT NULL,
    label        TEXT NOT NULL,
    centroid     REAL[] NOT NULL,
    size         INTEGER NOT NULL DEFAULT 0 CHECK (size >= 0),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, cluster_id)
);

CREATE TABLE candidate_recommendations (
    org_id                      TEXT NOT NULL REFERENCES organizations (org_id),
    candidate_id                TEXT NOT NULL,
    cluster_id                  TEXT,
    recommendation_type         TEXT NOT NULL,
    diff                        JSONB NOT NULL CHECK (jsonb_typeof(diff) = 'object'),
    description                 TEXT NOT NULL,
    expected_reliability_delta  DOUBLE PRECISION,
    expected_cost_delta_usd     DOUBLE PRECISION,
    evidence_count              INTEGER NOT NULL DEFAULT 0 CHECK (evidence_count >= 0),
    source                      TEXT NOT NULL CHECK (source IN ('heuristic', 'model')),
    model_version_id            TEXT,
    created_at                  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, candidate_id),
    FOREIGN KEY (org_id, cluster_id) REFERENCES failure_clusters (org_id, cluster_id),
    FOREIGN KEY (org_id, model_version_id) REFERENCES model_versions (org_id, model_version_id),
    CHECK ((source = 'model') = (model_version_id IS NOT NULL))
);

-- One row per recommendation request: everything needed to recompute another policy's
-- probabilities later (context snapshot, candidate set, seed, policy version).
CREATE TABLE decision_log (
    org_id          TEXT NOT NULL REFERENCES organizations (org_id),
    event_id        UUID NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    policy_version  TEXT NOT NULL,
    seed            BIGINT NOT NULL,
    cluster_id      TEXT,
    context         JSONB NOT NULL,
    candidates      JSONB NOT NULL,
    user_role       TEXT,
    domain          TEXT,
    PRIMARY KEY (org_id, event_id)
);
CREATE INDEX decision_log_created_idx ON decision_log (org_id, created_at);

-- The shown ranking: one row per shown recommendation with its position and propensity.
CREATE TABLE decision_items (
    org_id               TEXT NOT NULL,
    event_id             UUID NOT NULL,
    recommendation_id    TEXT NOT NULL,
    position             INTEGER NOT NULL CHECK (position >= 0),
    recommendation_type  TEXT NOT NULL,
    model_provider       TEXT,
    diff                 JSONB NOT NULL,
    score                DOUBLE PRECISION NOT NULL,
    propensity           DOUBLE PRECISION NOT NULL CHECK (propensity > 0 AND propensity <= 1),
    PRIMARY KEY (org_id, event_id, recommendation_id),
    UNIQUE (org_id, event_id, position),
    FOREIGN KEY (org_id, event_id) REFERENCES decision_log (org_id, event_id)
);

-- Feedback joins on event_id; the same feedback twice is one row (primary key).
CREATE TABLE feedback (
    org_id             TEXT NOT NULL,
    event_id           UUID NOT NULL,
    recommendation_id  TEXT NOT NULL,
    outcome            TEXT NOT NULL CHECK (outcome IN ('accepted', 'rejected', 'applied')),
    reliability_delta  DOUBLE PRECISION,
    feedback_score     INTEGER CHECK (feedback_score BETWEEN 1 AND 5),
    received_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, event_id, recommendation_id, outcome),
    FOREIGN KEY (org_id, event_id, recommendation_id)
        REFERENCES decision_items (org_id, event_id, recommendation_id)
);

CREATE TABLE bandit_state (
    org_id          TEXT NOT NULL REFERENCES organizations (org_id),
    policy_version  TEXT NOT NULL,
    state_version   INTEGER NOT NULL,
    state           JSONB NOT NULL,
    feedback_count  BIGINT NOT NULL DEFAULT 0,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, policy_version)
);
