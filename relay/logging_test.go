package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
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
			for _, k := range []string{"rows", "acknowledged", "fetch_ms", "publish_ms", "delete_ms"} {
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

// TestStoreOutageLogsBoundedLines: a database that is down for ten minutes
// (every store call fails, the relay retrying each second) leaves about one
// WARN line per minute per failing operation, the later ones saying how
// many times the failure repeated in between at DEBUG; when the database
// is back, one INFO line per operation says so, with the failures counted.
func TestStoreOutageLogsBoundedLines(t *testing.T) {
	var buf syncBuffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := newHarness(t, relay.Options{BucketCount: 4, Logger: logger}, nil)
	h.store.AddToBucket(0, msgs(2, "t")...)
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	h.waitIdle()

	down := []string{relaytest.OpAcquire, relaytest.OpFleet, relaytest.OpRenew, relaytest.OpRelease, relaytest.OpBucketsWithPending, relaytest.OpNextBatches, relaytest.OpMarkPublished}
	for _, op := range down {
		h.ops.failNext(op, 1<<30)
	}
	const outage = 10 * time.Minute
	for elapsed := time.Duration(0); elapsed < outage; elapsed += time.Second {
		h.advanceIdle(time.Second)
	}
	for _, op := range down {
		h.ops.failNext(op, -h.ops.remaining(op))
	}
	h.store.AddToBucket(1, msgs(1, "t")...)
	h.waitFor("the relay to deliver after the outage", func() bool {
		h.clock.Advance(time.Second)
		return h.store.Len() == 0
	})
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}

	type count struct{ warn, debug, repeated int }
	byMsg := map[string]*count{}
	var recovered []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		msg, _ := rec["msg"].(string)
		e, _ := rec["error"].(string)
		if !strings.Contains(e, "injected") {
			if strings.HasSuffix(msg, "succeeds again") || msg == "store answers again" {
				if n, _ := rec["failures"].(float64); n < 2 {
					t.Errorf("recovery line %s counts %v failures; want the outage's", line, rec["failures"])
				}
				recovered = append(recovered, msg)
			}
			continue
		}
		c := byMsg[msg]
		if c == nil {
			c = &count{}
			byMsg[msg] = c
		}
		switch rec["level"] {
		case "WARN":
			c.warn++
			if n, _ := rec["repeated"].(float64); n > 0 {
				c.repeated += int(n)
			}
		case "DEBUG":
			c.debug++
		default:
			t.Errorf("store failure logged at %v: %s", rec["level"], line)
		}
	}
	if len(byMsg) == 0 {
		t.Fatalf("no store failure was logged during the outage:\n%s", buf.String())
	}
	total := 0
	for msg, c := range byMsg {
		total += c.warn
		if max := int(outage/time.Minute) + 1; c.warn > max {
			t.Errorf("%q: %d WARN lines in a %v outage; want at most %d (one a minute)", msg, c.warn, outage, max)
		}
		if c.warn > 1 && c.repeated == 0 {
			t.Errorf("%q: %d WARN lines, none saying how often it repeated", msg, c.warn)
		}
		// the DEBUG lines after the last WARN line are not counted by
		// any: at most a minute's worth
		if c.repeated > c.debug || c.debug-c.repeated >= 60 {
			t.Errorf("%q: the WARN lines account for %d repeats of %d DEBUG lines", msg, c.repeated, c.debug)
		}
	}
	t.Logf("a %v outage: %d WARN lines in all; per message: %v", outage, total, func() map[string]count {
		m := map[string]count{}
		for k, v := range byMsg {
			m[k] = *v
		}
		return m
	}())
	if !slices.Contains(recovered, "acquire leases succeeds again") {
		t.Errorf("no INFO line said the lease acquisition recovered; recovery lines: %v", recovered)
	}
}

// TestBrokerOutageLogsOncePerKind: a broker that times out every publish
// for 30 s, each error naming its bucket and a new local port, then bucket
// 0's for 25 s more while bucket 1 publishes, leaves one WARN line (the
// others at DEBUG); when it is back, one INFO line says so, with the
// failures counted and how long they lasted.
func TestBrokerOutageLogsOncePerKind(t *testing.T) {
	var buf syncBuffer
	h := newHarness(t, relay.Options{BucketCount: 2, Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}, nil)
	h.store.AddToBucket(0, msgs(2, "t")...)
	h.store.AddToBucket(1, msgs(2, "t")...)
	var port atomic.Int32
	var oneBack atomic.Bool
	h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
		if oneBack.Load() && b[0].Bucket == 1 {
			return relay.Result{Acknowledged: len(b)}
		}
		return relay.Result{Err: fmt.Errorf("bucket %d: write tcp 127.0.0.1:%d->127.0.0.1:9092: i/o timeout", b[0].Bucket, 54000+port.Add(1))}
	})
	h.start()
	h.waitFor("the first failed publish", func() bool { return len(h.pub.Calls()) >= 1 })
	h.waitIdle()
	for i := range 55 {
		if i >= 30 {
			oneBack.Store(true)
			h.store.AddToBucket(1, msgs(1, "t")...)
		}
		h.advanceIdle(time.Second)
	}
	if n := len(h.pub.Acknowledged()); n < 20 {
		t.Fatalf("bucket 1 published %d rows while bucket 0 failed; want 20 or more", n)
	}
	h.pub.SetHandler(nil)
	h.waitFor("the relay to deliver after the outage", func() bool {
		h.clock.Advance(time.Second)
		return h.store.Len() == 0
	})
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	failed, recovered := logRecords(t, &buf, "publish failed; retrying the head row alone"), logRecords(t, &buf, "publishing succeeds again")
	warns := 0
	for _, rec := range failed {
		if rec["level"] == "WARN" {
			warns++
		}
	}
	if len(failed) < 10 || warns != 1 {
		t.Errorf("%d failed publishes logged, %d at WARN; want 10 or more, 1 at WARN:\n%s", len(failed), warns, buf.String())
	}
	if len(recovered) != 1 {
		t.Fatalf("%d recovery lines; want 1:\n%s", len(recovered), buf.String())
	}
	if rec := recovered[0]; rec["level"] != "INFO" || rec["failures"] != float64(len(failed)) || rec["failing_for"].(float64) < float64(55*time.Second) {
		t.Errorf("recovery line %v; want INFO, failures %d, failing_for 55s or more", rec, len(failed))
	}
}

// TestBucketStoreRecoveryIsLogged: a bucket whose fetch fails five times
// logs one INFO line when its batch goes through, counting the failures.
func TestBucketStoreRecoveryIsLogged(t *testing.T) {
	var buf syncBuffer
	h := newHarness(t, relay.Options{BucketCount: 1, Logger: slog.New(slog.NewJSONHandler(&buf, nil))}, nil)
	h.ops.failNext(relaytest.OpNextBatches, 5)
	h.store.AddToBucket(0, msgs(1, "t")...)
	h.start()
	h.waitFor("the relay to deliver after the failures", func() bool {
		h.clock.Advance(time.Second)
		return h.store.Len() == 0
	})
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	if recs := logRecords(t, &buf, "bucket store succeeds again"); len(recs) != 1 || recs[0]["failures"] != float64(5) {
		t.Fatalf("recovery lines %v; want one counting 5 failures:\n%s", recs, buf.String())
	}
}

// logRecords returns the JSON records of buf whose message is msg.
func logRecords(t *testing.T, buf *syncBuffer, msg string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == msg {
			recs = append(recs, rec)
		}
	}
	return recs
}

// TestOwnedBucketsAreLoggedAsRanges: the "owned buckets changed" line
// writes the buckets as ranges, at most 16 of them, so that a relay owning
// 65,536 buckets logs a short line (it was one of 350 KB).
func TestOwnedBucketsAreLoggedAsRanges(t *testing.T) {
	all := make([]int, 65536)
	for i := range all {
		all[i] = i
	}
	var every2 []int
	for i := 0; i < 100; i += 2 {
		every2 = append(every2, i)
	}
	for _, tc := range []struct {
		buckets []int
		want    string
	}{
		{nil, ""},
		{[]int{5}, "5"},
		{[]int{0, 1, 2, 3, 8, 10, 11, 12}, "0-3,8,10-12"},
		{all, "0-65535"},
		{every2, "0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,…"},
	} {
		if got := relay.BucketRanges(tc.buckets, 16); got != tc.want {
			t.Errorf("BucketRanges(%d buckets) = %q; want %q", len(tc.buckets), got, tc.want)
		}
	}
}
