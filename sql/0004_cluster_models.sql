-- Failure clustering: the per-organization model that places a new failure at request time
-- (text featurizer, PCA projections, spreads), and what failure_clusters needs beyond 0002.
-- One row per organization, replaced (version + 1) by every `arc-rec cluster` run.

CREATE TABLE cluster_models (
    org_id                TEXT PRIMARY KEY REFERENCES organizations (org_id),
    version               INTEGER NOT NULL CHECK (version >= 1),
    featurizer            TEXT NOT NULL CHECK (featurizer IN ('hashed_tfidf', 'client_embedding')),
    -- Input dimension of the primary view (hash buckets, or the client embedding dimension).
    input_dim             INTEGER NOT NULL CHECK (input_dim >= 1),
    -- Reduced dimension: the bandit's cluster-context size.
    dims                  INTEGER NOT NULL CHECK (dims BETWEEN 1 AND 64),
    method                TEXT NOT NULL,
    -- Hashed TF-IDF: buckets, IDF per bucket, tool/provider names, block weights.
    text_featurizer       JSONB NOT NULL CHECK (jsonb_typeof(text_featurizer) = 'object'),
    -- PCA of the text view: mean (input_dim) and components (dims x input_dim, row-major).
    text_mean             REAL[] NOT NULL,
    text_components       REAL[] NOT NULL,
    text_explained        REAL[] NOT NULL,
    -- PCA of client embeddings, for organizations clustered on them.
    embedding_mean        REAL[],
    embedding_components  REAL[],
    embedding_explained   REAL[],
    -- Per-dimension variance of members around their centroid (confidence scale).
    sigma2                DOUBLE PRECISION NOT NULL CHECK (sigma2 >= 0),
    text_sigma2           DOUBLE PRECISION NOT NULL CHECK (text_sigma2 >= 0),
    patterns              INTEGER NOT NULL CHECK (patterns >= 0),
    quality               JSONB NOT NULL DEFAULT '{}'::jsonb,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((featurizer = 'client_embedding')
           = (embedding_mean IS NOT NULL AND embedding_components IS NOT NULL))
);

-- Clusters that vanish on re-clustering stay (inactive, size 0) so references to their ids hold
-- and ids are never reused.
ALTER TABLE failure_clusters
    ADD COLUMN active         BOOLEAN NOT NULL DEFAULT true,
    ADD COLUMN model_version  INTEGER,
    ADD COLUMN text_centroid  REAL[],
    ADD COLUMN radius         DOUBLE PRECISION,
    ADD COLUMN text_radius    DOUBLE PRECISION;

CREATE UNIQUE INDEX failure_clusters_active_label_idx
    ON failure_clusters (org_id, label) WHERE active;
