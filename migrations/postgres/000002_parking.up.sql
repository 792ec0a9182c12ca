-- gorm-outbox schema version 2: parking (containment), PostgreSQL.
-- Apply before deploying relays that park rows; relays of version 1 keep
-- working on this schema (they never write the new columns). Parking starts
-- once every live relay writes the features bit of its heartbeat.
--
-- The new columns are nullable without a default: adding them rewrites
-- nothing. On a busy table build the index without blocking writers instead:
-- run CREATE INDEX CONCURRENTLY ... (outside a transaction) first, then this
-- file (its CREATE INDEX IF NOT EXISTS then does nothing).

-- When the row was parked (Unix ms, UTC) and why; NULL = pending.
ALTER TABLE outbox_messages ADD COLUMN parked_at_ms bigint;
ALTER TABLE outbox_messages ADD COLUMN parked_reason varchar(1000);
-- The relay's read path: the unparked rows of one bucket, oldest first.
CREATE INDEX IF NOT EXISTS idx_outbox_messages_bucket_parked_id ON outbox_messages (bucket, parked_at_ms, id);
DROP INDEX IF EXISTS idx_outbox_messages_bucket_id;
-- Bit set of relay capabilities written with each heartbeat; 1 = parking.
ALTER TABLE outbox_relays ADD COLUMN features bigint NOT NULL DEFAULT 0;
