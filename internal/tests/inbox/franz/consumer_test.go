package franz_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/inbox/franz"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/internal/testenv/consumertest"
)

// TestConsumerBehaviour runs the consumer suite of package inbox's
// kafka-go Consumer on the franz-go Consumer.
func TestConsumerBehaviour(t *testing.T) {
	consumertest.Run(t, franzGo)
}

// franzGo is the suite's view of this consumer.
var franzGo = consumertest.Client{
	Name:         "franz-go",
	SkipsAborted: true,
	New: func(t testing.TB, b testenv.Broker, ib *inbox.Inbox, group, topic, handler string, fn consumertest.HandlerFunc, opts inbox.ConsumerOptions) consumertest.Consumer {
		c, err := franz.NewConsumer(ib, handler, func(tx *gorm.DB, r *kgo.Record) error {
			rec := consumertest.Record{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset, Key: r.Key, Value: r.Value}
			for _, h := range r.Headers {
				rec.Headers = append(rec.Headers, kafka.Header{Key: h.Key, Value: h.Value})
			}
			return fn(tx, rec)
		}, opts,
			kgo.SeedBrokers(b.Addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.FetchMaxWait(50*time.Millisecond), kgo.HeartbeatInterval(200*time.Millisecond),
			kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(6*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	},
}

// BenchmarkConsumerVsBareTransaction: see consumertest.Bench.
func BenchmarkConsumerVsBareTransaction(b *testing.B) {
	consumertest.Bench(b, franzGo)
}

// TestEffectsAudit: see consumertest.RunEffects.
func TestEffectsAudit(t *testing.T) {
	consumertest.RunEffects(t, franzGo)
}

// TestConsumerThrownOutOfItsGroupRejoins: member A blocks a rebalance (its
// handler is slow, and the client blocks rebalances while a poll's records
// are handled) past the rebalance timeout, so the coordinator throws it out
// of the group and hands its partition to member B; A's offset commit is
// then refused (UNKNOWN_MEMBER_ID). A must drop that commit and rejoin, not
// retry it forever: once B leaves, A handles the topic's new record. B
// handled A's record again as a duplicate: it has one effect.
func TestConsumerThrownOutOfItsGroupRejoins(t *testing.T) {
	b := testenv.NewFake(t)
	db := testenv.Databases(t)[0].Open(t, nil) // SQLite
	if err := inbox.AutoMigrate(db, inbox.Config{}); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Logs{}
	ib, err := inbox.New(db, inbox.Options{Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	topic, group := testenv.Unique("franz-out-"), testenv.Unique("g-")
	b.CreateTopic(t, topic, 1, nil)
	producer, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	produce := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			rec := &kgo.Record{Topic: topic, Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "x-outbox-message-id", Value: []byte(id)}}}
			if err := producer.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
				t.Fatalf("produce %s: %v", id, err)
			}
		}
	}

	var mu sync.Mutex
	handled := map[string][]string{} // message id → the members that applied it
	entered, release := make(chan struct{}), make(chan struct{})
	var slowOnce sync.Once
	run := func(name string, slow bool, opts ...kgo.Opt) (stop func()) {
		opts = append(opts, kgo.SeedBrokers(b.Addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.FetchMaxWait(50*time.Millisecond), kgo.HeartbeatInterval(100*time.Millisecond),
			kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(time.Second))
		c, err := franz.NewConsumer(ib, "out", func(tx *gorm.DB, r *kgo.Record) error {
			if slow && string(r.Value) == "r1" {
				slowOnce.Do(func() { close(entered); <-release })
			}
			mu.Lock()
			handled[string(r.Value)] = append(handled[string(r.Value)], name)
			mu.Unlock()
			return nil
		}, inbox.ConsumerOptions{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		var once sync.Once
		stop = func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("%s: Run = %v; want nil after a stop", name, err)
				}
				c.Close()
			})
		}
		t.Cleanup(stop)
		return stop
	}
	processed := func(id string) bool {
		var n int64
		if err := db.Model(&inbox.ProcessedMessage{}).Where("message_id = ?", id).Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 30s", what)
			}
		}
	}

	run("A", true)
	produce("r1", "r2")
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("A never handled r1")
	}
	// B joins; the rebalance waits for A, which is blocked in its handler,
	// until the rebalance timeout throws A out and B gets the partition.
	assigned := make(chan struct{})
	var assignOnce sync.Once
	stopB := run("B", false, kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		if len(m[topic]) > 0 {
			assignOnce.Do(func() { close(assigned) })
		}
	}))
	select {
	case <-assigned:
	case <-time.After(30 * time.Second):
		t.Fatal("B was never assigned the partition")
	}
	close(release) // A commits r1's transaction; its offset commit is refused
	waitFor("r2 handled", func() bool { return processed("r2") })
	stopB()
	produce("r3")
	waitFor("r3 handled by A after B left (A rejoined the group)", func() bool { return processed("r3") })

	mu.Lock()
	defer mu.Unlock()
	if got := handled["r1"]; len(got) != 1 || got[0] != "A" {
		t.Errorf("r1 applied by %v; want by A only (B's redelivery is a duplicate)", got)
	}
	if got := handled["r3"]; len(got) != 1 || got[0] != "A" {
		t.Errorf("r3 applied by %v; want A", got)
	}
}
