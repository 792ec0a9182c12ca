package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorm-outbox/outbox/internal/metrictest"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestPublishStalledMetric: outbox.publish.stalled reports, on the relay's
// clock, how long publishing has made no progress: the hung publish's age,
// then, after it failed, still the time since that first attempt started,
// through the backoff and the retry, until a publish is acknowledged; 0
// while idle. Reading it does not wait for the hung publish. (An in-flight
// age fell back to 0 at each failed attempt, so an alert's "for" never
// held against a paused broker.)
func TestPublishStalledMetric(t *testing.T) {
	reader := metrictest.NewReader()
	h := newHarness(t, relay.Options{BucketCount: 1, MeterProvider: reader.MeterProvider()}, nil)
	stalled := func() float64 {
		t.Helper()
		v, ok := reader.Read(t).Values[relay.MetricPublishStalled]
		if !ok {
			t.Fatalf("%s not reported", relay.MetricPublishStalled)
		}
		return v
	}
	entered := make(chan int, 2)
	answer := make(chan relay.Result)
	free := make(chan struct{}) // closed: every later call is acknowledged at once
	calls := 0
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		calls++
		select {
		case <-free:
			return relay.Result{Acknowledged: len(b)}
		default:
		}
		entered <- calls
		select {
		case res := <-answer:
			if res.Err == nil {
				res.Acknowledged = len(b)
			}
			return res
		case <-ctx.Done():
			return relay.Result{Err: ctx.Err()}
		}
	})
	h.start()
	h.waitIdle()
	if got := stalled(); got != 0 {
		t.Fatalf("%s while idle = %v; want 0", relay.MetricPublishStalled, got)
	}

	h.store.Add(msgs(3, "t")...)
	h.drainIdle()
	h.clock.Advance(relay.DefaultPollInterval)
	waitCall := func(n int) {
		t.Helper()
		select {
		case got := <-entered:
			if got != n {
				t.Fatalf("publish call %d; want %d", got, n)
			}
		case <-time.After(waitLimit):
			t.Fatalf("publish call %d did not start", n)
		}
	}
	waitCall(1)
	start := h.clock.Now()
	if got := stalled(); got != 0 {
		t.Fatalf("%s at the start of the publish = %v; want 0", relay.MetricPublishStalled, got)
	}
	h.clock.Advance(7 * time.Second) // less than the renew interval: no other timer fires
	if got := stalled(); got != 7 {
		t.Fatalf("%s 7s into a hung publish = %v; want 7", relay.MetricPublishStalled, got)
	}

	// The hung attempt fails (a timeout): the stall goes on through the
	// backoff and into the retry, counted from the first attempt's start.
	answer <- relay.Result{Err: errors.New("kafka: request timed out")}
	h.waitFor("the failure counted", func() bool { return reader.Read(t).Values[relay.MetricPublishFailures] == 1 })
	for retried := false; !retried; {
		if got, want := stalled(), h.clock.Now().Sub(start).Seconds(); got != want {
			t.Fatalf("%s %v after the first attempt started, between attempts = %v; want %v", relay.MetricPublishStalled, h.clock.Now().Sub(start), got, want)
		}
		h.clock.Advance(250 * time.Millisecond)
		select {
		case n := <-entered:
			if n != 2 {
				t.Fatalf("publish call %d; want 2", n)
			}
			retried = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	h.clock.Advance(2 * time.Second)
	if got, want := stalled(), h.clock.Now().Sub(start).Seconds(); got != want || got < 9 {
		t.Fatalf("%s in the retry = %v; want %v (since the first attempt)", relay.MetricPublishStalled, got, want)
	}

	close(free)
	answer <- relay.Result{} // acknowledged (the retry may carry the head row alone)
	h.waitFor("the rows to be published", func() bool { return h.store.Len() == 0 })
	h.waitFor(relay.MetricPublishStalled+" back to 0", func() bool { return stalled() == 0 })
}

// slowDeletes is a MemStore whose MarkPublished waits until release is
// closed; with ignore, its NextBatches reads the rows of Exclude anyway
// (a store that does not honour it) and answers once release is closed
// (a read that saw the rows before their delete ended).
type slowDeletes struct {
	*relaytest.MemStore
	release chan struct{}
	ignore  bool
	mu      sync.Mutex
	asked   [][]int64 // the ids of Exclude of each request that has some
}

func (s *slowDeletes) MarkPublished(ctx context.Context, rows []*outbox.Message) error {
	<-s.release
	return s.MemStore.MarkPublished(ctx, rows)
}

func (s *slowDeletes) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	excluding := false
	s.mu.Lock()
	for _, r := range reqs {
		if len(r.Exclude) > 0 {
			s.asked = append(s.asked, ids(r.Exclude))
			excluding = true
		}
	}
	s.mu.Unlock()
	if s.ignore && excluding {
		reqs = slices.Clone(reqs)
		for i := range reqs {
			reqs[i].Exclude = nil
		}
		out, err := s.MemStore.NextBatches(ctx, reqs)
		<-s.release
		return out, err
	}
	return s.MemStore.NextBatches(ctx, reqs)
}

func (s *slowDeletes) requests() [][]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.asked)
}

// TestFetchBesideADeleteLeavesItsBatchOut: while a bucket's acknowledged
// batch is being deleted, its next fetch asks the store to leave that batch
// out (BatchRequest.Exclude) instead of reading it again, and publishes the
// rows behind it; a store that returns the rows of Exclude anyway stalls
// the bucket only until the delete ends, never marks it drained, and every
// row is published once, in order. In a bubble, each step is checked once
// the relay has settled: a broken step fails at once, not at a timeout.
func TestFetchBesideADeleteLeavesItsBatchOut(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		t.Run(fmt.Sprintf("store_ignores_exclude=%v", ignore), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &slowDeletes{release: make(chan struct{}), ignore: ignore}
				h := newHarness(t, relay.Options{BucketCount: 1, BatchSize: 2}, func(m *relaytest.MemStore) relay.Store { s.MemStore = m; return s })
				h.store.Add(msgs(6, "t")...)
				all := ids(h.store.Pending(0))
				h.start()
				release := sync.OnceFunc(func() { close(s.release) })
				t.Cleanup(release) // before the relay's stop, which waits for the delete
				synctest.Wait()    // the first batch's delete holds
				if got := s.requests(); len(got) == 0 || !slices.Equal(got[0], all[:2]) {
					t.Fatalf("fetches beside the first batch's delete left out %v; want one leaving out that batch, %v", got, all[:2])
				}
				want := all[:4] // the first batch, then the rows behind it
				if ignore {
					want = all[:2] // the bucket waits for the delete
				}
				if got := publishedIDs(h.pub.Calls(), 0); !slices.Equal(got, want) {
					t.Fatalf("published %v while the first batch's delete runs; want %v", got, want)
				}
				release()
				synctest.Wait()
				if p := ids(h.store.Pending(0)); len(p) > 0 {
					t.Fatalf("the relay settled with bucket 0's rows %v pending; want every batch drained once the delete ended", p)
				}
				if got := publishedIDs(h.pub.Calls(), 0); !slices.Equal(got, all) {
					t.Fatalf("published %v; want each row once, in order: %v", got, all)
				}
			})
		})
	}
}
