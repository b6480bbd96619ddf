-- A model version's lifecycle: `live` versions' candidates are served, `retired` ones' are not
-- (`arc-rec models retire`; `promote` makes one live again). Versions written before this
-- migration are live, as they were served. `status_changed_at` moves on every change, so a
-- serving replica's reload check (`model_candidates_marks`) sees a retire even when the set of
-- candidate rows did not change.
ALTER TABLE model_versions
    ADD COLUMN status TEXT NOT NULL DEFAULT 'live' CHECK (status IN ('live', 'retired')),
    ADD COLUMN status_changed_at TIMESTAMPTZ NOT NULL DEFAULT now();
