// Command dedup shows consumer-side deduplication with kafka-go's Reader.
// The outbox delivers at least once: a retried batch whose first attempt
// was appended, or a lease takeover, can put a record on the topic twice,
// always with the same x-outbox-message-id header. The consumer records each
// message id in a processed_messages table in the same transaction as its
// side effect, so a redelivered record changes nothing, and commits the
// Kafka offset only after that transaction.
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
	"os"
	"path/filepath"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// ProcessedMessage remembers a handled message id: the deduplication key.
type ProcessedMessage struct {
	MessageID   string `gorm:"primaryKey;size:36"`
	ProcessedAt time.Time
}

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
	pub, err := relay.NewKafkaPublisher(relay.KafkaConfig{Brokers: brokers})
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
		if res := pub.Publish(ctx, batch); res.Err != nil {
			return res.Err
		}
	}

	// The consumer side: its own database with the dedup table.
	dir, err := os.MkdirTemp("", "dedup-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "consumer.db")+"?_busy_timeout=10000&_journal_mode=WAL"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	if err := db.AutoMigrate(&ProcessedMessage{}, &Shipment{}); err != nil {
		return err
	}

	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: brokers, Topic: "orders", Partition: 0, // a consumer group (GroupID) works the same way
		MaxWait: 50 * time.Millisecond,
	})
	defer r.Close()
	for range 2 * len(batch) {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		id := header(m, relay.DefaultMessageIDHeader)
		if id == "" {
			return errors.New("record without a message id")
		}
		var duplicate bool
		err = db.Transaction(func(tx *gorm.DB) error {
			res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&ProcessedMessage{MessageID: id, ProcessedAt: time.Now()})
			if res.Error != nil {
				return res.Error
			}
			if duplicate = res.RowsAffected == 0; duplicate {
				return nil // seen before: skip the side effect
			}
			return tx.Create(&Shipment{OrderID: string(m.Key), Event: string(m.Value)}).Error
		})
		if err != nil {
			return err
		}
		verdict := "processed"
		if duplicate {
			verdict = "duplicate, skipped"
		}
		fmt.Printf("offset %d  %s %-8s %s\n", m.Offset, m.Key, m.Value, verdict)
		// With a GroupID, commit after the transaction: r.CommitMessages(ctx, m).
	}
	var n int64
	if err := db.Model(&Shipment{}).Count(&n).Error; err != nil {
		return err
	}
	fmt.Printf("%d records consumed, %d side effects\n", 2*len(batch), n)
	if n != int64(len(batch)) {
		return fmt.Errorf("%d side effects; want %d", n, len(batch))
	}
	return nil
}

// header returns the value of the record header key, or "".
func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
