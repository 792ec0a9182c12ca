-- gorm-outbox schema version 1 (the initial schema) for MySQL 8 and MariaDB 10.6+,
-- default table names. Apply 000002_parking.up.sql after it; together they
-- give ../mysql.sql, what outbox.AutoMigrate creates.
-- Connect with parseTime=true; created_at holds UTC.

-- Pending records, deleted by the relay after the broker acknowledged them.
CREATE TABLE outbox_messages (
    id               bigint       NOT NULL AUTO_INCREMENT, -- submission order within a bucket
    message_id       char(36)     NOT NULL,  -- lowercase UUID text, the x-outbox-message-id header
    bucket           int          NOT NULL,  -- ordering bucket, 0..BucketCount-1
    topic            varchar(249) NOT NULL,
    record_key       longblob,               -- NULL = keyless record
    record_value     longblob,               -- NULL = tombstone
    headers          longblob,               -- versioned header encoding, NULL = none
    record_partition int,                    -- explicit partition, NULL = by key
    created_at       datetime(3)  NOT NULL,  -- UTC
    PRIMARY KEY (id),
    INDEX idx_outbox_messages_bucket_id (bucket, id) -- the relay's only read path
);

-- One row per bucket: which relay owns it, until when (Unix ms, UTC).
CREATE TABLE outbox_leases (
    bucket        int          NOT NULL,
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
