-- One learning round of an organization (`arc-rec round`): export → train → gate → candidates.
-- A round is `running` until it ends `served` (its model version's ideas went into serving) or
-- `refused` (RL did not beat its warm-up; nothing was written). At most one round per
-- organization is open at a time; an interrupted one is resumed by the next `arc-rec round`.
CREATE TABLE rounds (
    org_id           TEXT NOT NULL REFERENCES organizations (org_id),
    round_no         INTEGER NOT NULL CHECK (round_no >= 1),
    status           TEXT NOT NULL CHECK (status IN ('running', 'served', 'refused')),
    -- The data window: answers to served recommendations received in [window_since,
    -- window_until) are the round's new evidence (window_since NULL: from the beginning); the
    -- export holds every decision before window_until.
    window_since     TIMESTAMPTZ,
    window_until     TIMESTAMPTZ NOT NULL,
    new_answers      BIGINT NOT NULL,
    dir              TEXT NOT NULL,
    model_version_id TEXT,
    -- What the round measured: export counts, the learned grader's held-out calibration, the
    -- checkpoint selection's verdict, candidates written.
    figures          JSONB NOT NULL DEFAULT '{}'::jsonb,
    started_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ,
    PRIMARY KEY (org_id, round_no),
    CHECK ((status = 'running') = (finished_at IS NULL))
);
CREATE UNIQUE INDEX rounds_one_open_per_org ON rounds (org_id) WHERE status = 'running';
