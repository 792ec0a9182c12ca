package franz_test

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/inbox/franz"
)

// The franz-go block of docs/consuming.md, compiled here: the function's
// body is the block, verbatim (TestDocsGoBlocksAreCompiledCode at the
// repository's root checks it).

// Shipment is the guide's side effect.
type Shipment struct {
	ID      uint `gorm:"primaryKey"`
	OrderID string
}

func consumingWithFranz(ctx context.Context, ib *inbox.Inbox, brokers []string) error {
	c, err := franz.NewConsumer(ib, "shipping", func(tx *gorm.DB, r *kgo.Record) error {
		return tx.Create(&Shipment{OrderID: string(r.Key)}).Error
	}, inbox.ConsumerOptions{DeadLetterTopic: "orders.dlq"}, // dead letters produced by its client
		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("shipping"), kgo.ConsumeTopics("orders"))
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Run(ctx)
}

var _ = consumingWithFranz
