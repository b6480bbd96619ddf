-- Replicas learn from each other's feedback by polling this table; `seq` gives a cheap cursor and
-- `received_at` a window to re-read (sequence order is not commit order, so pollers re-read a
-- recent window and skip what they already applied).
ALTER TABLE feedback ADD COLUMN seq BIGSERIAL;
CREATE INDEX feedback_received_idx ON feedback (org_id, received_at);
-- The feature vectors the bandit learned from live with the decision: the context block once per
-- request, the candidate block per candidate (so the model's input is recomputable for replay and
-- for off-policy evaluation of other policies).
ALTER TABLE decision_log ADD COLUMN context_features REAL[];
ALTER TABLE decision_items ADD COLUMN candidate_features REAL[];
