-- gorm-outbox schema for PostgreSQL, default table names.
-- Identical to what outbox.AutoMigrate creates (db.AutoMigrate(&outbox.Message{},
-- &outbox.BucketLease{}, &outbox.RelayHeartbeat{}) creates the same tables
-- without the leases table's fillfactor); TestMigrationsMatchAutoMigrate
-- keeps the two in step. For custom names, replace outbox_messages,
-- outbox_leases and outbox_relays (and the index name) consistently.

-- Pending records, deleted by the relay after the broker acknowledged them.
CREATE TABLE outbox_messages (
    id               bigserial    NOT NULL,  -- submission order within a bucket
    message_id       uuid         NOT NULL,  -- stamped as the x-outbox-message-id header
    bucket           integer      NOT NULL,  -- ordering bucket, 0..BucketCount-1
    topic            varchar(249) NOT NULL,
    record_key       bytea,                  -- NULL = keyless record
    record_value     bytea,                  -- NULL = tombstone
    headers          bytea,                  -- versioned header encoding, NULL = none
    record_partition integer,                -- explicit partition, NULL = by key
    created_at       timestamptz  NOT NULL,
    parked_at_ms     bigint,                 -- set by the relay only: parked at (Unix ms, UTC), NULL = pending
    parked_reason    varchar(1000),          -- set by the relay only: why it was parked
    PRIMARY KEY (id)
);
-- The relay's only read path: the unparked (parked_at_ms IS NULL) rows of
-- one bucket, oldest first.
CREATE INDEX idx_outbox_messages_bucket_parked_id ON outbox_messages (bucket, parked_at_ms, id);

-- One row per bucket: which relay owns it, until when (Unix ms, UTC).
CREATE TABLE outbox_leases (
    bucket        integer      NOT NULL,
    owner         varchar(128),
    expires_at_ms bigint       NOT NULL,
    PRIMARY KEY (bucket)
) WITH (fillfactor = 40); -- room on each page: a renewal updates every owned lease in place (see 000003)

-- Relay heartbeats (Unix ms, UTC); stopped relays are stamped, not deleted.
CREATE TABLE outbox_relays (
    relay_id      varchar(128) NOT NULL,
    last_seen_ms  bigint       NOT NULL,
    stopped_at_ms bigint,
    features      bigint       NOT NULL DEFAULT 0, -- capability bits; 1 = parking
    PRIMARY KEY (relay_id)
);
