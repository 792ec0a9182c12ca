-- gorm-outbox schema version 2: parking (containment), SQLite. Apply before
-- deploying relays that park rows; relays of version 1 keep working on this
-- schema (they never write the new columns). Parking starts once every live
-- relay writes the features bit of its heartbeat.

-- When the row was parked (Unix ms, UTC) and why; NULL = pending.
ALTER TABLE outbox_messages ADD COLUMN parked_at_ms integer;
ALTER TABLE outbox_messages ADD COLUMN parked_reason text;
-- The relay's read path: the unparked rows of one bucket, oldest first.
CREATE INDEX idx_outbox_messages_bucket_parked_id ON outbox_messages (bucket, parked_at_ms, id);
DROP INDEX idx_outbox_messages_bucket_id;
-- Bit set of relay capabilities written with each heartbeat; 1 = parking.
ALTER TABLE outbox_relays ADD COLUMN features integer NOT NULL DEFAULT 0;
