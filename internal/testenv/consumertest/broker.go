package consumertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// ForEachPairing runs f as subtests named <database>_<broker>: every
// database with the in-process broker and, on PostgreSQL (every database
// when everyDB is set), with the real broker when the environment names one.
func ForEachPairing(t *testing.T, everyDB bool, f func(t *testing.T, o testenv.Opener, b testenv.Broker)) {
	t.Helper()
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name+"_"+testenv.InProcess, func(t *testing.T) { f(t, o, testenv.NewFake(t)) })
		if o.Name != testenv.Postgres && !everyDB {
			continue
		}
		t.Run(o.Name+"_"+testenv.Real, func(t *testing.T) {
			b, ok := testenv.RealBroker(t)
			if !ok {
				t.Skipf("%s is not set", testenv.EnvKafka)
			}
			f(t, o, b)
		})
	}
}

// Produce writes msgs to topic, each to its Partition.
func Produce(t testing.TB, b testenv.Broker, topic string, msgs ...kafka.Message) {
	t.Helper()
	tr := &kafka.Transport{} // its own: the default caches metadata
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

// Committed returns the group's committed offset of each of topic's
// partitions (-1 for none).
func Committed(t testing.TB, b testenv.Broker, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ps := make([]int, partitions)
	for i := range ps {
		ps[i] = i
	}
	tr := &kafka.Transport{} // its own: the default caches metadata
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(b.Addrs...), Transport: tr}
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

// WaitCommitted waits until the group's committed offsets reach want
// (partition → offset), failing t after a minute.
func WaitCommitted(t testing.TB, b testenv.Broker, group, topic string, want map[int]int64) {
	t.Helper()
	var got map[int]int64
	if !eventually(20*time.Millisecond, func() bool {
		got = Committed(t, b, group, topic, len(want))
		for p, off := range want {
			if got[p] < off {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("committed offsets of %s = %v; want %v", group, got, want)
	}
}

// eventually reports whether cond held, polled every interval, within a
// minute.
func eventually(every time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(every) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
