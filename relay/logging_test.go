package relay_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/gorm-outbox/outbox/relay"
)

// syncBuffer is a bytes.Buffer safe for the relay's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogsSayThingsOnce: every record of a relay's run carries the relay id
// and the outbox name once (set on the logger at New), no message repeats
// the package name as a prefix, and at DEBUG each published batch has its
// line with the bucket, the rows and the publish and delete times.
func TestLogsSayThingsOnce(t *testing.T) {
	var buf syncBuffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := newHarness(t, relay.Options{BucketCount: 2, Logger: logger, MetricsName: "orders"}, nil)
	h.store.AddToBucket(0, msgs(3, "t")...)
	h.store.AddToBucket(1, msgs(2, "t")...)
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	batches := map[float64]float64{}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		msg, _ := rec["msg"].(string)
		if strings.HasPrefix(msg, "relay: ") || strings.HasPrefix(msg, "relay:") {
			t.Errorf("message %q repeats the package name", msg)
		}
		if rec["relay"] != "relay-a" || rec["outbox"] != "orders" {
			t.Errorf("record %s lacks relay=relay-a outbox=orders", line)
		}
		if strings.Count(line, `"relay":`) != 1 {
			t.Errorf("record %s says the relay more than once", line)
		}
		if msg == "batch published" {
			for _, k := range []string{"rows", "acknowledged", "publish_ms", "delete_ms"} {
				if _, ok := rec[k]; !ok {
					t.Errorf("batch line %s lacks %s", line, k)
				}
			}
			batches[rec["bucket"].(float64)] += rec["rows"].(float64)
		}
	}
	if batches[0] != 3 || batches[1] != 2 {
		t.Fatalf("DEBUG batch lines account for %v rows per bucket; want 3 in bucket 0 and 2 in bucket 1:\n%s", batches, buf.String())
	}
}
