-- What the shared model and its prior predicted of a priced model candidate when it was shown
-- (its mean score less its own correction). Serving's per-candidate evidence is the answers'
-- surprise against it (`recommend::engine::prior_offset`); logged so that a restart and every
-- replica replay the same evidence. NULL for heuristic candidates and earlier rows.
ALTER TABLE decision_items ADD COLUMN predicted DOUBLE PRECISION;
