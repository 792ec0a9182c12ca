// Command readme is the README's example: the plugin, an order and its
// Kafka record in one transaction, and the relay that publishes the
// record (acks=all) and deletes it once Kafka acknowledged it. It runs
// until interrupted; KAFKA_BROKERS names the brokers (default
// localhost:9092).
package main

import (
	"cmp"
	"context"
	"log"
	"os"
	"os/signal"

	"gorm.io/driver/sqlite" // or gorm.io/driver/postgres, gorm.io/driver/mysql
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

type Order struct {
	ID string `gorm:"primaryKey"`
}

func main() {
	db, err := gorm.Open(sqlite.Open("orders.db"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	cfg := outbox.Config{}          // 8 buckets, tables outbox_messages / _leases / _relays
	notifier := relay.NewNotifier() // wakes the relay right after each commit
	if err := db.Use(outbox.Plugin{Config: cfg, Notifier: notifier}); err != nil {
		log.Fatal(err)
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil { // or apply migrations/<dialect>.sql
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		log.Fatal(err)
	}

	// The business row and its record commit together, or not at all.
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{ID: "o-17"}).Error; err != nil {
			return err
		}
		return outbox.Enqueue(tx, outbox.NewStringMessage("orders", "o-17", `{"id":"o-17"}`))
	})
	if err != nil {
		log.Fatal(err)
	}

	// The relay: any number of them share the buckets through leases.
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		log.Fatal(err)
	}
	brokers := []string{cmp.Or(os.Getenv("KAFKA_BROKERS"), "localhost:9092")}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	r, err := relay.New(store, pub, relay.Options{Notifier: notifier})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := r.Run(ctx); err != nil { // until ctx ends; then it releases its leases
		log.Fatal(err)
	}
}
