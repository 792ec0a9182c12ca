-- gorm-outbox schema version 1 (the initial schema) for PostgreSQL,
-- default table names. Apply 000002_parking.up.sql after it; together they
-- give ../postgres.sql, what outbox.AutoMigrate creates.

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
    PRIMARY KEY (id)
);
-- The relay's only read path: oldest rows of one bucket.
CREATE INDEX idx_outbox_messages_bucket_id ON outbox_messages (bucket, id);

-- One row per bucket: which relay owns it, until when (Unix ms, UTC).
CREATE TABLE outbox_leases (
    bucket        integer      NOT NULL,
    owner         varchar(128),
    expires_at_ms bigint       NOT NULL,
    PRIMARY KEY (bucket)
);

-- Relay heartbeats (Unix ms, UTC); stopped relays are stamped, not deleted.
CREATE TABLE outbox_relays (
    relay_id      varchar(128) NOT NULL,
    last_seen_ms  bigint       NOT NULL,
    stopped_at_ms bigint,
    PRIMARY KEY (relay_id)
);
