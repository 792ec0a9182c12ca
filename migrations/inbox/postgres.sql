-- gorm-outbox inbox schema for PostgreSQL, default table name.
-- Identical to what inbox.AutoMigrate (or
-- db.AutoMigrate(&inbox.ProcessedMessage{})) creates;
-- TestInboxMigrationsMatchAutoMigrate keeps the two in step. For a custom
-- name, replace inbox_processed_messages (and the index name) consistently.

-- One row per message a handler committed the effect of; purged after the
-- retention window (inbox.Options.Retention).
CREATE TABLE inbox_processed_messages (
    handler_name    varchar(128) NOT NULL,  -- the consumer or handler
    message_id      varchar(300) NOT NULL,  -- the x-outbox-message-id header, or topic/partition/offset
    processed_at_ms bigint       NOT NULL,  -- Unix ms (UTC), the consumer host's clock
    PRIMARY KEY (handler_name, message_id)
);
-- Purge's read path: the oldest rows, in bounded batches.
CREATE INDEX idx_inbox_processed_messages_processed_at_ms ON inbox_processed_messages (processed_at_ms);
