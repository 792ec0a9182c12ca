package kafkapub_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// BenchmarkDrainTransactional drains 20,000 rows committed in one
// transaction (1 KiB values, 8 buckets, 8 partitions, batches of 500) with
// one relay, in the default and then the transactional mode, on PostgreSQL
// (SQLite when the environment names none) with the in-process and the real
// broker: msg/s from the commit to an empty table. The relay runs before the
// commit, and has drained one row: its start (leases; in the transactional
// mode a producer id per bucket, InitProducerId) is start-ms, apart, as the
// drain harness (cmd/outbox-bench) starts its relays before its commit.
//
//	go test -run '^$' -bench DrainTransactional -benchtime 3x ./internal/tests/kafkapub
func BenchmarkDrainTransactional(b *testing.B) {
	var opener testenv.Opener
	for _, o := range testenv.Databases(b) {
		if opener.Name == "" || o.Name == testenv.Postgres {
			opener = o
		}
	}
	brokers := []testenv.Broker{testenv.NewFake(b)}
	if r, ok := testenv.RealBroker(b); ok {
		brokers = append(brokers, r)
	}
	const rows = 20000
	value := bytes.Repeat([]byte("v"), 1024)
	for _, br := range brokers {
		for _, mode := range []string{"default", "transactional"} {
			b.Run(fmt.Sprintf("%s_%s/%s", opener.Name, br.Name, mode), func(b *testing.B) {
				db := opener.Open(b, nil)
				cfg := outbox.Config{BucketCount: 8}
				if err := db.Use(outbox.Plugin{Config: cfg}); err != nil {
					b.Fatal(err)
				}
				if err := outbox.AutoMigrate(db, cfg); err != nil {
					b.Fatal(err)
				}
				var total, starts time.Duration
				for i := range b.N {
					topic := fmt.Sprintf("drain-%s-%d-%d", mode, i, time.Now().UnixNano())
					br.CreateTopic(b, topic, 8, nil)
					msgs := make([]*outbox.Message, rows)
					for j := range msgs {
						msgs[j] = outbox.NewMessage(topic, fmt.Appendf(nil, "key-%d", j), value)
					}
					kc := kafkapub.Config{Brokers: br.Addrs}
					if mode == "transactional" {
						kc.Transactions = &kafkapub.Transactions{Outbox: topic}
					}
					pub, err := kafkapub.New(kc)
					if err != nil {
						b.Fatal(err)
					}
					store, err := gormstore.New(db, gormstore.Options{Config: cfg})
					if err != nil {
						b.Fatal(err)
					}
					r, err := relay.New(store, pub, relay.Options{Logger: slog.New(slog.DiscardHandler), PollInterval: 10 * time.Millisecond, SingleWriter: db.Dialector.Name() == "sqlite"})
					if err != nil {
						b.Fatal(err)
					}
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan error, 1)
					drained := func(since time.Time) time.Duration {
						for {
							var n int64
							if err := db.Model(&outbox.Message{}).Count(&n).Error; err != nil {
								b.Fatal(err)
							}
							if n == 0 {
								return time.Since(since)
							}
							if time.Since(since) > 5*time.Minute {
								b.Fatalf("%d rows left after 5 minutes", n)
							}
							time.Sleep(5 * time.Millisecond)
						}
					}
					began := time.Now()
					go func() { done <- r.Run(ctx) }()
					if err := db.Create(outbox.NewMessage(topic, []byte("warm-up"), value)).Error; err != nil {
						b.Fatal(err)
					}
					starts += drained(began)
					if err := db.Transaction(func(tx *gorm.DB) error { return tx.CreateInBatches(msgs, 1000).Error }); err != nil {
						b.Fatal(err)
					}
					total += drained(time.Now())
					cancel()
					if err := <-done; err != nil {
						b.Fatal(err)
					}
					_ = pub.Close()
				}
				b.ReportMetric(float64(b.N*rows)/total.Seconds(), "msg/s")
				b.ReportMetric(float64(starts.Milliseconds())/float64(b.N), "start-ms")
			})
		}
	}
}
