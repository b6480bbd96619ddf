-- Every server polls `feedback` each second for rows received in the last 30 s, across
-- organizations (replicas learn each other's answers): without an index led by `received_at`
-- (0006's leads with `org_id`) that poll read the whole table, a cost growing with the log.
CREATE INDEX feedback_received_at_idx ON feedback (received_at);
