-- Each decision logs every candidate it ranked. As JSONB that was about 7 kB of text per
-- decision for Postgres to parse and compress and 2.1 kB out of line on disk; the binary layout
-- of recommend::candidate_log takes 18 bytes a candidate. Fewer bytes per decision mean less
-- WAL for each commit to flush and fewer dirty pages for the kernel to write back in bursts,
-- which stall the next commits (the tail of `arc-rec bench serve`).
-- Decisions logged before this keep their JSONB set; new ones fill only candidate_set.
ALTER TABLE decision_log ADD COLUMN candidate_set bytea;
ALTER TABLE decision_log ALTER COLUMN candidates DROP NOT NULL;
ALTER TABLE decision_log ADD CONSTRAINT decision_log_candidates_logged
    CHECK (candidate_set IS NOT NULL OR candidates IS NOT NULL);
