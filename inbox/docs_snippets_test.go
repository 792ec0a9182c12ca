package inbox_test

import (
	"context"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
)

// The code blocks of docs/consuming.md, compiled here: each function's body
// is a block of the guide, verbatim (TestDocsGoBlocksAreCompiledCode at the
// repository's root checks it).

func consumingWithKafkaGo(ctx context.Context, db *gorm.DB, brokers []string) error {
	if err := inbox.AutoMigrate(db, inbox.Config{}); err != nil { // or migrations/inbox/<dialect>.sql
		return err
	}
	ib, err := inbox.New(db, inbox.Options{}) // zero Options: every default
	if err != nil {
		return err
	}
	go ib.RunPurge(ctx) // drop ids older than 7 days, hourly

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "shipping", Topic: "orders"})
	defer r.Close()
	c, err := inbox.NewConsumer(ib, r, "shipping", func(tx *gorm.DB, m kafka.Message) error {
		return tx.Create(&Shipment{OrderID: string(m.Key)}).Error // every write of the effect through tx
	}, inbox.ConsumerOptions{})
	if err != nil {
		return err
	}
	return c.Run(ctx) // until ctx is done; nil then
}

func consumingWithHandle(ctx context.Context, ib *inbox.Inbox, m kafka.Message, apply func(*gorm.DB, kafka.Message) error) (inbox.Outcome, error) {
	out, err := ib.Handle(ctx, "shipping", m, func(tx *gorm.DB) error { return apply(tx, m) })
	// out == inbox.Processed: applied and committed; inbox.Duplicate: seen before, fn not called
	return out, err
}

var (
	_ = consumingWithKafkaGo
	_ = consumingWithHandle
)
