-- Reverts 000002_parking (PostgreSQL). Requeue or delete every parked row
-- first (a version 1 relay would publish them in any order): this file
-- refuses to run while a row is parked. Stop the relays of version 2 first.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_messages WHERE parked_at_ms IS NOT NULL) THEN
        RAISE EXCEPTION 'outbox_messages holds parked rows: requeue or delete them before the downgrade';
    END IF;
END
$$;
CREATE INDEX IF NOT EXISTS idx_outbox_messages_bucket_id ON outbox_messages (bucket, id);
DROP INDEX IF EXISTS idx_outbox_messages_bucket_parked_id;
ALTER TABLE outbox_messages DROP COLUMN parked_reason;
ALTER TABLE outbox_messages DROP COLUMN parked_at_ms;
ALTER TABLE outbox_relays DROP COLUMN features;
