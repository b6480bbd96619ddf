-- The model versions a decision left out under the exposure cap on new model versions
-- (`arc-rec serve --new-version-share`); NULL when none was.
ALTER TABLE decision_log ADD COLUMN capped_versions TEXT[];
