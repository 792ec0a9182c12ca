// Package inbox is the consumer side of the outbox: it turns at-least-once
// delivery into effectively-once effects for Go services on GORM.
//
// An Inbox records each processed message id (x-outbox-message-id) in the
// same database transaction as the message's effect, so that a second
// delivery finds the id and is skipped (Handle). A Consumer runs that loop
// over a consumer group's kafka.Reader, committing each offset only after
// its transaction committed; module github.com/gorm-outbox/outbox/inbox/franz
// runs it on franz-go. Purge and RunPurge drop ids older than
// Options.Retention. See docs/consuming.md.
package inbox
