package wire

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// newTopic creates a fresh topic named after the test on b.
func newTopic(t testing.TB, b testenv.Broker, partitions int, configs map[string]string) string {
	t.Helper()
	name := regexp.MustCompile(`[^a-zA-Z0-9._-]+`).ReplaceAllString(t.Name(), "_")
	if len(name) > 180 {
		name = name[:180]
	}
	topic := fmt.Sprintf("%s-%08x", name, rand.Uint32())
	b.CreateTopic(t, topic, partitions, configs)
	return topic
}

// readIsolated consumes topic from the start with a franz-go client at the
// given isolation level until it has want records, then for quiet more
// without a record, and returns every record read (kafkapub's test helper
// of the same name).
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
