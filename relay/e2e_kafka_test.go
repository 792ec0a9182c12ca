package relay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
)

// TestEndToEndGormToKafka moves GORM-enqueued rows through the relay and the
// Kafka publisher to a consumer: every committed row arrives with its
// message-id header, key, value and headers; no rolled-back row does; the
// table empties. SQLite, PostgreSQL and MySQL with the in-process broker,
// and PostgreSQL with the real broker when the environment names both.
func TestEndToEndGormToKafka(t *testing.T) {
	type pairing struct {
		db     testenv.Opener
		broker func(t *testing.T) (testenv.Broker, bool)
	}
	fake := func(t *testing.T) (testenv.Broker, bool) { return testenv.NewFake(t), true }
	real := func(t *testing.T) (testenv.Broker, bool) { return testenv.RealBroker(t) }
	var pairings []pairing
	for _, o := range testenv.Databases(t) {
		pairings = append(pairings, pairing{o, fake})
		if o.Name == testenv.Postgres {
			pairings = append(pairings, pairing{o, real})
		}
	}
	for _, p := range pairings {
		b, ok := p.broker(t)
		if !ok {
			continue
		}
		t.Run(p.db.Name+"_"+b.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			topic := testenv.Unique("e2e-")
			b.CreateTopic(t, topic, 4, nil)

			db := p.db.Open(t, nil)
			n := relay.NewNotifier()
			cfg := outbox.Config{BucketCount: 4}
			if err := db.Use(outbox.Plugin{Config: cfg, Notifier: n}); err != nil {
				t.Fatal(err)
			}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			pub, err := relay.NewKafkaPublisher(relay.KafkaConfig{Brokers: b.Addrs})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			r, err := relay.New(store, pub, relay.Options{Notifier: n, PollInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()

			committed := map[string]*outbox.Message{}
			rolledBack := map[string]bool{}
			for i := 0; i < 60; i++ {
				msgs := []*outbox.Message{
					outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i%7), fmt.Sprintf("value-%d", i), outbox.Header{Key: "n", Value: []byte(fmt.Sprint(i))}),
					outbox.NewMessage(topic, nil, []byte(fmt.Sprintf("keyless-%d", i))),
				}
				fail := i%5 == 4
				err := db.Transaction(func(tx *gorm.DB) error {
					if err := outbox.Enqueue(tx, msgs...); err != nil {
						return err
					}
					if fail {
						return errors.New("rolled back on purpose")
					}
					return nil
				})
				if fail != (err != nil) {
					t.Fatalf("transaction %d = %v; want failure %v", i, err, fail)
				}
				for _, m := range msgs {
					if fail {
						rolledBack[m.MessageID.String()] = true
					} else {
						committed[m.MessageID.String()] = m
					}
				}
			}

			recs := b.ReadAll(t, topic, len(committed), time.Minute)
			seen := map[string]bool{}
			for _, rec := range recs {
				var id string
				for _, h := range rec.Headers {
					if h.Key == relay.DefaultMessageIDHeader {
						id = string(h.Value)
					}
				}
				if rolledBack[id] {
					t.Fatalf("record %s of a rolled-back transaction was published", id)
				}
				m, ok := committed[id]
				if !ok {
					t.Fatalf("record with message id %q matches no committed row", id)
				}
				if string(rec.Value) != string(m.Value) || string(rec.Key) != string(m.Key) {
					t.Fatalf("record %s = key %q value %q; want %q %q", id, rec.Key, rec.Value, m.Key, m.Value)
				}
				if len(m.Headers) > 0 && (len(rec.Headers) != 2 || rec.Headers[0].Key != "n" || string(rec.Headers[0].Value) != string(m.Headers[0].Value)) {
					t.Fatalf("record %s headers = %v; want n then the message id", id, rec.Headers)
				}
				seen[id] = true
			}
			if len(seen) != len(committed) {
				t.Fatalf("consumed %d distinct committed records; want %d", len(seen), len(committed))
			}
			waitOutboxEmpty(ctx, t, db)
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run = %v; want nil", err)
			}
		})
	}
}

// waitOutboxEmpty waits until the default messages table is empty, failing
// t when ctx ends first.
func waitOutboxEmpty(ctx context.Context, t *testing.T, db *gorm.DB) {
	t.Helper()
	for {
		var left int64
		if err := db.Model(&outbox.Message{}).Count(&left).Error; err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d rows left in the outbox; want 0", left)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
