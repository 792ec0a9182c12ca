package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// faultyBuckets is a MemStore whose NextBatches and MarkPublished fail for
// chosen buckets, counting the failures; concurrent serves several buckets
// at once (see concurrentStore).
type faultyBuckets struct {
	*relaytest.MemStore
	many bool

	mu       sync.Mutex
	next     map[int]error // bucket → NextBatch error
	mark     map[int]int   // bucket → remaining MarkPublished failures
	failures map[int]int   // bucket → injected failures so far
}

func newFaultyBuckets(m *relaytest.MemStore, concurrent bool) *faultyBuckets {
	return &faultyBuckets{MemStore: m, many: concurrent, next: map[int]error{}, mark: map[int]int{}, failures: map[int]int{}}
}

func (f *faultyBuckets) concurrent() bool { return f.many }

func (f *faultyBuckets) setNext(b int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next[b] = err
}

func (f *faultyBuckets) failMark(b, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mark[b] += n
}

func (f *faultyBuckets) failed(b int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failures[b]
}

// NextBatches fails when a requested bucket is faulty; only a fetch of
// one bucket counts among its failures (failed): the relay fetches each
// bucket of a failed group alone, at once, and logs only these.
func (f *faultyBuckets) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	f.mu.Lock()
	for _, req := range reqs {
		for _, b := range req.Buckets {
			if err := f.next[b]; err != nil {
				if len(reqs) == 1 && len(req.Buckets) == 1 {
					f.failures[b]++
				}
				f.mu.Unlock()
				return nil, err
			}
		}
	}
	f.mu.Unlock()
	return f.MemStore.NextBatches(ctx, reqs)
}

// MarkPublished fails, and counts a failure, for each faulty bucket of ms
// (in one call, the first one's error).
func (f *faultyBuckets) MarkPublished(ctx context.Context, ms []*outbox.Message) error {
	for _, m := range ms {
		if err := f.markFault(int(m.Bucket)); err != nil {
			return err
		}
	}
	return f.MemStore.MarkPublished(ctx, ms)
}

func (f *faultyBuckets) markFault(b int) error {
	f.mu.Lock()
	fail := f.mark[b] > 0
	if fail {
		f.mark[b]--
		f.failures[b]++
	}
	f.mu.Unlock()
	if fail {
		return fmt.Errorf("bucket %d: lock wait timeout exceeded", b)
	}
	return nil
}

// publishedIDs returns the ids of the published records of bucket b, in
// publish order.
func publishedIDs(calls [][]*outbox.Message, b int) []int64 {
	var out []int64
	for _, c := range calls {
		for _, m := range c {
			if int(m.Bucket) == b {
				out = append(out, m.ID)
			}
		}
	}
	return out
}

// TestBucketStoreErrorIsContained: a store error reading one bucket (a row
// it cannot decode, say) backs off that bucket alone: the other buckets
// publish, the relay stays healthy, the failing bucket is retried with a
// growing backoff and a line per retry naming it (WARN the first time and
// once a minute, DEBUG in between), and once the error
// goes away its rows publish in order. With buckets served one at a time
// and several at once.
func TestBucketStoreErrorIsContained(t *testing.T) {
	for _, tc := range []struct {
		bad        int
		concurrent bool
	}{{0, false}, {0, true}, {4, true}} {
		bad, concurrent := tc.bad, tc.concurrent
		t.Run(fmt.Sprintf("bucket=%d/concurrent=%v", bad, concurrent), func(t *testing.T) {
			var f *faultyBuckets
			logs := &recorder{}
			h := newHarness(t, relay.Options{BatchSize: 3, Logger: slog.New(logs)}, func(m *relaytest.MemStore) relay.Store {
				f = newFaultyBuckets(m, concurrent)
				return f
			})
			for b := range relay.DefaultBucketCount {
				h.store.AddToBucket(b, msgs(5, fmt.Sprintf("t%d", b))...)
			}
			wantBad := ids(h.store.Pending(bad))
			corrupt := errors.New(`corrupt row: headers: unknown codec version 9`)
			f.setNext(bad, corrupt)
			h.start()
			h.waitFor("the other buckets published", func() bool { return h.store.Len() == 5 })
			h.waitIdle()
			if err := h.r.Health(); err != nil {
				t.Fatalf("Health() while bucket %d fails = %v; want nil (a bucket's store error is not the relay's)", bad, err)
			}
			if got := publishedIDs(h.pub.Calls(), bad); len(got) != 0 {
				t.Fatalf("bucket %d published %v while its fetch fails", bad, got)
			}

			// One minute of failing: the backoff grows to LeaseRenewInterval
			// (10s), so the bucket is tried about 10 times, once per WARN line.
			for range 60 {
				h.advanceIdle(time.Second)
			}
			tries := f.failed(bad)
			warns := logs.matching(slog.LevelWarn, "bucket store error")
			lines := append(warns, logs.matching(slog.LevelDebug, "bucket store error")...)
			if tries < 5 || tries > 14 {
				t.Fatalf("bucket %d fetched %d times in a minute of failures; want about 10 (exponential backoff up to 10s)", bad, tries)
			}
			// a line per backoff step: WARN for the first and then at most
			// once a minute for the same error, DEBUG in between
			if len(lines) != tries || len(warns) < 1 || len(warns) > 2 {
				t.Fatalf("%d lines (%d WARN) for %d failed fetches; want one per backoff step, one or two at WARN", len(lines), len(warns), tries)
			}
			for _, w := range lines {
				if v, ok := attr(w, "bucket"); !ok || v.Int64() != int64(bad) {
					t.Fatalf("WARN line %q names bucket %v; want %d", w.Message, v, bad)
				}
				if v, ok := attr(w, "error"); !ok || !errorContains(v, "unknown codec version 9") {
					t.Fatalf("WARN line %q has error %v; want the store's error", w.Message, v)
				}
			}

			// The other buckets keep flowing: new rows publish at once.
			other := (bad + 3) % relay.DefaultBucketCount
			h.store.AddToBucket(other, msgs(2, "later")...)
			h.r.Notifier().NotifyBucket(other)
			h.waitFor("new rows of another bucket", func() bool { return len(h.store.Pending(other)) == 0 })
			if err := h.r.Health(); err != nil {
				t.Fatalf("Health() = %v; want nil", err)
			}

			// The bucket recovers: its rows publish, in id order, once each.
			f.setNext(bad, nil)
			for i := 0; len(h.store.Pending(bad)) > 0; i++ {
				if i == 30 {
					t.Fatalf("bucket %d still pending after the error went away: %v", bad, ids(h.store.Pending(bad)))
				}
				h.advanceIdle(time.Second)
			}
			if got := publishedIDs(h.pub.Calls(), bad); !slices.Equal(got, wantBad) {
				t.Fatalf("bucket %d published %v; want %v", bad, got, wantBad)
			}
			for b := range relay.DefaultBucketCount {
				if b == bad {
					continue
				}
				if got := len(publishedIDs(h.pub.Calls(), b)); got != 5+2*boolInt(b == other) {
					t.Fatalf("bucket %d published %d records; want each once", b, got)
				}
			}
		})
	}
}

// TestBucketDeleteErrorIsContained: a failed delete (MarkPublished) of one
// bucket backs off that bucket alone, the other buckets drain meanwhile, and
// the acknowledged rows are deleted again, not published again.
func TestBucketDeleteErrorIsContained(t *testing.T) {
	for _, concurrent := range []bool{false, true} {
		t.Run(fmt.Sprintf("concurrent=%v", concurrent), func(t *testing.T) {
			var f *faultyBuckets
			h := newHarness(t, relay.Options{BatchSize: 2}, func(m *relaytest.MemStore) relay.Store {
				f = newFaultyBuckets(m, concurrent)
				return f
			})
			for b := range relay.DefaultBucketCount {
				h.store.AddToBucket(b, msgs(4, "t")...)
			}
			f.failMark(2, 3)
			h.start()
			// The cycle that drained them ends after its deletes: wait for
			// it too. A relay unhealthy over one bucket's deletes never gets
			// there.
			h.waitFor("all buckets but 2 drained, the relay healthy", func() bool {
				return h.store.Len() == len(h.store.Pending(2)) && h.r.Health() == nil
			})
			for i := 0; h.store.Len() > 0; i++ {
				if i == 30 {
					t.Fatalf("bucket 2 still pending: %v", ids(h.store.Pending(2)))
				}
				h.advanceIdle(time.Second)
			}
			if f.failed(2) != 3 {
				t.Fatalf("injected delete failures = %d; want 3", f.failed(2))
			}
			for b := range relay.DefaultBucketCount {
				got := publishedIDs(h.pub.Calls(), b)
				if len(got) != 4 || !slices.IsSorted(got) {
					t.Fatalf("bucket %d published %v; want its 4 rows once each, in order", b, got)
				}
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func errorContains(v slog.Value, substr string) bool {
	return strings.Contains(v.String(), substr)
}

// TestHealthWhenEveryBucketFails: bucket store errors are not the relay's
// unless every owned bucket is backing off from one (the store fails all of
// the relay's work): then Health wraps one, until a bucket recovers.
func TestHealthWhenEveryBucketFails(t *testing.T) {
	var f *faultyBuckets
	h := newHarness(t, relay.Options{BucketCount: 2}, func(m *relaytest.MemStore) relay.Store {
		f = newFaultyBuckets(m, false)
		return f
	})
	h.store.AddToBucket(0, msgs(2, "t")...)
	h.store.AddToBucket(1, msgs(2, "t")...)
	locked := errors.New("lock wait timeout exceeded")
	f.setNext(0, locked)
	f.setNext(1, locked)
	h.start()
	h.waitIdle()
	if err := h.r.Health(); !errors.Is(err, locked) || !strings.Contains(err.Error(), "every owned bucket") {
		t.Fatalf("Health() while every bucket fails = %v; want an error wrapping the store's", err)
	}
	f.setNext(1, nil)
	for i := 0; len(h.store.Pending(1)) > 0; i++ {
		if i == 30 {
			t.Fatal("bucket 1 still pending after its error went away")
		}
		h.advanceIdle(time.Second)
	}
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() with bucket 1 recovered = %v; want nil (bucket 0's error is its own)", err)
	}
	if got := len(h.store.Pending(0)); got != 2 {
		t.Fatalf("bucket 0 pending = %d; want 2 (kept)", got)
	}
}

// TestHeadOldestAgeMetric: outbox.head.oldest_age reports how long the
// longest-failing head row of the owned buckets has been failing (a
// bucket's store error or a failing publish), 0 when none is.
func TestHeadOldestAgeMetric(t *testing.T) {
	reader := metrictest.NewReader()
	var f *faultyBuckets
	h := newHarness(t, relay.Options{BucketCount: 2, MeterProvider: reader.MeterProvider()}, func(m *relaytest.MemStore) relay.Store {
		f = newFaultyBuckets(m, false)
		return f
	})
	age := func() float64 {
		t.Helper()
		v, ok := reader.Read(t).Values[relay.MetricHeadOldestAge]
		if !ok {
			t.Fatalf("%s not reported", relay.MetricHeadOldestAge)
		}
		return v
	}
	var failing atomic.Bool
	h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
		if b[0].Bucket == 1 && failing.Load() {
			return relay.Result{Err: errBroker}
		}
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	h.waitIdle()
	if got := age(); got != 0 {
		t.Fatalf("%s with nothing failing = %v; want 0", relay.MetricHeadOldestAge, got)
	}

	// Bucket 0's fetch fails from t0 on.
	f.setNext(0, errors.New("corrupt row"))
	h.store.AddToBucket(0, msgs(2, "t")...)
	h.r.Notifier().NotifyBucket(0)
	h.waitFor("bucket 0's failure", func() bool { return f.failed(0) == 1 })
	h.waitIdle()
	failed0 := h.clock.Now()
	for range 30 {
		h.advanceIdle(time.Second)
	}
	if got, want := age(), h.clock.Now().Sub(failed0).Seconds(); got != want {
		t.Fatalf("%s with bucket 0 failing = %v; want %v", relay.MetricHeadOldestAge, got, want)
	}

	// Bucket 1's head row fails to publish 30s later: the max stays bucket 0's.
	failing.Store(true)
	h.store.AddToBucket(1, msgs(2, "t")...)
	h.r.Notifier().NotifyBucket(1)
	h.waitFor("bucket 1's failed publish", func() bool { return len(h.pub.Calls()) == 1 })
	h.waitIdle()
	failed1 := h.clock.Now()
	h.advanceIdle(time.Second)
	if got, want := age(), h.clock.Now().Sub(failed0).Seconds(); got != want {
		t.Fatalf("%s with buckets 0 and 1 failing = %v; want %v (bucket 0's)", relay.MetricHeadOldestAge, got, want)
	}

	// Bucket 0 recovers: bucket 1's age remains.
	f.setNext(0, nil)
	for i := 0; len(h.store.Pending(0)) > 0; i++ {
		if i == 30 {
			t.Fatal("bucket 0 still pending")
		}
		h.advanceIdle(time.Second)
	}
	if got, want := age(), h.clock.Now().Sub(failed1).Seconds(); got != want {
		t.Fatalf("%s with bucket 1 failing = %v; want %v", relay.MetricHeadOldestAge, got, want)
	}

	// Bucket 1 recovers: nothing is failing.
	failing.Store(false)
	for i := 0; h.store.Len() > 0; i++ {
		if i == 30 {
			t.Fatal("bucket 1 still pending")
		}
		h.advanceIdle(time.Second)
	}
	h.advanceIdle(time.Second)
	if got := age(); got != 0 {
		t.Fatalf("%s after recovery = %v; want 0", relay.MetricHeadOldestAge, got)
	}
}
