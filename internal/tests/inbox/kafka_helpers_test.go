package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/internal/testenv/consumertest"
)

// Helpers shared with the consumer suite.
var (
	produce       = consumertest.Produce
	committed     = consumertest.Committed
	waitCommitted = consumertest.WaitCommitted
)

// forEachDBAndBroker runs f as subtests named <database>_<broker>: every
// database with the in-process broker and, on PostgreSQL, also with the
// real broker when the environment names one.
func forEachDBAndBroker(t *testing.T, f func(t *testing.T, o testenv.Opener, b testenv.Broker)) {
	consumertest.ForEachPairing(t, false, f)
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

// runConsumer runs c until the returned stop is called; stop fails t
// unless Run returned nil.
func runConsumer(t testing.TB, c *inbox.Consumer) (stop func()) {
	return consumertest.Start(t, context.Background(), "consumer", c.Run)
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
