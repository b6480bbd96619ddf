-- The request's failure-cluster embedding, logged as real[] instead of inside the context JSON:
-- as JSON text a 64-value embedding is ~0.8 kB per decision (15 kB at 1,536 values) for
-- Postgres to parse into numerics and write, as real[] 4 bytes a value. Decisions logged
-- before this keep the embedding inside `context`.
ALTER TABLE decision_log ADD COLUMN context_embedding real[];
