package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// forEachDBAndBroker runs f as subtests named <database>_<broker>: every
// database with the in-process broker and, on PostgreSQL, also with the
// real broker when the environment names one (the relay's end-to-end
// pairing).
func forEachDBAndBroker(t *testing.T, f func(t *testing.T, o testenv.Opener, b testenv.Broker)) {
	t.Helper()
	type pairing struct {
		db   testenv.Opener
		real bool
	}
	var pairings []pairing
	for _, o := range testenv.Databases(t) {
		pairings = append(pairings, pairing{o, false})
		if o.Name == testenv.Postgres {
			pairings = append(pairings, pairing{o, true})
		}
	}
	for _, p := range pairings {
		name := p.db.Name + "_" + testenv.InProcess
		if p.real {
			name = p.db.Name + "_" + testenv.Real
		}
		t.Run(name, func(t *testing.T) {
			var b testenv.Broker
			if p.real {
				var ok bool
				if b, ok = testenv.RealBroker(t); !ok {
					t.Skipf("%s is not set", testenv.EnvKafka)
				}
			} else {
				b = testenv.NewFake(t)
			}
			f(t, p.db, b)
		})
	}
}

// produce writes msgs to topic, each to its Partition.
func produce(t testing.TB, b testenv.Broker, topic string, msgs ...kafka.Message) {
	t.Helper()
	// A transport of its own: kafka-go's shared default caches metadata, in
	// which a topic created a moment ago may not exist yet.
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:         kafka.TCP(b.Addrs...),
		Transport:    tr,
		Topic:        topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// groupReader returns a consumer-group reader of topic, closed at cleanup,
// with short heartbeats so that rebalances settle quickly.
func groupReader(t testing.TB, b testenv.Broker, topic, group string) *kafka.Reader {
	t.Helper()
	r := kafka.NewReader(groupReaderConfig(b.Addrs, topic, group))
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func groupReaderConfig(brokers []string, topic, group string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers:           brokers,
		GroupID:           group,
		Topic:             topic,
		MaxWait:           50 * time.Millisecond,
		HeartbeatInterval: 200 * time.Millisecond,
		SessionTimeout:    6 * time.Second, // the broker's minimum
		RebalanceTimeout:  6 * time.Second,
		JoinGroupBackoff:  100 * time.Millisecond,
	}
}

// committed returns the group's committed offset of each of topic's
// partitions (-1 for none).
func committed(t testing.TB, b testenv.Broker, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ps := make([]int, partitions)
	for i := range ps {
		ps[i] = i
	}
	c := &kafka.Client{Addr: kafka.TCP(b.Addrs...)}
	res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err != nil {
		t.Fatalf("OffsetFetch(%s): %v", group, err)
	}
	out := map[int]int64{}
	if errors.Is(res.Error, kafka.GroupIdNotFound) { // kfake, before the group's first join
		for _, p := range ps {
			out[p] = -1
		}
		return out
	}
	if res.Error != nil {
		t.Fatalf("OffsetFetch(%s): %v", group, res.Error)
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("OffsetFetch(%s) partition %d: %v", group, p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// waitCommitted waits until the group's committed offsets reach want
// (partition → offset), failing t after a minute.
func waitCommitted(t testing.TB, b testenv.Broker, group, topic string, want map[int]int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := committed(t, b, group, topic, len(want))
		done := true
		for p, off := range want {
			if got[p] < off {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed offsets of %s = %v; want %v", group, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runConsumer runs c until the returned stop is called; stop fails t
// unless Run returned nil.
func runConsumer(t testing.TB, c *inbox.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run = %v; want nil after the stop", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return within 30s of the stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// watchedReader is a Reader whose fetches and commits a test observes or
// changes.
type watchedReader struct {
	inbox.Reader
	onFetch  func(kafka.Message)
	onCommit func(ctx context.Context, msgs []kafka.Message) error // nil: commit
}

func (w watchedReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	m, err := w.Reader.FetchMessage(ctx)
	if err == nil && w.onFetch != nil {
		w.onFetch(m)
	}
	return m, err
}

func (w watchedReader) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	if w.onCommit != nil {
		if err := w.onCommit(ctx, msgs); err != nil {
			return err
		}
	}
	return w.Reader.CommitMessages(ctx, msgs...)
}

// header returns the value of m's last header key, and whether it has one.
func header(m kafka.Message, key string) (string, bool) {
	v, ok := "", false
	for _, h := range m.Headers {
		if h.Key == key {
			v, ok = string(h.Value), true
		}
	}
	return v, ok
}

// errInjected is the error injected by the tests' handlers and readers.
var errInjected = errors.New("injected failure")
