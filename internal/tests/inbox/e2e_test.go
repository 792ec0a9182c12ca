package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// errLostAck is what duplicatingPublisher reports for a batch it did
// publish: an acknowledgement lost on the way back.
var errLostAck = errors.New("acknowledgement lost (injected)")

// duplicatingPublisher publishes through Publisher, and every third call
// reports a failure after the records landed, as a publish whose
// acknowledgement was lost: the relay publishes them again.
type duplicatingPublisher struct {
	relay.Publisher
	calls    atomic.Int64
	injected atomic.Int64 // records published by a call reported failed
}

func (d *duplicatingPublisher) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := d.Publisher.Publish(ctx, batches)
	for i, res := range results {
		if d.calls.Add(1)%3 == 0 && res.Acknowledged > 0 {
			d.injected.Add(int64(res.Acknowledged))
			results[i] = relay.Result{Err: errLostAck}
		}
	}
	return results
}

// endOffsets returns the end offset of each of topic's partitions.
func endOffsets(t *testing.T, b testenv.Broker, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reqs []kafka.OffsetRequest
	for p := range partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
	}
	c := &kafka.Client{Addr: kafka.TCP(b.Addrs...)}
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatalf("ListOffsets(%s): %v", topic, err)
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("ListOffsets(%s) partition %d: %v", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out
}

// TestEndToEndOutboxRelayDuplicatesInbox: writers commit (and roll back)
// outbox messages; a relay publishes them through a publisher that loses
// every third acknowledgement, so the relay publishes those records again;
// two consumers of one group apply each record through the inbox. The
// effect table ends with exactly one row per committed message and none
// for a rolled-back one, and every record on the topic was either
// processed or skipped as a duplicate (some twice, redelivered by the
// group's rebalances).
func TestEndToEndOutboxRelayDuplicatesInbox(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		const partitions = 4
		topic, group := testenv.Unique("inbox-e2e-"), testenv.Unique("g-")
		b.CreateTopic(t, topic, partitions, nil)

		// The producing service: the outbox tables, the plugin and a relay.
		db := o.Open(t, nil)
		cfg := outbox.Config{BucketCount: 4}
		n := relay.NewNotifier()
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
		kp, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kp.Close() })
		pub := &duplicatingPublisher{Publisher: kp}
		rl, err := relay.New(store, pub, relay.Options{Notifier: n, PollInterval: 50 * time.Millisecond, ErrorBackoff: 10 * time.Millisecond, SingleWriter: db.Dialector.Name() == "sqlite"})
		if err != nil {
			t.Fatal(err)
		}
		relayCtx, stopRelay := context.WithCancel(ctx)
		defer stopRelay()
		relayDone := make(chan error, 1)
		go func() { relayDone <- rl.Run(relayCtx) }()

		// The consuming service (here in the same database): two consumers
		// of one group.
		ib, reader := setup(t, db, inbox.Options{})
		for range 2 {
			c, err := inbox.NewConsumer(ib, groupReader(t, b, topic, group), "e2e", applyRecord, inbox.ConsumerOptions{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			runConsumer(t, c)
		}

		// Writers: 2 × 30 transactions of two messages; every fifth rolls back.
		var (
			mu                    sync.Mutex
			wg                    sync.WaitGroup
			committedIDs, rolledB = map[string]bool{}, map[string]bool{}
		)
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 30 {
					msgs := []*outbox.Message{
						outbox.NewStringMessage(topic, fmt.Sprintf("w%d-order-%d", w, i%5), fmt.Sprintf("created-%d-%d", w, i)),
						outbox.NewStringMessage(topic, fmt.Sprintf("w%d-order-%d", w, i%5), fmt.Sprintf("paid-%d-%d", w, i)),
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
					if (err != nil) != fail {
						t.Errorf("writer %d transaction %d = %v", w, i, err)
						return
					}
					mu.Lock()
					for _, m := range msgs {
						if fail {
							rolledB[m.MessageID.String()] = true
						} else {
							committedIDs[m.MessageID.String()] = true
						}
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			return
		}

		// Wait until the outbox is empty and the group consumed everything.
		for {
			var left int64
			if err := db.Model(&outbox.Message{}).Count(&left).Error; err != nil {
				t.Fatal(err)
			}
			if left == 0 {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%d rows left in the outbox", left)
			}
			time.Sleep(20 * time.Millisecond)
		}
		stopRelay()
		if err := <-relayDone; err != nil {
			t.Fatalf("relay Run = %v", err)
		}
		ends := endOffsets(t, b, topic, partitions)
		waitCommitted(t, b, group, topic, ends)

		var rows []effect
		if err := db.Find(&rows).Error; err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, r := range rows {
			seen[r.MessageID]++
			if rolledB[r.MessageID] {
				t.Fatalf("effect for rolled-back message %s", r.MessageID)
			}
			if !committedIDs[r.MessageID] {
				t.Fatalf("effect for unknown message %q", r.MessageID)
			}
		}
		for id, c := range seen {
			if c != 1 {
				t.Fatalf("message %s has %d effects; want 1", id, c)
			}
		}
		if len(seen) != len(committedIDs) {
			t.Fatalf("effects for %d messages; want %d (every committed one)", len(seen), len(committedIDs))
		}
		var records int64
		for _, e := range ends {
			records += e
		}
		r := collect(t, reader)
		injected := pub.injected.Load()
		t.Logf("%d committed messages, %d records on the topic, %d duplicates injected, %d processed, %d skipped as duplicates",
			len(committedIDs), records, injected, r[inbox.MetricProcessed], r[inbox.MetricDuplicates])
		if injected == 0 || r[inbox.MetricDuplicates] < injected {
			t.Fatalf("duplicates skipped = %d, injected = %d; want injected > 0 and all of them skipped", r[inbox.MetricDuplicates], injected)
		}
		// A rebalance between two consumers can redeliver a handled record
		// whose offset was not committed yet: one more duplicate.
		if r[inbox.MetricProcessed] != int64(len(committedIDs)) || r[inbox.MetricProcessed]+r[inbox.MetricDuplicates] < records {
			t.Fatalf("processed %d + duplicates %d; want %d + at least the rest of the %d records", r[inbox.MetricProcessed], r[inbox.MetricDuplicates], len(committedIDs), records)
		}
	})
}
