-- The exploration floor (`arc-rec serve --explore-share`): the model version whose unanswered
-- ideas the floor could put first in a decision, and whether it did. NULL/NULL: the floor did not
-- apply. Decisions with a floor_version and floor_pick false are the policy's own choices in the
-- same contexts, which is what `arc-rec models list` measures the floor's price against.
ALTER TABLE decision_log
    ADD COLUMN floor_version TEXT,
    ADD COLUMN floor_pick BOOLEAN,
    ADD CONSTRAINT decision_log_floor_pick_with_version
        CHECK ((floor_version IS NULL) = (floor_pick IS NULL));
-- `models list` reads a version's floor decisions.
CREATE INDEX decision_log_floor_version ON decision_log (org_id, floor_version)
    WHERE floor_version IS NOT NULL;
