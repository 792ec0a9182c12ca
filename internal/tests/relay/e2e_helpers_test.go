package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// The writer, relay and consumer steps that the end-to-end tests through
// Kafka share (plain, PgBouncer, SASL_SSL).

// forEachDBAndBroker runs f as subtests named <database>_<broker>: every
// database with the in-process broker and, on PostgreSQL, also with the
// real broker when the environment names one.
func forEachDBAndBroker(t *testing.T, f func(t *testing.T, db testenv.Opener, b testenv.Broker)) {
	t.Helper()
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
		t.Run(p.db.Name+"_"+b.Name, func(t *testing.T) { f(t, p.db, b) })
	}
}

// e2eStore installs the outbox plugin (4 buckets, waking n; nil for none) on
// db, creates its tables and returns a gormstore over it.
func e2eStore(t *testing.T, db *gorm.DB, n *relay.Notifier) *gormstore.Store {
	t.Helper()
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
	return store
}

// startKafkaRelay runs a relay over store, woken by n and polling every
// 50ms, that publishes through a kafkapub.Publisher of kc (closed at cleanup)
// until ctx ends; Run's result arrives on the returned channel.
func startKafkaRelay(ctx context.Context, t *testing.T, db *gorm.DB, store relay.Store, n *relay.Notifier, kc kafkapub.Config) (*relay.Relay, <-chan error) {
	t.Helper()
	pub, err := kafkapub.New(kc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(store, pub, relay.Options{Notifier: n, PollInterval: 50 * time.Millisecond, SingleWriter: db.Dialector.Name() == "sqlite"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return r, done
}

// stopRelay cancels the relay's context and fails t unless Run, whose
// result done carries, returns nil.
func stopRelay(t *testing.T, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v; want nil", err)
	}
}

// writeTransactions runs writers goroutines that each commit txns
// transactions of two records to topic (a keyed one with a header "n", and a
// keyless one); every fifth transaction of a writer rolls back. It returns
// the committed records by message id and the rolled-back ids.
func writeTransactions(ctx context.Context, t *testing.T, db *gorm.DB, topic string, writers, txns int) (committed map[string]*outbox.Message, rolledBack map[string]bool) {
	t.Helper()
	committed, rolledBack = map[string]*outbox.Message{}, map[string]bool{}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make(chan error, writers)
	)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < txns; i++ {
				msgs := []*outbox.Message{
					outbox.NewStringMessage(topic, fmt.Sprintf("w%d-key-%d", w, i%7), fmt.Sprintf("value-%d-%d", w, i), outbox.Header{Key: "n", Value: []byte(fmt.Sprint(i))}),
					outbox.NewMessage(topic, nil, []byte(fmt.Sprintf("keyless-%d-%d", w, i))),
				}
				fail := i%5 == 4
				err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					if err := outbox.Enqueue(tx, msgs...); err != nil {
						return err
					}
					if fail {
						return errors.New("rolled back on purpose")
					}
					return nil
				})
				if fail != (err != nil) {
					errs <- fmt.Errorf("writer %d transaction %d = %v; want failure %v", w, i, err, fail)
					return
				}
				mu.Lock()
				for _, m := range msgs {
					if fail {
						rolledBack[m.MessageID.String()] = true
					} else {
						committed[m.MessageID.String()] = m
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return committed, rolledBack
}

// checkRecords checks that recs hold every committed record exactly as
// enqueued (key, value, its headers followed by the message-id header) and
// no rolled-back one.
func checkRecords(t *testing.T, recs []kafka.Message, committed map[string]*outbox.Message, rolledBack map[string]bool) {
	t.Helper()
	seen := map[string]bool{}
	for _, rec := range recs {
		var id string
		for _, h := range rec.Headers {
			if h.Key == kafkapub.DefaultMessageIDHeader {
				id = string(h.Value)
			}
		}
		if rolledBack[id] {
			t.Fatalf("record %s of a rolled-back transaction was published", id)
		}
		m, ok := committed[id]
		if !ok {
			t.Fatalf("record with message id %q (key %q) matches no committed row", id, rec.Key)
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
