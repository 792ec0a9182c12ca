package testenv

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Broker names.
const (
	// InProcess is the kfake broker started inside the test process.
	InProcess = "kfake"
	// Real is an Apache Kafka broker named by OUTBOX_TEST_KAFKA_BROKERS.
	Real = "kafka"
)

// Broker is a Kafka cluster a test can produce to.
type Broker struct {
	// Name is InProcess or Real.
	Name string
	// Addrs are the bootstrap addresses.
	Addrs []string
	// Fake is the in-process cluster (for fault injection), nil for Real.
	Fake *kfake.Cluster
	// dialer connects CreateTopic and ReadAll to the broker; nil means
	// kafka-go's default (plaintext). SASLBroker sets one over TLS and SASL.
	dialer *kafka.Dialer
}

// dial returns the dialer of CreateTopic and ReadAll.
func (b Broker) dial() *kafka.Dialer {
	if b.dialer != nil {
		return b.dialer
	}
	return kafka.DefaultDialer
}

// NewFake starts an in-process Kafka broker on loopback, closed at cleanup.
func NewFake(t testing.TB, opts ...kfake.Opt) Broker {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(8)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("testenv: start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return Broker{Name: InProcess, Addrs: c.ListenAddrs(), Fake: c}
}

// RealBroker returns the real broker of OUTBOX_TEST_KAFKA_BROKERS, or ok
// false when it is not set (a failure under OUTBOX_TEST_REQUIRE_ALL).
func RealBroker(t testing.TB) (b Broker, ok bool) {
	t.Helper()
	if !isSet(t, EnvKafka) {
		return Broker{}, false
	}
	return Broker{Name: Real, Addrs: strings.Split(os.Getenv(EnvKafka), ",")}, true
}

// Brokers returns an in-process broker and, when available, the real one.
func Brokers(t testing.TB) []Broker {
	t.Helper()
	bs := []Broker{NewFake(t)}
	if b, ok := RealBroker(t); ok {
		bs = append(bs, b)
	}
	return bs
}

// ForEachBroker runs f as a subtest named after each available broker.
func ForEachBroker(t *testing.T, f func(t *testing.T, b Broker)) {
	t.Helper()
	for _, b := range Brokers(t) {
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}

// CreateTopic creates a topic with the given partitions and topic configs
// (e.g. "max.message.bytes") and waits until its partitions have leaders
// that serve.
func (b Broker) CreateTopic(t testing.TB, topic string, partitions int, configs map[string]string) {
	t.Helper()
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}
	for k, v := range configs {
		tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
	}
	if err := CreateTopic(context.Background(), b.dial(), b.Addrs, tc); err != nil {
		t.Fatal(err)
	}
}

// ReadAll consumes topic from the beginning of every partition until want
// records were read or the timeout passed, and returns what it read in
// per-partition order (partitions in ascending order).
func (b Broker) ReadAll(t testing.TB, topic string, want int, timeout time.Duration) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := b.dial()
	conn, err := d.DialContext(ctx, "tcp", b.Addrs[0])
	if err != nil {
		t.Fatalf("testenv: dial %s: %v", b.Addrs[0], err)
	}
	ps, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		t.Fatalf("testenv: read partitions of %s: %v", topic, err)
	}
	var out []kafka.Message
	for len(out) < want && ctx.Err() == nil {
		out = out[:0]
		for _, p := range ps {
			last, err := lastOffset(ctx, d, b.Addrs[0], topic, p.ID)
			if err != nil {
				t.Fatalf("testenv: last offset of %s/%d: %v", topic, p.ID, err)
			}
			if last == 0 {
				continue
			}
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: b.Addrs, Dialer: d, Topic: topic, Partition: p.ID, MaxWait: 50 * time.Millisecond})
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					break
				}
				out = append(out, m)
				if m.Offset+1 >= last {
					break
				}
			}
			r.Close()
		}
		if len(out) < want {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

func lastOffset(ctx context.Context, d *kafka.Dialer, addr, topic string, partition int) (int64, error) {
	c, err := d.DialLeader(ctx, "tcp", addr, topic, partition)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.ReadLastOffset()
}
