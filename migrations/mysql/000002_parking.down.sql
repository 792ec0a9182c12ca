-- Reverts 000002_parking (MySQL, MariaDB). Requeue or delete every parked
-- row first (a version 1 relay would publish them in any order), and stop
-- the relays of version 2 first.
ALTER TABLE outbox_messages
    ADD INDEX idx_outbox_messages_bucket_id (bucket, id),
    DROP INDEX idx_outbox_messages_bucket_parked_id,
    DROP COLUMN parked_reason,
    DROP COLUMN parked_at_ms;
ALTER TABLE outbox_relays DROP COLUMN features;
