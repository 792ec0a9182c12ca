package relay_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// groupRecorder is a Publisher that records the row count of each batch of
// every Publish call of several batches (a group).
type groupRecorder struct {
	*relaytest.Publisher
	mu     sync.Mutex
	groups [][]int
}

func (g *groupRecorder) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	if len(batches) > 1 {
		sizes := make([]int, len(batches))
		for i, b := range batches {
			sizes[i] = len(b)
		}
		g.mu.Lock()
		g.groups = append(g.groups, sizes)
		g.mu.Unlock()
	}
	return g.Publisher.Publish(ctx, batches)
}

// TestShallowBucketsShareFetchesPublishesAndDeletes: 1,024 buckets holding
// one row each drain with a few dozen fetches, publishes and deletes (a
// group's buckets share one of each), not one of each per bucket; each row
// is published once, in order.
func TestShallowBucketsShareFetchesPublishesAndDeletes(t *testing.T) {
	const buckets = 1024
	rec := &groupRecorder{}
	h := newHarnessPub(t, relay.Options{BucketCount: buckets}, asConcurrent,
		func(p *relaytest.Publisher) relay.Publisher { rec.Publisher = p; return rec })
	for b := range buckets {
		h.store.AddToBucket(b, msgs(1, "t")...)
	}
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	h.waitIdle()
	checkPublishedOnce(t, h.pub.Calls(), buckets)
	fetches, deletes := h.ops.count(relaytest.OpNextBatches), h.ops.count(relaytest.OpMarkPublished)
	if limit := 2 * buckets / 64; fetches > limit || deletes > limit {
		t.Fatalf("%d fetches and %d deletes for %d one-row buckets; want at most %d of each (groups of up to 64)", fetches, deletes, buckets, limit)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.groups) > 2*buckets/64 {
		t.Fatalf("%d group publishes; want at most %d", len(rec.groups), 2*buckets/64)
	}
}

// TestGroupSharesOneBatchBound: a group's batches together stay within
// BatchSize (each bucket gets an equal share at first), and a bucket that
// fills its share takes twice as much next, up to whole batches, served
// alone.
func TestGroupSharesOneBatchBound(t *testing.T) {
	const batchSize = 8
	rec := &groupRecorder{}
	h := newHarnessPub(t, relay.Options{BucketCount: 8, BatchSize: batchSize, MaxConcurrentBuckets: 1}, asConcurrent,
		func(p *relaytest.Publisher) relay.Publisher { rec.Publisher = p; return rec })
	h.store.AddToBucket(0, msgs(40, "deep")...)
	for b := 1; b < 8; b++ {
		h.store.AddToBucket(b, msgs(3, "t")...) // in groups for three rounds
	}
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	h.waitIdle()
	checkPublishedOnce(t, h.pub.Calls(), 61)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.groups) == 0 {
		t.Fatal("no group publish; want the shallow buckets published in a group")
	}
	for _, g := range rec.groups {
		total := 0
		for _, n := range g {
			total += n
		}
		if total > batchSize {
			t.Fatalf("a group published %v rows (%d in all); want at most BatchSize %d", g, total, batchSize)
		}
	}
	var sizes []int // bucket 0's batches, in order
	for _, c := range h.pub.Calls() {
		if c[0].Bucket == 0 {
			sizes = append(sizes, len(c))
		}
	}
	// Its first batch is its share of a group of eight (one row); each next
	// one, while it fills its share, twice as large, up to a whole batch.
	if want := []int{1, 2, 4, batchSize, batchSize}; len(sizes) < len(want) || !slices.Equal(sizes[:len(want)], want) {
		t.Fatalf("bucket 0's batches had %v rows; want them to begin %v (its share of a group, doubled each time it fills it, up to BatchSize)", sizes, want)
	}
}

// TestDeepBucketsFillGroupBatches: many buckets each deeper than its equal
// share but shallower than a batch (1,024 buckets of ~200 rows for a batch
// of 500, scaled down) are published in batches close to BatchSize — not
// one small batch per bucket — each row once and in order.
func TestDeepBucketsFillGroupBatches(t *testing.T) {
	const buckets, rows, batchSize = 128, 25, 64
	rec := &groupRecorder{}
	h := newHarnessPub(t, relay.Options{BucketCount: buckets, BatchSize: batchSize, MaxConcurrentBuckets: 1}, asConcurrent,
		func(p *relaytest.Publisher) relay.Publisher { rec.Publisher = p; return rec })
	for b := range buckets {
		h.store.AddToBucket(b, msgs(rows, "t")...)
	}
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	h.waitIdle()
	checkPublishedOnce(t, h.pub.Calls(), buckets*rows)
	// Served alone once found deeper than a share (one row), each bucket
	// took a batch of 24 rows after a first wave of groups: 130 calls.
	// Doubling shares (1, 2, 4, 8, 16 rows) make 62: 50 full batches'
	// worth, the last wave two-thirds full.
	rec.mu.Lock()
	defer rec.mu.Unlock()
	calls := len(h.pub.Calls()) // a batch each
	for _, g := range rec.groups {
		calls -= len(g) - 1 // one call each
	}
	least := buckets * rows / batchSize
	if calls > least*3/2 {
		t.Fatalf("%d rows in %d publish calls of a batch of %d; want at most %d (groups filled by deep buckets' growing shares)", buckets*rows, calls, batchSize, least*3/2)
	}
}

// TestGroupedRowIsNotStruckForAnotherRowsFailure: a row that fails in a
// group (left unsent, say, behind another bucket's failed row on its
// partition) earns no strike, even under ParkAnyFailure with ParkAfter 1:
// only a row published alone is judged. It is retried and published.
func TestGroupedRowIsNotStruckForAnotherRowsFailure(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 8, ParkPolicy: relay.ParkAnyFailure, ParkAfter: 1}, asConcurrent)
	for b := range 8 {
		h.store.AddToBucket(b, msgs(1, "t")...)
	}
	var once sync.Once
	h.pub.SetHandler(func(ctx context.Context, batch []*outbox.Message) relay.Result {
		failed := false
		if batch[0].Bucket == 3 {
			once.Do(func() { failed = true })
		}
		if failed {
			return relay.Result{Err: errors.New("not sent: an earlier row of its partition failed")}
		}
		return relay.Result{Acknowledged: len(batch)}
	})
	h.start()
	for range 10 {
		if len(h.pub.Acknowledged()) == 8 {
			break
		}
		h.advanceIdle(time.Second) // past the row's backoff
	}
	if n := len(h.pub.Acknowledged()); n != 8 {
		t.Fatalf("%d rows published; want 8", n)
	}
	if parked := h.store.Parked(); len(parked) != 0 {
		t.Fatalf("parked %v; want nothing parked for a failure in a group", parked)
	}
	calls := h.pub.Calls()
	if n := slices.IndexFunc(calls, func(c []*outbox.Message) bool { return c[0].Bucket == 3 }); n < 0 || len(calls) < 9 {
		t.Fatalf("publishes %d; want bucket 3's row tried twice", len(calls))
	}
}

// orderedRecorder is a MemStore (its relay a SingleWriter) that records the
// most buckets a request of several read, and the requests whose buckets
// were not distinct and ascending, as the contract asks.
type orderedRecorder struct {
	*relaytest.MemStore
	mu       sync.Mutex
	most     int
	unsorted [][]int
}

func (o *orderedRecorder) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	o.mu.Lock()
	for _, req := range reqs {
		if len(req.Buckets) > 1 {
			o.most = max(o.most, len(req.Buckets))
		}
		if !slices.IsSorted(req.Buckets) || len(slices.Compact(slices.Clone(req.Buckets))) != len(req.Buckets) {
			o.unsorted = append(o.unsorted, slices.Clone(req.Buckets))
		}
	}
	o.mu.Unlock()
	return o.MemStore.NextBatches(ctx, reqs)
}

// TestSerialStoreReadsThousandsOfBucketsByHeads: while more than 1,024
// buckets wait, a serialising store's groups are read by heads (the
// relay's work per fetch grows with the group's buckets), at most 64 at a
// time; in order only once at most 1,024 are left. Each row is published
// once and in order.
func TestSerialStoreReadsThousandsOfBucketsByHeads(t *testing.T) {
	const buckets = 2048
	var rec *orderedRecorder
	h := newHarness(t, relay.Options{BucketCount: buckets}, func(m *relaytest.MemStore) relay.Store {
		rec = &orderedRecorder{MemStore: m}
		return rec
	})
	for b := range buckets {
		h.store.AddToBucket(b, msgs(1, "t")...)
	}
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	h.waitIdle()
	checkPublishedOnce(t, h.pub.Calls(), buckets)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.most > 1024 || rec.most <= 64 {
		t.Fatalf("requests read at most %d buckets; want at most 1,024 (more are read by heads), and once fewer were left, more than a group by heads (64)", rec.most)
	}
	if len(rec.unsorted) > 0 {
		t.Fatalf("requests asked for buckets out of order (%d calls, the first %v); want them distinct and ascending", len(rec.unsorted), rec.unsorted[0][:min(8, len(rec.unsorted[0]))])
	}
}

// TestSerialStoreReadsGroupsInIDOrder: with a store whose writes serialise
// (SQLite), the relay reads its buckets together in id order, as the table
// is laid out: its first publish holds the BatchSize oldest rows across
// the buckets, and the backlog takes one fetch per BatchSize rows.
func TestSerialStoreReadsGroupsInIDOrder(t *testing.T) {
	const buckets, perBucket, batch = 4, 6, 6
	h := newHarness(t, relay.Options{BucketCount: buckets, BatchSize: batch}, nil)
	for range perBucket {
		for b := range buckets {
			h.store.AddToBucket(b, msgs(1, "t")...)
		}
	}
	oldest := make([]int64, 0, batch)
	for b := range buckets {
		for _, m := range h.store.Pending(b) {
			oldest = append(oldest, m.ID)
		}
	}
	slices.Sort(oldest)
	oldest = oldest[:batch]
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	h.waitIdle()
	calls := h.pub.Calls()
	checkPublishedOnce(t, calls, buckets*perBucket)
	var first []int64 // the first group's rows: one call per batch, buckets in order
	for _, c := range calls {
		for _, m := range c {
			first = append(first, m.ID)
		}
		if len(first) >= batch {
			break
		}
	}
	slices.Sort(first)
	if !slices.Equal(first, oldest) {
		t.Fatalf("first publish held rows %v; want the %d oldest across the buckets %v", first, batch, oldest)
	}
	if got, limit := h.ops.count(relaytest.OpNextBatches), buckets*perBucket/batch+1; got > limit {
		t.Fatalf("%d fetches for %d rows; want at most %d (one per BatchSize rows, then one that finds them drained)", got, buckets*perBucket, limit)
	}
}

// TestSerialStoreAsksForBucketsInAscendingOrder: a bucket hinted while a
// group is in flight joins the queue ahead of the group's buckets, which
// come back behind it; the next group still asks for its
// buckets distinct and ascending, as the contract says, and every row is
// published once, in order.
func TestSerialStoreAsksForBucketsInAscendingOrder(t *testing.T) {
	var rec *orderedRecorder
	h := newHarness(t, relay.Options{BucketCount: 4, BatchSize: 4}, func(m *relaytest.MemStore) relay.Store {
		rec = &orderedRecorder{MemStore: m}
		return rec
	})
	h.store.AddToBucket(0, msgs(6, "t")...)
	h.store.AddToBucket(1, msgs(6, "t")...)
	var once sync.Once
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		once.Do(func() { // during the first group's publish
			h.store.AddToBucket(3, msgs(2, "late")...)
			h.r.Notifier().NotifyBucket(3)
		})
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	h.waitIdle()
	checkPublishedOnce(t, h.pub.Calls(), 14)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.unsorted) > 0 {
		t.Fatalf("requests asked for buckets %v; want them distinct and ascending", rec.unsorted)
	}
	if rec.most < 3 {
		t.Fatalf("requests read at most %d buckets; want a group of the hinted bucket and the two others", rec.most)
	}
}

// TestMaxBatchBytes: large rows are published in batches whose total
// MessageSize stays within MaxBatchBytes, in order, each once; a row larger
// than the bound goes alone. The store is asked for the bound
// (NextBatch's maxBytes) and the relay trims what crosses it.
func TestMaxBatchBytes(t *testing.T) {
	const bound = 1000
	for _, tc := range []struct {
		name  string
		wrap  func(*relaytest.MemStore) relay.Store
		fetch string
	}{
		{"next_batch", nil, relaytest.OpNextBatches},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, relay.Options{BucketCount: 1, MaxBatchBytes: bound}, tc.wrap)
			var rows []*outbox.Message
			for i := range 12 {
				size := 300 // three per batch
				if i == 5 {
					size = 3 * bound // alone
				}
				m := outbox.NewStringMessage("t", "", "")
				m.Key = nil
				m.Value = bytes.Repeat([]byte{'v'}, size-10)
				m.Headers = outbox.Headers{{Key: "h", Value: bytes.Repeat([]byte{'x'}, 9)}}
				rows = append(rows, m)
			}
			h.store.Add(rows...)
			h.start()
			h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
			calls := h.pub.Calls()
			checkPublishedOnce(t, calls, len(rows))
			var sizes []int
			for _, c := range calls {
				var total int64
				for _, m := range c {
					total += relay.MessageSize(m)
				}
				if total > bound && len(c) > 1 {
					t.Fatalf("a batch of %d rows holds %d bytes; want at most %d", len(c), total, bound)
				}
				sizes = append(sizes, len(c))
			}
			// 0-2, 3-4 (the big row next), 5 alone, 6-8, 9-11.
			if want := []int{3, 2, 1, 3, 3}; !slices.Equal(sizes, want) {
				t.Fatalf("batch sizes %v; want %v", sizes, want)
			}
			if h.ops.count(tc.fetch) == 0 {
				t.Fatalf("no %s call; want the batches fetched with it", tc.fetch)
			}
		})
	}
}
