// Command readme is the README's example: the plugin, an order and its
// Kafka record in one transaction, and the relay that publishes the
// record (acks=all) and deletes it once Kafka acknowledged it. It prints
// one line when that happened and exits; each run places a new order in
// orders.db. KAFKA_BROKERS names the brokers (default localhost:9092).
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
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
	brokers := strings.Split(cmp.Or(os.Getenv("KAFKA_BROKERS"), "localhost:9092"), ",")
	if err := createTopic(brokers, "orders"); err != nil {
		log.Fatal(err)
	}

	// The relay: any number of them share the buckets through leases.
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		log.Fatal(err)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	r, err := relay.New(store, pub, relay.Options{Notifier: notifier, SingleWriter: true})
	if err != nil {
		log.Fatal(err)
	}

	// The business row and its record commit together, or not at all.
	order := Order{ID: "o-" + outbox.NewUUID().String()[:8]}
	msg := outbox.NewStringMessage("orders", order.ID, `{"id":"`+order.ID+`"}`)
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		return outbox.Enqueue(tx, msg)
	})
	if err != nil {
		log.Fatal(err)
	}

	// The relay publishes the record; this example stops it once Kafka has it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() {
		if deleted(ctx, db, msg.ID) { // the relay deletes a row once Kafka acknowledged it
			fmt.Printf("order %s: Kafka acknowledged its record on topic orders\n", order.ID)
			stop() // a service's relay runs until shutdown
		}
	}()
	if err := r.Run(ctx); err != nil { // until ctx ends; then it releases its leases
		log.Fatal(err)
	}
}

// createTopic creates topic unless it exists: the relay creates no topics.
// In production, create them beforehand (partitions, replication).
func createTopic(brokers []string, topic string) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	res, err := client.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s at KAFKA_BROKERS %s: %w", topic, strings.Join(brokers, ","), err)
	}
	return nil
}

// deleted waits until outbox row id is gone, or ctx ends.
func deleted(ctx context.Context, db *gorm.DB, id int64) bool {
	for ctx.Err() == nil {
		var n int64
		if err := db.Model(&outbox.Message{}).Where("id = ?", id).Count(&n).Error; err == nil && n == 0 {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}
