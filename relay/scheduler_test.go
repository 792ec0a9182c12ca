package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/metrictest"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// concurrentStore is a MemStore whose relay serves several buckets at once:
// the harness sets Options.SingleWriter for any other store.
type concurrentStore struct{ *relaytest.MemStore }

func (concurrentStore) concurrent() bool { return true }

func asConcurrent(m *relaytest.MemStore) relay.Store { return concurrentStore{m} }

// checkPublishedOnce fails unless every row of want was published exactly
// once, each bucket's rows in id order, and nothing else was published.
func checkPublishedOnce(t *testing.T, calls [][]*outbox.Message, want int) {
	t.Helper()
	seen := map[int64]bool{}
	last := map[int32]int64{}
	for _, call := range calls {
		for _, m := range call {
			if seen[m.ID] {
				t.Fatalf("row %d published twice", m.ID)
			}
			seen[m.ID] = true
			if m.ID < last[m.Bucket] {
				t.Fatalf("bucket %d: row %d published after row %d; want id order", m.Bucket, m.ID, last[m.Bucket])
			}
			last[m.Bucket] = m.ID
		}
	}
	if len(seen) != want {
		t.Fatalf("published %d rows; want %d", len(seen), want)
	}
}

// TestLeaseRenewedDuringLongSweep: a sweep over many buckets whose every
// NextBatch and MarkPublished takes a second of the (manual) clock lasts far
// longer than the 30 s lease; the renewal goroutine keeps the leases meanwhile,
// so they are never lost, the store never sees them expire, and every row is
// published once. Both for a store called one call at a time (the renewal
// waits for the store call in progress, then goes first) and for a
// concurrent store served four buckets at once.
func TestLeaseRenewedDuringLongSweep(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(*relaytest.MemStore) relay.Store
	}{
		{"serial_store", nil},
		{"concurrent_store", asConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const buckets, rows = 16, 3
			reader := metrictest.NewReader()
			h := newHarness(t, relay.Options{BucketCount: buckets, BatchSize: 1, MeterProvider: reader.MeterProvider()}, tc.wrap)
			for b := range buckets {
				h.store.AddToBucket(b, msgs(rows, "t")...)
			}
			var mu sync.Mutex
			var lapses []string
			h.store.SetHook(func(ctx context.Context, op string) error {
				if err := h.ops.hook(ctx, op); err != nil {
					return err
				}
				if op != relaytest.OpNextBatches && op != relaytest.OpMarkPublished {
					return nil
				}
				if owners := h.store.Owners(); len(owners) > 0 && len(owners) != buckets {
					mu.Lock()
					lapses = append(lapses, fmt.Sprintf("at +%v the store holds %d leases; want %d", h.clock.Now().Sub(t0), len(owners), buckets))
					mu.Unlock()
				}
				h.advanceInStoreCall(time.Second) // a slow database
				return nil
			})
			h.start()
			h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
			mu.Lock()
			defer mu.Unlock()
			if len(lapses) > 0 {
				t.Fatalf("leases lapsed during the sweep: %v", lapses)
			}
			span := h.clock.Now().Sub(t0)
			if span < 3*relay.DefaultLeaseDuration {
				t.Fatalf("the work took %v of the clock; want several lease durations", span)
			}
			if got := reader.Read(t).Values[relay.MetricLeaseExpirations]; got != 0 {
				t.Fatalf("%s = %v; want 0", relay.MetricLeaseExpirations, got)
			}
			if n := h.ops.count(relaytest.OpRenew); n < int(span/relay.DefaultLeaseDuration) {
				t.Fatalf("%d renewals over %v; want them every renew interval while working", n, span)
			}
			checkPublishedOnce(t, h.pub.Calls(), buckets*rows)
			t.Logf("%v of work, %d renewals, %d acquisitions", span, h.ops.count(relaytest.OpRenew), h.ops.count(relaytest.OpAcquire))
		})
	}
}

// TestDefaultConcurrencyFollowsTheShareOfBuckets: with MaxConcurrentBuckets
// left at its default a relay serves as many batches at once as it would
// on the default 8 buckets owning the same share of them (four relays on
// 1,024 buckets: two each, not four), so that a fleet's load on the
// database does not grow with BucketCount; a MaxConcurrentBuckets set is
// kept whatever the share.
func TestDefaultConcurrencyFollowsTheShareOfBuckets(t *testing.T) {
	for _, tc := range []struct {
		buckets, set, owned, want int
	}{
		{8, 0, 8, relay.DefaultMaxConcurrentBuckets}, // one relay
		{8, 0, 2, 2}, // four relays: two buckets each
		{1024, 0, 1024, relay.DefaultMaxConcurrentBuckets},
		{1024, 0, 512, relay.DefaultMaxConcurrentBuckets}, // two relays
		{1024, 0, 256, 2}, // four relays
		{1024, 0, 342, 3}, // three relays
		{1024, 0, 128, 1}, // eight relays
		{1024, 0, 0, 1},
		{1024, 4, 256, 4}, // set: kept
		{1024, 16, 128, 16},
	} {
		h := newHarness(t, relay.Options{BucketCount: tc.buckets, MaxConcurrentBuckets: tc.set}, asConcurrent)
		if got := relay.Workers(h.r, tc.owned); got != tc.want {
			t.Errorf("BucketCount %d, MaxConcurrentBuckets %d, owning %d: %d batches at once; want %d", tc.buckets, tc.set, tc.owned, got, tc.want)
		}
	}
}

// TestConcurrentBucketsKeepOrder: a concurrent store's buckets are served
// several at once (never more than MaxConcurrentBuckets), by a publisher of
// random latency, and each bucket's rows are still published in id order,
// each once, and deleted.
func TestConcurrentBucketsKeepOrder(t *testing.T) {
	const buckets, rows, workers = 16, 40, 4
	h := newHarness(t, relay.Options{BucketCount: buckets, BatchSize: 3, MaxConcurrentBuckets: workers}, asConcurrent)
	if got := relay.Workers(h.r, buckets); got != workers {
		t.Fatalf("workers = %d; want %d", got, workers)
	}
	for b := range buckets {
		h.store.AddToBucket(b, msgs(rows, "t")...)
	}
	var inFlight, most atomic.Int32
	overlap := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if n >= 2 {
			once.Do(func() { close(overlap) })
		}
		// The first publishes wait for a second one to overlap them.
		select {
		case <-overlap:
		case <-time.After(waitLimit):
		}
		mu.Lock()
		yields := rng.IntN(200)
		fail := rng.IntN(10) == 0
		mu.Unlock()
		for range yields { // random latency
			runtime.Gosched()
		}
		if fail && len(b) > 1 {
			return relay.Result{Acknowledged: len(b) / 2, Err: errBroker}
		}
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	for h.store.Len() > 0 {
		h.advanceIdle(relay.DefaultErrorBackoff) // failed batches back off
	}
	if m := most.Load(); m < 2 || m > workers {
		t.Fatalf("at most %d publishes in flight at once; want 2 to %d", m, workers)
	}
	acked := map[int64]int{}
	last := map[int32]int64{}
	for _, m := range h.pub.Acknowledged() {
		acked[m.ID]++
		if acked[m.ID] > 1 {
			t.Fatalf("row %d acknowledged twice", m.ID)
		}
		if m.ID < last[m.Bucket] {
			t.Fatalf("bucket %d: row %d acknowledged after row %d; want id order", m.Bucket, m.ID, last[m.Bucket])
		}
		last[m.Bucket] = m.ID
	}
	if len(acked) != buckets*rows {
		t.Fatalf("acknowledged %d rows; want %d", len(acked), buckets*rows)
	}
	t.Logf("%d publish calls, at most %d in flight", len(h.pub.Calls()), most.Load())
}

// lostRenewal is a concurrent MemStore whose renewals report the leases
// lost once lose is set.
type lostRenewal struct {
	concurrentStore
	lose atomic.Bool
	lost atomic.Int32 // renewals answered false
}

func (l *lostRenewal) RenewBucketLeases(ctx context.Context, id string, b []int, d time.Duration) (bool, error) {
	if l.lose.Load() {
		l.lost.Add(1)
		return false, nil
	}
	return l.MemStore.RenewBucketLeases(ctx, id, b, d)
}

// TestConcurrentHintedBucketNotHeldBySlowBucket: while one bucket's publish
// hangs, rows committed to another bucket are published at once on their
// hint, batch after batch: a free worker takes the next ready bucket without
// waiting for the slow one (no sweep-wide barrier), so a row waits for about
// one batch of its own bucket, not for the slowest bucket of the relay.
func TestConcurrentHintedBucketNotHeldBySlowBucket(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 2, MaxConcurrentBuckets: 2}, asConcurrent)
	release := make(chan struct{})
	hung := make(chan struct{})
	var once sync.Once
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		if b[0].Bucket == 0 {
			once.Do(func() { close(hung) })
			<-release
		}
		return relay.Result{Acknowledged: len(b)}
	})
	h.store.AddToBucket(0, msgs(1, "slow")...)
	h.start()
	select {
	case <-hung:
	case <-time.After(waitLimit):
		t.Fatal("bucket 0 was not published")
	}
	for round := range 3 {
		h.store.AddToBucket(1, msgs(2, "fast")...)
		h.r.Notifier().NotifyBucket(1)
		h.waitFor(fmt.Sprintf("round %d: bucket 1 published and deleted while bucket 0 hangs", round), func() bool {
			return h.store.Len() == 1 // only bucket 0's row is left
		})
	}
	close(release)
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	checkPublishedOnce(t, h.pub.Calls(), 7)
}

// TestConcurrentLeaseLostMidFlight: with four publishes in flight, a
// renewal reports the leases lost; none of the four batches is deleted
// (they are published again under the reacquired leases).
func TestConcurrentLeaseLostMidFlight(t *testing.T) {
	var ls *lostRenewal
	h := newHarness(t, relay.Options{BucketCount: 4, MaxConcurrentBuckets: 4}, func(m *relaytest.MemStore) relay.Store {
		ls = &lostRenewal{concurrentStore: concurrentStore{m}}
		return ls
	})
	for b := range 4 {
		h.store.AddToBucket(b, msgs(2, "t")...)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var first atomic.Int32
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		if first.Add(1) <= 4 {
			<-release
		}
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if !h.pub.WaitCalls(ctx, 4) {
		t.Fatal("four publishes did not start")
	}
	ls.lose.Store(true)
	h.clock.WaitForWaiters(ctx, 1) // the renewal timer
	h.clock.Advance(relay.DefaultLeaseRenewInterval)
	h.waitFor("the renewal", func() bool { return ls.lost.Load() >= 1 })
	marks := h.ops.count(relaytest.OpMarkPublished)
	ls.lose.Store(false)
	releaseOnce.Do(func() { close(release) })
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	if marks != 0 {
		t.Fatalf("MarkPublished calls before the release = %d; want 0", marks)
	}
	calls := h.pub.Calls()
	if len(calls) < 8 {
		t.Fatalf("publish calls = %d; want the 4 batches published under the lost leases published again", len(calls))
	}
	again := map[int64]bool{}
	for _, c := range calls[4:] {
		for _, m := range c {
			again[m.ID] = true
		}
	}
	for _, c := range calls[:4] {
		for _, m := range c {
			if !again[m.ID] {
				t.Fatalf("row %d, published under the lost leases, was deleted; want it published again", m.ID)
			}
		}
	}
}

// TestConcurrentFailingBucketBacksOffAlone: bucket 0's head row fails and
// backs off while the other buckets are served, concurrently, to the end;
// the head row is retried alone after its backoff.
func TestConcurrentFailingBucketBacksOffAlone(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 4, BatchSize: 2, ErrorBackoff: time.Second}, asConcurrent)
	poison := msgs(3, "poison")
	h.store.AddToBucket(0, poison...)
	for b := 1; b < 4; b++ {
		h.store.AddToBucket(b, msgs(10, "healthy")...)
	}
	var healed atomic.Bool
	h.pub.SetHandler(relaytest.FailWhere(func(m *outbox.Message) error {
		if m.ID == poison[0].ID && !healed.Load() {
			return errBroker
		}
		return nil
	}))
	poisonCalls := func() (n int) {
		for _, c := range h.pub.Calls() {
			if c[0].Bucket == 0 {
				n++
			}
		}
		return n
	}
	h.start()
	// Bucket 0's first publish may come after the others drained (the
	// sweep serves the ready buckets in any order): wait for both.
	h.waitFor("the healthy buckets drained and bucket 0 tried", func() bool { return h.store.Len() == 3 && poisonCalls() > 0 })
	if poisonCalls := poisonCalls(); poisonCalls != 1 {
		t.Fatalf("publishes of bucket 0 before its backoff elapsed = %d; want 1", poisonCalls)
	}
	healed.Store(true)
	// The jittered backoff is at most ErrorBackoff (1 s). The relay may not
	// be waiting on its timer yet: move the clock in steps until the row
	// went out, rather than once before the timer exists.
	h.waitFor("store empty", func() bool {
		if h.store.Len() == 0 {
			return true
		}
		h.clock.Advance(10 * time.Millisecond)
		return false
	})
	var zero [][]*outbox.Message
	for _, c := range h.pub.Calls() {
		if c[0].Bucket == 0 {
			zero = append(zero, c)
		}
	}
	if len(zero) < 2 || len(zero[1]) != 1 || zero[1][0].ID != poison[0].ID {
		t.Fatalf("bucket 0's publishes %v; want the head row %d retried alone", zero, poison[0].ID)
	}
}

// TestConcurrentStopAwaitsInflightPublishes: a stop while three buckets'
// publishes are in flight waits for all of them, marks them, and returns.
func TestConcurrentStopAwaitsInflightPublishes(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 3}, asConcurrent)
	for b := range 3 {
		h.store.AddToBucket(b, msgs(2, "t")...)
	}
	release := make(chan struct{})
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		<-release
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if !h.pub.WaitCalls(ctx, 3) {
		t.Fatal("three publishes did not start")
	}
	h.cancel()
	// Parked: the renewal timer and the stop budget's timer.
	if !h.clock.WaitForWaiters(ctx, 2) {
		t.Fatal("no stop budget timer")
	}
	select {
	case err := <-h.done:
		t.Fatalf("Run returned %v with three publishes in flight", err)
	default:
	}
	close(release)
	if err := h.stop(); err != nil {
		t.Fatalf("Run = %v; want nil", err)
	}
	if got := h.store.Len(); got != 0 {
		t.Fatalf("pending after the stop = %d; want 0 (the in-flight batches marked)", got)
	}
	if got := h.ops.count(relaytest.OpRelease); got != 1 {
		t.Fatalf("ReleaseBucketLeases calls = %d; want 1", got)
	}
}

// heldFetch is a concurrent MemStore whose fetch of bucket 1 waits for
// hold to be closed.
type heldFetch struct {
	concurrentStore
	hold chan struct{}
}

func (s heldFetch) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	if slices.Contains(reqs[0].Buckets, 1) {
		<-s.hold
	}
	return s.MemStore.NextBatches(ctx, reqs)
}

// TestStalledIsTheOldestPublish: with two publishes in flight, started
// 3 s apart, the stalled gauge reports the older one's age.
func TestStalledIsTheOldestPublish(t *testing.T) {
	reader := metrictest.NewReader()
	hold := make(chan struct{})
	h := newHarness(t, relay.Options{BucketCount: 2, MeterProvider: reader.MeterProvider()}, func(m *relaytest.MemStore) relay.Store {
		return heldFetch{concurrentStore{m}, hold}
	})
	h.store.AddToBucket(0, msgs(1, "t")...)
	h.store.AddToBucket(1, msgs(1, "t")...)
	started := make(chan int32, 2)
	releases := []chan struct{}{make(chan struct{}), make(chan struct{})}
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		started <- b[0].Bucket
		<-releases[b[0].Bucket]
		return relay.Result{Acknowledged: len(b)}
	})
	age := func() float64 { return reader.Read(t).Values[relay.MetricPublishStalled] }
	h.start()
	if b := <-started; b != 0 {
		t.Fatalf("first publish of bucket %d; want 0", b)
	}
	h.clock.Advance(3 * time.Second) // less than the renew interval
	close(hold)
	<-started
	h.clock.Advance(2 * time.Second)
	if got := age(); got != 5 {
		t.Fatalf("stalled with publishes 5 s and 2 s old = %v; want 5", got)
	}
	close(releases[0])
	h.waitFor("bucket 0 marked", func() bool { return len(h.store.Pending(0)) == 0 })
	if got := age(); got != 2 {
		t.Fatalf("stalled with one publish 2 s old = %v; want 2", got)
	}
	close(releases[1])
	h.waitFor("age back to 0", func() bool { return age() == 0 })
}

// TestMaxConcurrentBucketsOneIsSequential: a concurrent store with
// MaxConcurrentBuckets 1 never has two publishes in flight.
func TestMaxConcurrentBucketsOneIsSequential(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 4, BatchSize: 2, MaxConcurrentBuckets: 1}, asConcurrent)
	for b := range 4 {
		h.store.AddToBucket(b, msgs(6, "t")...)
	}
	var inFlight atomic.Int32
	var overlapped atomic.Bool
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		if inFlight.Add(1) > 1 {
			overlapped.Store(true)
		}
		runtime.Gosched()
		inFlight.Add(-1)
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	if overlapped.Load() {
		t.Fatal("two publishes overlapped with MaxConcurrentBuckets 1")
	}
	calls := h.pub.Calls()
	if got := bucketsOf(calls[:4]); !slices.Equal(got, []int32{0, 1, 2, 3}) {
		t.Fatalf("first sweep served buckets %v; want 0, 1, 2, 3 in order", got)
	}
	checkPublishedOnce(t, calls, 24)
}

func TestNegativeNewOptions(t *testing.T) {
	for _, o := range []relay.Options{{MaxConcurrentBuckets: -1}, {MaxBatchBytes: -1}} {
		if _, err := relay.New(relaytest.NewMemStore(8, nil), relaytest.NewPublisher(), o); err == nil {
			t.Errorf("New(%+v) = nil error; want one", o)
		}
	}
}

// TestConcurrentSweepProgressesWhenDiscoveryOutlastsThePollInterval: with
// tens of thousands of buckets a discovery takes longer than PollInterval
// (about 1.2 s for 65,536 buckets on PostgreSQL), so the next one is due as
// soon as it ends. A concurrent sweep must still serve every bucket that
// was ready at its start before a due discovery ends it; it used to stop
// before its first dispatch whenever an owned bucket was idle, and the
// relay discovered forever and published nothing. Here every discovery
// takes two poll intervals of the manual clock and half the buckets are
// empty: every row is published once, in order, with a few discoveries.
func TestConcurrentSweepProgressesWhenDiscoveryOutlastsThePollInterval(t *testing.T) {
	const buckets, rows = 64, 3
	h := newHarness(t, relay.Options{BucketCount: buckets, BatchSize: 1}, asConcurrent)
	for b := 0; b < buckets; b += 2 {
		h.store.AddToBucket(b, msgs(rows, "t")...)
	}
	h.store.SetHook(func(ctx context.Context, op string) error {
		if err := h.ops.hook(ctx, op); err != nil {
			return err
		}
		if op != relaytest.OpBucketsWithPending {
			return nil
		}
		h.advanceInStoreCall(2 * relay.DefaultPollInterval) // a discovery slower than the poll interval
		return nil
	})
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	checkPublishedOnce(t, h.pub.Calls(), buckets/2*rows)
	if n := h.ops.count(relaytest.OpBucketsWithPending); n > 4*rows {
		t.Fatalf("%d discoveries for %d rows per bucket; want about one per sweep", n, rows)
	}
}

// TestSlowDiscoveryRestsThreeTimesItsDuration: a discovery slower than a
// quarter of PollInterval (here two poll intervals of the manual clock, as
// 65,536 buckets take on a real database) is followed by a rest of three
// times its duration, so an idle relay spends at most a quarter of its time
// discovering; it used to start the next discovery as soon as one ended,
// keeping the database busy (0.7 of a PostgreSQL core at 65,536 buckets).
func TestSlowDiscoveryRestsThreeTimesItsDuration(t *testing.T) {
	const took = 2 * relay.DefaultPollInterval
	h := newHarness(t, relay.Options{BucketCount: 8}, nil)
	var mu sync.Mutex
	var starts []time.Time
	h.store.SetHook(func(ctx context.Context, op string) error {
		if err := h.ops.hook(ctx, op); err != nil {
			return err
		}
		if op == relaytest.OpBucketsWithPending {
			mu.Lock()
			starts = append(starts, h.clock.Now())
			mu.Unlock()
			h.advanceInStoreCall(took)
		}
		return nil
	})
	h.start()
	h.waitIdle()
	for h.clock.Now().Sub(t0) < time.Minute {
		next, ok := h.clock.NextDeadline()
		if !ok {
			t.Fatal("the idle relay waits on no timer")
		}
		h.advanceIdle(next.Sub(h.clock.Now())) // to the relay's next wake-up
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d discoveries in a minute of the clock", len(starts))
	if len(starts) < 3 {
		t.Fatalf("%d discoveries in a minute; want them to go on", len(starts))
	}
	for i := 1; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-1]); gap < 4*took {
			t.Fatalf("discovery %d started %v after the previous one, which took %v; want at least %v (the discovery and three times its duration)", i, gap, took, 4*took)
		}
	}
}

// TestHintedRowsPublishWhileADiscoveryRuns: a discovery runs beside the
// sweep's batches, not before them: while one is still walking the buckets
// (65,536 buckets: about a second of index probes, every PollInterval
// during a backlog), rows of a hinted bucket are published, and the
// buckets the discovery finds are served once it answers. The cycle used
// to discover first, so every row waited for the walk.
func TestHintedRowsPublishWhileADiscoveryRuns(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 8}, asConcurrent)
	var armed atomic.Bool
	entered, release := make(chan struct{}, 1), make(chan struct{})
	h.store.SetHook(func(ctx context.Context, op string) error {
		if err := h.ops.hook(ctx, op); err != nil {
			return err
		}
		if op == relaytest.OpBucketsWithPending && armed.CompareAndSwap(true, false) {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	h.start()
	h.waitIdle()
	armed.Store(true)
	h.store.AddToBucket(5, msgs(3, "unannounced")...)
	h.drainIdle()
	h.clock.Advance(relay.DefaultPollInterval) // the discovery is due: it starts, and waits
	select {
	case <-entered:
	case <-time.After(waitLimit):
		t.Fatal("no discovery PollInterval after the last one")
	}
	h.store.AddToBucket(2, msgs(2, "hinted")...)
	h.r.Notifier().NotifyBucket(2)
	h.waitFor("the hinted bucket published while the discovery runs", func() bool { return len(h.store.Pending(2)) == 0 })
	if n := len(h.store.Pending(5)); n != 3 {
		t.Fatalf("bucket 5 has %d rows pending before the discovery answered; want 3", n)
	}
	close(release)
	h.waitFor("the discovered bucket published", func() bool { return h.store.Len() == 0 })
	checkPublishedOnce(t, h.pub.Calls(), 5)
}

// probeRecorder is a concurrent MemStore that records, for each
// discovery, how many of the buckets it was asked to probe held rows.
type probeRecorder struct {
	concurrentStore
	mu     sync.Mutex
	probes []probe
}

// probe is one discovery: the buckets asked and how many of them held rows.
type probe struct {
	asked   []int
	holding int
}

func (s *probeRecorder) BucketsWithPending(ctx context.Context, buckets []int) ([]int, error) {
	holding := 0
	for _, b := range buckets {
		if len(s.Pending(b)) > 0 {
			holding++
		}
	}
	s.mu.Lock()
	s.probes = append(s.probes, probe{slices.Clone(buckets), holding})
	s.mu.Unlock()
	return s.MemStore.BucketsWithPending(ctx, buckets)
}

func (s *probeRecorder) discoveries() []probe {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.probes)
}

// TestDiscoveryDuringADrainSkipsBucketsWaitingForABatch: a discovery due
// in the middle of a drain probes the idle buckets and the one being
// served, not the buckets already known to hold rows and waiting for
// their next batch, whose next fetch reads every row the probe could
// find. On PostgreSQL a probe of such a bucket walks the index entries of
// the rows just deleted at its head: at 65,536 buckets, one relay, the
// discoveries during a drain of 100,000 rows read 226,000–321,000 buffers
// (2–3 per message drained); at most 22,000 since.
func TestDiscoveryDuringADrainSkipsBucketsWaitingForABatch(t *testing.T) {
	const buckets, full, rows = 16, 8, 3
	var s *probeRecorder
	h := newHarness(t, relay.Options{BucketCount: buckets, BatchSize: 1, MaxConcurrentBuckets: 1}, func(m *relaytest.MemStore) relay.Store {
		s = &probeRecorder{concurrentStore: concurrentStore{m}}
		return s
	})
	for b := range full {
		h.store.AddToBucket(b, msgs(rows, "t")...)
	}
	var fetches atomic.Int32
	h.store.SetHook(func(ctx context.Context, op string) error {
		if err := h.ops.hook(ctx, op); err != nil {
			return err
		}
		if op == relaytest.OpNextBatches && fetches.Add(1) == full+1 { // the first pass is over
			h.advanceInStoreCall(relay.DefaultPollInterval) // a discovery is due
		}
		return nil
	})
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	checkPublishedOnce(t, h.pub.Calls(), full*rows)
	probes := s.discoveries()
	if len(probes) < 2 {
		t.Fatalf("discoveries %v; want the first and one during the drain", probes)
	}
	for _, p := range probes[1:] {
		if p.holding > 1 { // the bucket being served, at most
			t.Fatalf("a discovery during the drain probed %v, %d of them holding rows; want at most the one being served (discoveries: %v)", p.asked, p.holding, probes)
		}
		if len(p.asked) < buckets-full {
			t.Fatalf("a discovery during the drain probed %v; want at least the %d empty buckets (discoveries: %v)", p.asked, buckets-full, probes)
		}
	}
}

// TestDiscoveryProbesTheBucketBeingServed: a discovery that starts while
// a bucket's batch is being published probes that bucket, since its fetch
// may have run before a row committed meanwhile, and leaves out a bucket
// hinted meanwhile, which waits for its batch. Here bucket 0's second
// batch is held in the publisher while a discovery is due and a hint for
// bucket 7 wakes the sweep.
func TestDiscoveryProbesTheBucketBeingServed(t *testing.T) {
	var s *probeRecorder
	h := newHarness(t, relay.Options{BucketCount: 16, BatchSize: 1, MaxConcurrentBuckets: 1}, func(m *relaytest.MemStore) relay.Store {
		s = &probeRecorder{concurrentStore: concurrentStore{m}}
		return s
	})
	h.store.AddToBucket(0, msgs(3, "served")...)
	entered, release := make(chan struct{}), make(chan struct{})
	var publishes atomic.Int32
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		if publishes.Add(1) == 2 {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return relay.Result{Err: ctx.Err()}
			}
		}
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	select {
	case <-entered:
	case <-time.After(waitLimit):
		t.Fatal("bucket 0's second batch was never published")
	}
	before := len(s.discoveries())
	h.advanceInStoreCall(relay.DefaultPollInterval) // a discovery is due
	h.store.AddToBucket(7, msgs(1, "hinted")...)
	h.r.Notifier().NotifyBucket(7) // wakes the sweep, which starts the discovery
	h.waitFor("a discovery while bucket 0 is served", func() bool { return len(s.discoveries()) > before })
	asked := s.discoveries()[before].asked
	close(release)
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	checkPublishedOnce(t, h.pub.Calls(), 4)
	if !slices.Contains(asked, 0) {
		t.Errorf("the discovery while bucket 0 was served probed %v; want bucket 0 among them", asked)
	}
	if slices.Contains(asked, 7) {
		t.Errorf("the discovery probed %v; want bucket 7, hinted and waiting for its batch, left out", asked)
	}
}

// heldDeletes is a concurrent MemStore whose MarkPublished counts the calls
// running at once and holds each until more than bound run or a while has
// passed (a liveness bound only: the test asserts counts, not time).
type heldDeletes struct {
	concurrentStore
	bound         int32
	running, most atomic.Int32
	more          chan struct{} // closed once more than bound ran at once
	closeMore     sync.Once
}

func (s *heldDeletes) MarkPublished(ctx context.Context, rows []*outbox.Message) error {
	s.hold(ctx)
	return s.MemStore.MarkPublished(ctx, rows)
}

func (s *heldDeletes) hold(ctx context.Context) {
	n := s.running.Add(1)
	defer s.running.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	if n > s.bound {
		s.closeMore.Do(func() { close(s.more) })
	}
	select {
	case <-s.more:
	case <-time.After(50 * time.Millisecond):
	case <-ctx.Done():
	}
}

// TestDeletesInFlightAreBoundedByMaxConcurrentBuckets: a relay owning many
// more buckets than MaxConcurrentBuckets runs at most MaxConcurrentBuckets
// deletes at once, so that its statements in flight (and the connections
// they hold) stay 2×MaxConcurrentBuckets plus the lease upkeep, however many
// buckets it owns. Each delete is held while no more than the bound run:
// without the bound, the workers move on to other buckets and start more.
func TestDeletesInFlightAreBoundedByMaxConcurrentBuckets(t *testing.T) {
	var s *heldDeletes
	h := newHarness(t, relay.Options{BucketCount: 16, BatchSize: 2, MaxConcurrentBuckets: 2}, func(m *relaytest.MemStore) relay.Store {
		s = &heldDeletes{concurrentStore: concurrentStore{m}, bound: 2, more: make(chan struct{})}
		return s
	})
	for b := range 16 {
		h.store.AddToBucket(b, msgs(4, "t")...)
	}
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	if most := s.most.Load(); most > 2 {
		t.Fatalf("%d deletes ran at once; want at most MaxConcurrentBuckets 2", most)
	}
	if most := s.most.Load(); most < 1 {
		t.Fatal("no delete ran")
	}
	checkPublishedOnce(t, h.pub.Calls(), 64)
}
