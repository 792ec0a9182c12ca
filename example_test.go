package outbox_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// printBuckets is a Notifier that prints the buckets of each commit, as the
// relay's notifier (relay.NewNotifier) would receive them.
type printBuckets struct{}

func (printBuckets) NotifyCommitted()       { fmt.Println("committed: unknown buckets") }
func (printBuckets) NotifyBucket(b int)     { fmt.Println("committed: bucket", b) }
func (printBuckets) NotifyBuckets(bs []int) { fmt.Println("committed: buckets", bs) }
func (printBuckets) NonBlockingNotifier()   {}

// Order is the business row of the examples.
type Order struct {
	ID string `gorm:"primaryKey"`
}

func openExampleDB() (*gorm.DB, func()) {
	dir, err := os.MkdirTemp("", "outbox-example")
	if err != nil {
		panic(err)
	}
	db, err := gorm.Open(sqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	return db, func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
		_ = os.RemoveAll(dir)
	}
}

// The setup of the package documentation and the README: the plugin,
// registered right after gorm.Open with the relay's notifier, and the
// tables.
func Example_setup() {
	db, done := openExampleDB()
	defer done()

	setup := func(db *gorm.DB) error {
		cfg := outbox.Config{}          // 8 buckets, tables outbox_messages / outbox_leases / outbox_relays
		notifier := relay.NewNotifier() // wakes the relay after each commit; it can exist before the relay
		if err := db.Use(outbox.Plugin{Config: cfg, Notifier: notifier}); err != nil {
			return err
		}
		if err := outbox.AutoMigrate(db, cfg); err != nil { // or apply migrations/<dialect>.sql
			return err
		}
		// later, the relay: relay.New(store, pub, relay.Options{Notifier: notifier})
		return nil
	}
	fmt.Println("setup:", setup(db))
	fmt.Println("tables:", db.Migrator().HasTable(outbox.DefaultMessagesTable), db.Migrator().HasTable(outbox.DefaultLeasesTable), db.Migrator().HasTable(outbox.DefaultRelaysTable))
	// Output:
	// setup: <nil>
	// tables: true true true
}

// The plugin makes a plain Create of an outbox.Message part of the caller's
// transaction: the order and its record commit together or not at all, and
// after a successful commit the notifier (the relay's, in a service) learns
// which bucket to look at. A rolled-back transaction leaves nothing and
// notifies nobody.
func ExamplePlugin() {
	db, done := openExampleDB()
	defer done()

	cfg := outbox.Config{BucketCount: 4}
	if err := db.Use(outbox.Plugin{Config: cfg, Notifier: printBuckets{}}); err != nil {
		panic(err)
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		panic(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		panic(err)
	}

	place := func(id string, fail bool) error {
		return db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&Order{ID: id}).Error; err != nil {
				return err
			}
			if err := tx.Create(outbox.NewStringMessage("orders", id, "placed")).Error; err != nil {
				return err
			}
			if fail {
				return errors.New("payment declined")
			}
			return nil
		})
	}
	fmt.Println("order-1:", place("order-1", false))
	fmt.Println("order-2:", place("order-2", true))
	var orders, rows int64
	db.Model(&Order{}).Count(&orders)
	db.Table(cfg.MessagesTableName()).Count(&rows)
	fmt.Println("orders:", orders, "outbox rows:", rows)
	// Output:
	// committed: bucket 2
	// order-1: <nil>
	// order-2: payment declined
	// orders: 1 outbox rows: 1
}

// Create fills a message's id, bucket and creation time; the bucket follows
// the key, exactly as Kafka's default partitioner would place it, so rows of
// one key stay in order. Invalid messages are rejected before anything is
// written.
func ExampleMessage() {
	db, done := openExampleDB()
	defer done()
	if err := db.Use(outbox.Plugin{}); err != nil { // 8 buckets, default tables
		panic(err)
	}
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		panic(err)
	}

	msgs := []*outbox.Message{
		outbox.NewStringMessage("orders", "order-42", "created"),
		outbox.NewStringMessage("orders", "order-42", "paid", outbox.Header{Key: "trace-id", Value: []byte("abc")}),
	}
	if err := outbox.Enqueue(db, msgs...); err != nil {
		panic(err)
	}
	for _, m := range msgs {
		fmt.Printf("id %d, bucket %d, key %s, value %s, headers %d, message id set: %v\n",
			m.ID, m.Bucket, m.Key, m.Value, len(m.Headers), !m.MessageID.IsZero())
	}

	var stored outbox.Message
	if err := db.Last(&stored).Error; err != nil {
		panic(err)
	}
	fmt.Printf("stored: %s %s=%s, header %s=%s\n", stored.Topic, stored.Key, stored.Value, stored.Headers[0].Key, stored.Headers[0].Value)

	err := db.Create(&outbox.Message{Topic: ""}).Error
	fmt.Println("empty topic rejected:", err != nil)
	// Output:
	// id 1, bucket 0, key order-42, value created, headers 0, message id set: true
	// id 2, bucket 0, key order-42, value paid, headers 1, message id set: true
	// stored: orders order-42=paid, header trace-id=abc
	// empty topic rejected: true
}
