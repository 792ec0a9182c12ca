package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// Shipment is the side effect of the examples' consumer.
type Shipment struct {
	ID      uint `gorm:"primaryKey"`
	OrderID string
	Event   string
}

func openExampleDB() (*gorm.DB, func()) {
	dir, err := os.MkdirTemp("", "inbox-example")
	if err != nil {
		panic(err)
	}
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "consumer.db")+"?_busy_timeout=10000&_journal_mode=WAL"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	if err := inbox.AutoMigrate(db, inbox.Config{}); err != nil {
		panic(err)
	}
	if err := db.AutoMigrate(&Shipment{}); err != nil {
		panic(err)
	}
	return db, func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
		_ = os.RemoveAll(dir)
	}
}

// The same record delivered three times (a publish retried after a lost
// acknowledgement, a consumer restarted before its offset commit) has one
// effect: Handle records the message id in the effect's transaction and
// skips the ids it has recorded.
func ExampleInbox_Handle() {
	db, done := openExampleDB()
	defer done()
	ib, err := inbox.New(db, inbox.Options{})
	if err != nil {
		panic(err)
	}
	msg := kafka.Message{
		Topic: "orders", Key: []byte("order-7"), Value: []byte("paid"),
		Headers: []kafka.Header{{Key: kafkapub.DefaultMessageIDHeader, Value: []byte("0b6f2f1e-9b8f-4c1e-8d1a-2f4e5b6c7d01")}},
	}
	for range 3 {
		out, err := ib.Handle(context.Background(), "shipping", msg, func(tx *gorm.DB) error {
			return tx.Create(&Shipment{OrderID: string(msg.Key), Event: string(msg.Value)}).Error
		})
		fmt.Println(out, err)
	}
	var n int64
	db.Model(&Shipment{}).Count(&n)
	fmt.Println("shipments:", n)
	// Output:
	// processed <nil>
	// duplicate <nil>
	// duplicate <nil>
	// shipments: 1
}

// replayReader is an inbox.Reader that hands out its records once, then
// blocks until ctx is done; it stands in for a *kafka.Reader in
// ExampleConsumer so that the example needs no broker.
type replayReader struct{ records []kafka.Message }

func (r *replayReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	if len(r.records) == 0 {
		<-ctx.Done()
		return kafka.Message{}, ctx.Err()
	}
	m := r.records[0]
	r.records = r.records[1:]
	return m, nil
}

func (r *replayReader) CommitMessages(context.Context, ...kafka.Message) error { return nil }

// A Consumer reads a consumer group, handles each record through the inbox
// and commits its offset after the transaction: the record delivered twice
// is applied once. In a service the Reader is a *kafka.Reader:
//
//	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "shipping", Topic: "orders"})
//	defer r.Close()
//
// here a replay of four records stands in for it (no Kafka needed).
func ExampleConsumer() {
	db, done := openExampleDB()
	defer done()
	id := func(s string) []kafka.Header {
		return []kafka.Header{{Key: kafkapub.DefaultMessageIDHeader, Value: []byte(s)}}
	}
	r := &replayReader{records: []kafka.Message{
		{Topic: "orders", Key: []byte("order-7"), Value: []byte("created"), Headers: id("6c1e0d8a-0001-4000-8000-000000000001")},
		{Topic: "orders", Key: []byte("order-7"), Value: []byte("paid"), Headers: id("6c1e0d8a-0001-4000-8000-000000000002")},
		{Topic: "orders", Key: []byte("order-7"), Value: []byte("paid"), Headers: id("6c1e0d8a-0001-4000-8000-000000000002")}, // a duplicate
		{Topic: "orders", Key: []byte("order-7"), Value: []byte("shipped"), Headers: id("6c1e0d8a-0001-4000-8000-000000000003")},
	}}

	ib, err := inbox.New(db, inbox.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := inbox.NewConsumer(ib, r, "shipping", func(tx *gorm.DB, m kafka.Message) error {
		return tx.Create(&Shipment{OrderID: string(m.Key), Event: string(m.Value)}).Error
	}, inbox.ConsumerOptions{})
	if err != nil {
		panic(err)
	}
	go func() { // stop once the three shipments are in
		for n := int64(0); n < 3 && ctx.Err() == nil; db.Model(&Shipment{}).Count(&n) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	if err := c.Run(ctx); err != nil { // nil after the stop
		panic(err)
	}
	var shipments []Shipment
	db.Order("id").Find(&shipments)
	for _, s := range shipments {
		fmt.Println(s.OrderID, s.Event)
	}
	// Output:
	// order-7 created
	// order-7 paid
	// order-7 shipped
}
