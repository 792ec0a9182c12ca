// Command twooutboxes shows two logical outboxes in one database: the orders
// outbox in the default tables (outbox_messages, …, 8 buckets) and a billing
// outbox in tables of its own (billing_messages, …, 4 buckets), each drained
// by its own relay. One transaction writes an order event to the first and
// an invoice event to the second: outbox.WithOutbox routes a Create to the
// second outbox and, after the commit, wakes the billing relay with the
// exact bucket (the Plugin's notifier wakes the orders relay).
//
// It needs nothing but Go: a SQLite file in a temporary directory and an
// in-process Kafka broker (kfake) on loopback.
//
//	go run ./examples/twooutboxes
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/examples/internal/infra"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "twooutboxes:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, _, closeDB, err := infra.SQLite("app.db")
	if err != nil {
		return err
	}
	defer closeDB()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders", "invoices"))
	if err != nil {
		return err
	}
	defer broker.Close()

	orders := outbox.Config{} // outbox_messages, outbox_leases, outbox_relays; 8 buckets
	billing := outbox.Config{BucketCount: 4, MessagesTable: "billing_messages", LeasesTable: "billing_leases", RelaysTable: "billing_relays"}

	ordersWake, billingWake := relay.NewNotifier(), relay.NewNotifier()
	// The plugin's Config is the default outbox for plain Creates.
	if err := db.Use(outbox.Plugin{Config: orders, Notifier: ordersWake}); err != nil {
		return err
	}
	for _, cfg := range []outbox.Config{orders, billing} {
		if err := outbox.AutoMigrate(db, cfg); err != nil {
			return err
		}
	}

	// One relay per outbox, each with its store, publisher and metrics name.
	var relays []*relay.Relay
	for _, o := range []struct {
		name string
		cfg  outbox.Config
		wake *relay.Notifier
	}{{"orders", orders, ordersWake}, {"billing", billing, billingWake}} {
		store, err := gormstore.New(db, gormstore.Options{Config: o.cfg})
		if err != nil {
			return err
		}
		pub, err := kafkapub.New(kafkapub.Config{Brokers: broker.ListenAddrs()})
		if err != nil {
			return err
		}
		defer pub.Close()
		r, err := relay.New(store, pub, relay.Options{Notifier: o.wake, MetricsName: o.name, Logger: slog.New(slog.DiscardHandler), SingleWriter: true})
		if err != nil {
			return err
		}
		relays = append(relays, r)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, len(relays))
	for _, r := range relays {
		go func() { done <- r.Run(rctx) }()
	}

	// One transaction, two outboxes.
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("order-%d", i)
		err := db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(outbox.NewStringMessage("orders", id, "placed")).Error; err != nil {
				return err
			}
			return tx.Scopes(outbox.WithOutbox(billing, billingWake)).Create(outbox.NewStringMessage("invoices", id, "invoice issued")).Error
		})
		if err != nil {
			return err
		}
	}

	// Each relay drains its own table.
	for _, cfg := range []outbox.Config{orders, billing} {
		if err := infra.Drained(ctx, db, cfg.MessagesTableName()); err != nil {
			return err
		}
		var leases int64
		if err := db.Table(cfg.LeasesTableName()).Count(&leases).Error; err != nil {
			return err
		}
		fmt.Printf("table %-16s drained; %d lease rows (one per bucket)\n", cfg.MessagesTableName(), leases)
	}
	stop()
	for range relays {
		if err := <-done; err != nil {
			return err
		}
	}
	for _, topic := range []string{"orders", "invoices"} {
		n, err := countRecords(ctx, broker.ListenAddrs()[0], topic)
		if err != nil {
			return err
		}
		fmt.Printf("topic %-8s holds %d records\n", topic, n)
	}
	return nil
}

// countRecords returns the number of records in topic's 4 partitions.
func countRecords(ctx context.Context, addr, topic string) (int64, error) {
	var n int64
	for p := range 4 {
		conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, p)
		if err != nil {
			return 0, err
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			return 0, err
		}
		n += last
	}
	return n, nil
}
