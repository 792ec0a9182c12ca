package kafkapub_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// readIsolated consumes topic from the start with a franz-go client at the
// given isolation level (kafka-go's Reader does not filter aborted
// transactions: it returns their records and the transaction markers) until
// it has want records, then for quiet more without a record, and returns
// every record read, in per-partition order (partitions interleaved).
func readIsolated(t testing.TB, b testenv.Broker, topic string, level kgo.IsolationLevel, want int, quiet time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(b.Addrs...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(level),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	defer cl.Close()
	var out []*kgo.Record
	deadline := time.Now().Add(30 * time.Second)
	lastNew := time.Now()
	for {
		if len(out) >= want && time.Since(lastNew) >= quiet {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %d records of %s in 30s; want at least %d", len(out), topic, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		n := len(out)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
		if len(out) > n {
			lastNew = time.Now()
		}
	}
}

// recordID returns r's message-id header.
func recordID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == kafkapub.DefaultMessageIDHeader {
			return string(h.Value)
		}
	}
	return ""
}
