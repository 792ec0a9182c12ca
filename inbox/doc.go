// Package inbox is the consumer side of the outbox: it turns at-least-once
// delivery into effectively-once effects for Go services on GORM that
// consume with kafka-go (this package's Consumer) or franz-go (module
// github.com/gorm-outbox/outbox/inbox/franz, the same loop).
//
// The relay delivers every record at least once, each with a stable
// message-id header (x-outbox-message-id); a retried publish, a lease
// takeover or a consumer restart can deliver one twice. An Inbox records
// each processed id in a table, in the same database transaction as the
// message's effect, so that a second delivery finds the id and is skipped:
//
//	if err := inbox.AutoMigrate(db, inbox.Config{}); err != nil { ... }
//	ib, err := inbox.New(db, inbox.Options{})
//
//	out, err := ib.Handle(ctx, "shipping", msg, func(tx *gorm.DB) error {
//		return tx.Create(&Shipment{OrderID: string(msg.Key)}).Error
//	})
//	// out is inbox.Processed, or inbox.Duplicate (fn not called)
//
// A Consumer runs that loop over a consumer group's kafka.Reader: fetch,
// Handle, and commit the offset only after the transaction committed; a
// failed message is retried with backoff (or sent to a dead-letter topic
// after a number of attempts), never skipped:
//
//	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "shipping", Topic: "orders"})
//	defer r.Close()
//	c, err := inbox.NewConsumer(ib, r, "shipping", func(tx *gorm.DB, m kafka.Message) error {
//		return tx.Create(&Shipment{OrderID: string(m.Key)}).Error
//	}, inbox.ConsumerOptions{})
//	err = c.Run(ctx) // until ctx is done
//
// Processed ids are kept for Options.Retention (7 days by default) and
// deleted by Purge, in bounded batches, or by RunPurge in the background.
// The table is the same on PostgreSQL, MySQL/MariaDB and SQLite; its
// hand-written DDL is in package migrations (migrations.InboxSQL).
package inbox
