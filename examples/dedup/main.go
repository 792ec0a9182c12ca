// Command dedup shows the consumer side of the outbox: package inbox with
// kafka-go's consumer-group Reader. The outbox delivers at least once: a
// retried batch whose first attempt was appended, or a lease takeover, can
// put a record on the topic twice, always with the same
// x-outbox-message-id header. The inbox records each message id in the
// same database transaction as the record's side effect and skips the ids
// it has recorded; its Consumer commits the Kafka offset only after that
// transaction, so a crash in between redelivers a record that is then
// skipped as a duplicate.
//
// It needs nothing but Go: an in-process Kafka broker (kfake) on loopback
// and a SQLite file in a temporary directory.
//
//	go run ./examples/dedup
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/examples/internal/infra"
	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// Shipment is the consumer's side effect.
type Shipment struct {
	ID      uint `gorm:"primaryKey"`
	OrderID string
	Event   string
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dedup:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		return err
	}
	defer broker.Close()
	brokers := broker.ListenAddrs()

	// The producer side: three outbox rows published twice, as a retry
	// after a lost acknowledgement would (the relay does this through
	// relay.New; the publisher is called directly here to force it).
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		return err
	}
	defer pub.Close()
	batch := []*outbox.Message{
		{MessageID: outbox.NewUUID(), Topic: "orders", Key: []byte("order-7"), Value: []byte("created")},
		{MessageID: outbox.NewUUID(), Topic: "orders", Key: []byte("order-7"), Value: []byte("paid")},
		{MessageID: outbox.NewUUID(), Topic: "orders", Key: []byte("order-7"), Value: []byte("shipped")},
	}
	for range 2 {
		if res := pub.Publish(ctx, [][]*outbox.Message{batch})[0]; res.Err != nil {
			return res.Err
		}
	}
	records := 2 * len(batch)

	// The consumer side: its own database, with the inbox's table
	// (inbox.AutoMigrate, or migrations/inbox/<dialect>.sql) next to the
	// side effect's.
	db, _, closeDB, err := infra.SQLite("consumer.db")
	if err != nil {
		return err
	}
	defer closeDB()
	if err := inbox.AutoMigrate(db, inbox.Config{}); err != nil {
		return err
	}
	if err := db.AutoMigrate(&Shipment{}); err != nil {
		return err
	}
	ib, err := inbox.New(db, inbox.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	// Processed ids are kept 7 days (inbox.Options.Retention) and purged
	// hourly in bounded batches.
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); _ = ib.RunPurge(ctx) }()

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "shipping", Topic: "orders", MaxWait: 50 * time.Millisecond})
	defer r.Close()
	consumeCtx, stop := context.WithCancel(ctx)
	defer stop()
	applied := map[int64]bool{} // offsets whose side effect ran; the consumer handles one record at a time
	shown := &showCommits{Reader: r, applied: applied, last: int64(records - 1), stop: stop}
	c, err := inbox.NewConsumer(ib, shown, "shipping", func(tx *gorm.DB, m kafka.Message) error {
		// The side effect, in the transaction that records the message id.
		applied[m.Offset] = true
		return tx.Create(&Shipment{OrderID: string(m.Key), Event: string(m.Value)}).Error
	}, inbox.ConsumerOptions{})
	if err != nil {
		return err
	}
	if err := c.Run(consumeCtx); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return errors.New("timed out before every record was consumed")
	}
	var n int64
	if err := db.Model(&Shipment{}).Count(&n).Error; err != nil {
		return err
	}
	fmt.Printf("%d records consumed, %d side effects\n", records, n)
	if n != int64(len(batch)) {
		return fmt.Errorf("%d side effects; want %d", n, len(batch))
	}
	return nil
}

// showCommits is the consumer's Reader: a *kafka.Reader that prints each
// record as its offset is committed (after the record's transaction) and
// stops the consumer after the last one.
type showCommits struct {
	*kafka.Reader
	applied map[int64]bool
	last    int64
	stop    context.CancelFunc
}

func (s *showCommits) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	if err := s.Reader.CommitMessages(ctx, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		verdict := "processed"
		if !s.applied[m.Offset] {
			verdict = "duplicate, skipped"
		}
		fmt.Printf("offset %d  %s %-8s %s\n", m.Offset, m.Key, m.Value, verdict)
		if m.Offset == s.last {
			s.stop()
		}
	}
	return nil
}
