-- gorm-outbox schema for SQLite, default table names.
-- Identical to what outbox.AutoMigrate (or db.AutoMigrate(&outbox.Message{},
-- &outbox.BucketLease{}, &outbox.RelayHeartbeat{})) creates; TestMigrationsMatchAutoMigrate
-- keeps the two in step. For custom names, replace outbox_messages,
-- outbox_leases and outbox_relays (and the index name) consistently.

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
    created_at       datetime NOT NULL,  -- UTC
    parked_at_ms     integer,            -- set by the relay only: parked at (Unix ms, UTC), NULL = pending
    parked_reason    text                -- set by the relay only: why it was parked
);
-- The relay's only read path: the unparked (parked_at_ms IS NULL) rows of
-- one bucket, oldest first.
CREATE INDEX idx_outbox_messages_bucket_parked_id ON outbox_messages (bucket, parked_at_ms, id);

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
    features      integer NOT NULL DEFAULT 0, -- capability bits; 1 = parking
    PRIMARY KEY (relay_id)
);
