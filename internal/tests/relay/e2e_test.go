package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// e2eEnv is what the end-to-end run needs from a backend.
type e2eEnv struct {
	clock   *relaytest.ManualClock
	storeA  relay.Store
	storeB  relay.Store
	pending func() int
	total   int
	// singleWriter sets both relays' Options.SingleWriter (SQLite, the
	// MemStore run): each serves one bucket at a time.
	singleWriter bool
}

type published struct {
	bucket int32
	id     int64
}

// runTakeover moves env.total rows through relays A and B. Midway, A's
// database stalls for longer than a lease, so B takes over all buckets; A
// then resumes and rejoins. It checks that every row was published at least
// once, that each bucket's rows were first published in id order, and that
// the table ends empty. TestEndToEndTakeover runs it on a MemStore,
// TestEndToEndTakeoverGormstore on gormstore: both here, with the rest of
// the relay's end-to-end tests, since gormstore's needs the test
// environment.
func runTakeover(t *testing.T, env e2eEnv) {
	t.Helper()
	var mu sync.Mutex
	var log []published
	var acked atomic.Int64
	record := func(batch []*outbox.Message) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range batch {
			log = append(log, published{m.Bucket, m.ID})
		}
		acked.Add(int64(len(batch)))
	}
	pa := &relaytest.Pausable{Store: env.storeA}
	var pausedAt atomic.Int64
	pubA := relaytest.NewPublisher()
	var ackedA atomic.Int64
	pubA.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
		record(b)
		// Pause A midway through its own share (it owns about half of the
		// buckets): counting both relays' progress could let A finish its
		// buckets before the trigger, and then no takeover happens.
		if ackedA.Add(int64(len(b))) >= int64(env.total/8) && pausedAt.Load() == 0 {
			pausedAt.Store(env.clock.Now().UnixNano())
			pa.Pause() // A's next store call (its MarkPublished) stalls
		}
		return relay.Result{Acknowledged: len(b)}
	})
	pubB := relaytest.NewPublisher()
	pubB.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
		record(b)
		return relay.Result{Acknowledged: len(b)}
	})
	quiet := slog.New(slog.DiscardHandler)
	a, err := relay.New(pa, pubA, relay.Options{RelayID: "relay-a", Clock: env.clock, Logger: quiet, SingleWriter: env.singleWriter})
	if err != nil {
		t.Fatal(err)
	}
	b, err := relay.New(env.storeB, pubB, relay.Options{RelayID: "relay-b", Clock: env.clock, Logger: quiet, SingleWriter: env.singleWriter})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- a.Run(ctx) }()
	// B joins once A is publishing, so that A owns buckets when its pause
	// comes (a B that started first could drain everything on its own
	// before the first rebalance hands A any bucket).
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if !pubA.WaitCalls(wctx, 1) {
		t.Fatal("relay A never published")
	}
	go func() { errs <- b.Run(ctx) }()

	// The simulated clock runs about 20 times faster than real time; it
	// paces polling, rebalancing and the takeover, never a correctness check.
	deadline := time.Now().Add(5 * time.Minute)
	for env.pending() > 0 {
		if time.Now().After(deadline) {
			pa.Resume()
			t.Fatalf("%d rows still pending after 5 minutes", env.pending())
		}
		step := 2 * time.Millisecond
		if pausedAt.Load() != 0 {
			step = 20 * time.Millisecond // only B works: hurry the takeover along
		}
		env.clock.Advance(step)
		time.Sleep(100 * time.Microsecond)
		if p := pausedAt.Load(); p != 0 && env.clock.Now().Sub(time.Unix(0, p)) > 45*time.Second {
			pa.Resume()
		}
	}
	pa.Resume()
	cancel()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("Run = %v; want nil", err)
		}
	}
	if pausedAt.Load() == 0 {
		t.Fatalf("relay A was never paused: no takeover happened")
	}

	mu.Lock()
	defer mu.Unlock()
	seen := map[int64]bool{}
	last := map[int32]int64{}
	dups := 0
	for _, p := range log {
		if seen[p.id] {
			dups++
			continue
		}
		seen[p.id] = true
		if p.id < last[p.bucket] {
			t.Fatalf("bucket %d: row %d first published after row %d; want id order", p.bucket, p.id, last[p.bucket])
		}
		last[p.bucket] = p.id
	}
	if len(seen) != env.total {
		t.Fatalf("distinct rows published = %d; want %d", len(seen), env.total)
	}
	if n := env.pending(); n != 0 {
		t.Fatalf("pending at the end = %d; want 0", n)
	}
	t.Logf("%d rows, %d publications, %d duplicates from the takeover", env.total, len(log), dups)
}

func TestEndToEndTakeover(t *testing.T) {
	t.Run("memstore_50000_rows_two_relays_forced_takeover", func(t *testing.T) {
		clock := relaytest.NewManualClock(t0)
		mem := relaytest.NewMemStore(8, clock.Now)
		const total = 50000
		batch := make([]*outbox.Message, 0, 1000)
		for i := 0; i < total; i++ {
			batch = append(batch, outbox.NewStringMessage("orders", fmt.Sprintf("order-%d", i%997), "v"))
			if len(batch) == cap(batch) {
				mem.Add(batch...)
				batch = batch[:0]
			}
		}
		runTakeover(t, e2eEnv{clock: clock, storeA: mem, storeB: mem, pending: mem.Len, total: total, singleWriter: true})
	})
}
