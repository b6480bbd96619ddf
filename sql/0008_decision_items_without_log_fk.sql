-- decision_items rows are written only together with their decision_log row, in one statement
-- (storage::decisions::insert_decisions), so the foreign key between them guarded nothing that
-- code could get wrong, and it cost a lookup per shown item. Worse, on a fresh database the
-- check's cached plan was made while decision_log was empty (a sequential scan), and every
-- later insert scanned the whole log until autovacuum's next ANALYZE replanned it: `arc-rec
-- bench serve` on a fresh cluster fell to about 550 requests/s with 1-second latencies.
ALTER TABLE decision_items DROP CONSTRAINT decision_items_org_id_event_id_fkey;
