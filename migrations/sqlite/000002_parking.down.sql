-- Reverts 000002_parking (SQLite 3.35+). Requeue or delete every parked row
-- first (a version 1 relay would publish them in any order), and stop the
-- relays of version 2 first.
CREATE INDEX idx_outbox_messages_bucket_id ON outbox_messages (bucket, id);
DROP INDEX idx_outbox_messages_bucket_parked_id;
ALTER TABLE outbox_messages DROP COLUMN parked_reason;
ALTER TABLE outbox_messages DROP COLUMN parked_at_ms;
ALTER TABLE outbox_relays DROP COLUMN features;
