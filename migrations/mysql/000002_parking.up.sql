-- gorm-outbox schema version 2: parking (containment), MySQL 8 and MariaDB
-- 10.6+. Apply before deploying relays that park rows; relays of version 1
-- keep working on this schema (they never write the new columns). Parking
-- starts once every live relay writes the features bit of its heartbeat.
-- golang-migrate needs multiStatements=true in the DSN for this file.

-- When the row was parked (Unix ms, UTC) and why; NULL = pending.
ALTER TABLE outbox_messages
    ADD COLUMN parked_at_ms bigint,
    ADD COLUMN parked_reason varchar(1000),
    -- The relay's read path: the unparked rows of one bucket, oldest first.
    ADD INDEX idx_outbox_messages_bucket_parked_id (bucket, parked_at_ms, id),
    DROP INDEX idx_outbox_messages_bucket_id;
-- Bit set of relay capabilities written with each heartbeat; 1 = parking.
ALTER TABLE outbox_relays ADD COLUMN features bigint NOT NULL DEFAULT 0;
