package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/driver/sqlite"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// TestWorkerPublishesInKafkaTransactions: with -kafka-transactions the
// worker publishes through one transactional producer per bucket: a
// read_committed consumer receives every row once, each record in a
// transactional batch of a producer id, and the table empties; SIGTERM
// still exits 0. On the in-process broker, and on the real one when the
// environment names it.
func TestWorkerPublishesInKafkaTransactions(t *testing.T) {
	bin := buildWorker(t)
	broker, ok := testenv.RealBroker(t)
	if !ok {
		broker = testenv.NewFake(t)
	}
	dsn := sqliteFile(t)
	db := openOutboxDB(t, sqlite.Open(dsn), outbox.Config{BucketCount: 4})
	topic := testenv.Unique("worker-txn-")
	broker.CreateTopic(t, topic, 4, nil)
	const rows = 120
	want := map[string]bool{}
	msgs := make([]*outbox.Message, rows)
	for i := range msgs {
		msgs[i] = outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i%11), fmt.Sprintf("value-%d", i))
	}
	if err := outbox.Enqueue(db, msgs...); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		want[m.MessageID.String()] = true // assigned by Enqueue
	}
	name := testenv.Unique("worker-txn-")
	w := startWorker(t, bin, []string{"-db-driver", "sqlite", "-db-dsn", dsn, "-kafka-brokers", strings.Join(broker.Addrs, ","),
		"-bucket-count", "4", "-listen", "127.0.0.1:0", "-log-format", "json", "-poll-interval", "50ms",
		"-kafka-transactions", name})

	cl, err := kgo.NewClient(kgo.SeedBrokers(broker.Addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for len(seen) < rows {
		if time.Now().After(deadline) {
			t.Fatalf("a read_committed consumer got %d of %d rows in 60s\n%s", len(seen), rows, w.logs)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsTransactional() || r.ProducerID < 0 {
				t.Errorf("record at %d/%d: transactional=%v producer id %d; want a transactional producer's", r.Partition, r.Offset, r.Attrs.IsTransactional(), r.ProducerID)
			}
			for _, h := range r.Headers {
				if h.Key == kafkapub.DefaultMessageIDHeader {
					seen[string(h.Value)]++
				}
			}
		})
	}
	for id, n := range seen {
		if !want[id] {
			t.Errorf("record with message id %s that was never enqueued", id)
		}
		if n != 1 {
			t.Errorf("message %s read %d times; want once", id, n)
		}
	}
	eventually(t, "the messages table is empty", w.logs, func() bool {
		var n int64
		return db.Table(outbox.DefaultMessagesTable).Count(&n).Error == nil && n == 0
	})
	w.terminate(t)
}
