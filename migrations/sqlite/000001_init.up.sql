-- gorm-outbox schema version 1 (the initial schema) for SQLite,
-- default table names. Apply 000002_parking.up.sql after it; together they
-- give ../sqlite.sql, what outbox.AutoMigrate creates.

-- Pending records, deleted by the relay after the broker acknowledged them.
-- AUTOINCREMENT: ids are never reused, so submission order is never reset.
CREATE TABLE outbox_messages (
    id               integer  PRIMARY KEY AUTOINCREMENT, -- submission order within a bucket
    message_id       text     NOT NULL,  -- lowercase UUID text, the x-outbox-message-id header
    bucket           integer  NOT NULL,  -- ordering bucket, 0..BucketCount-1
    topic            text     NOT NULL,
    record_key       blob,               -- NULL = keyless record
    record_value     blob,               -- NULL = tombstone
    headers          blob,               -- versioned header encoding, NULL = none
    record_partition integer,            -- explicit partition, NULL = by key
    created_at       datetime NOT NULL   -- UTC
);
-- The relay's only read path: oldest rows of one bucket.
CREATE INDEX idx_outbox_messages_bucket_id ON outbox_messages (bucket, id);

-- One row per bucket: which relay owns it, until when (Unix ms, UTC).
CREATE TABLE outbox_leases (
    bucket        integer,
    owner         text,
    expires_at_ms integer NOT NULL,
    PRIMARY KEY (bucket)
);

-- Relay heartbeats (Unix ms, UTC); stopped relays are stamped, not deleted.
CREATE TABLE outbox_relays (
    relay_id      text,
    last_seen_ms  integer NOT NULL,
    stopped_at_ms integer,
    PRIMARY KEY (relay_id)
);
