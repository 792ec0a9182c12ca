package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// t0 is the manual clocks' start.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// waitLimit bounds every wait for the relay goroutine; reaching it is a
// failure, never a path to success.
const waitLimit = 20 * time.Second

// harness runs one relay on a manual clock, a MemStore and a Publisher.
type harness struct {
	t      *testing.T
	clock  *relaytest.ManualClock
	store  *relaytest.MemStore
	pub    *relaytest.Publisher
	r      *relay.Relay
	idle   chan struct{}
	cancel context.CancelFunc
	done   chan error
	ops    *opCounter
}

// opCounter counts store calls by operation and can inject faults.
type opCounter struct {
	mu     sync.Mutex
	counts map[string]int
	fail   map[string]int                             // op → remaining failures
	block  map[string]func(ctx context.Context) error // op → blocking behaviour
	after  func(op string)
}

func newOpCounter() *opCounter {
	return &opCounter{counts: map[string]int{}, fail: map[string]int{}, block: map[string]func(context.Context) error{}}
}

func (c *opCounter) hook(ctx context.Context, op string) error {
	c.mu.Lock()
	c.counts[op]++
	blk := c.block[op]
	var err error
	if c.fail[op] > 0 {
		c.fail[op]--
		err = fmt.Errorf("injected %s failure", op)
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if blk != nil {
		return blk(ctx)
	}
	return nil
}

func (c *opCounter) count(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[op]
}

func (c *opCounter) failNext(op string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fail[op] += n
}

// remaining returns the failures still to inject into op.
func (c *opCounter) remaining(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fail[op]
}

func (c *opCounter) setBlock(op string, f func(ctx context.Context) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.block[op] = f
}

// newHarness builds the relay without starting it. wrap, when non-nil,
// replaces the store the relay sees; unless that store serves several
// buckets at once (see concurrentStore), the relay is a SingleWriter.
func newHarness(t *testing.T, opts relay.Options, wrap func(*relaytest.MemStore) relay.Store) *harness {
	t.Helper()
	return newHarnessPub(t, opts, wrap, nil)
}

// newHarnessPub is newHarness whose relay publishes with wrapPub(h.pub)
// (nil: h.pub).
func newHarnessPub(t *testing.T, opts relay.Options, wrap func(*relaytest.MemStore) relay.Store, wrapPub func(*relaytest.Publisher) relay.Publisher) *harness {
	t.Helper()
	h := &harness{t: t, clock: relaytest.NewManualClock(t0), pub: relaytest.NewPublisher(), idle: make(chan struct{}, 1), ops: newOpCounter()}
	n := opts.BucketCount
	if n == 0 {
		n = relay.DefaultBucketCount
	}
	h.store = relaytest.NewMemStore(n, h.clock.Now)
	h.store.SetHook(h.ops.hook)
	if opts.RelayID == "" {
		opts.RelayID = "relay-a"
	}
	opts.Clock = h.clock
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var s relay.Store = h.store
	if wrap != nil {
		s = wrap(h.store)
	}
	if c, ok := s.(interface{ concurrent() bool }); !ok || !c.concurrent() {
		opts.SingleWriter = true // as on SQLite: one bucket at a time, groups read in order
	}
	var pub relay.Publisher = h.pub
	if wrapPub != nil {
		pub = wrapPub(h.pub)
	}
	r, err := relay.New(s, pub, opts)
	if err != nil {
		t.Fatalf("relay.New: %v", err)
	}
	relay.SetIdleHook(r, func() {
		select {
		case h.idle <- struct{}{}:
		default:
		}
	})
	h.r = r
	return h
}

func (h *harness) start() {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.r.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(waitLimit):
			h.t.Errorf("Run did not return after cancel")
		}
	})
}

// stop cancels Run and returns its result.
func (h *harness) stop() error {
	h.t.Helper()
	h.cancel()
	select {
	case err := <-h.done:
		h.done <- err // for Cleanup
		return err
	case <-time.After(waitLimit):
		h.t.Fatalf("Run did not return after cancel")
		return nil
	}
}

// waitIdle waits until the relay next parks in an idle wait or backoff.
func (h *harness) waitIdle() {
	h.t.Helper()
	select {
	case <-h.idle:
	case <-time.After(waitLimit):
		h.t.Fatalf("relay did not become idle")
	}
}

// advanceInStoreCall moves the manual clock by d from inside a store call
// (a slow database), then waits until the renewal goroutine has settled on
// the moved clock: its next renewal in the future. (A move past the lease
// leaves the goroutine without a timer: use h.clock.Advance then.)
func (h *harness) advanceInStoreCall(d time.Duration) {
	h.clock.Advance(d)
	h.waitFor("the renewal goroutine to settle", func() bool {
		next, ok := h.clock.NextDeadline()
		return ok && next.After(h.clock.Now())
	})
}

// waitFor polls cond until it holds, leaving idle signals to waitIdle.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.After(waitLimit)
	for !cond() {
		select {
		case <-time.After(time.Millisecond):
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// advanceIdle advances the clock by d and waits for the next idle wait.
func (h *harness) advanceIdle(d time.Duration) {
	h.t.Helper()
	h.drainIdle()
	h.clock.Advance(d)
	h.waitIdle()
}

func (h *harness) drainIdle() {
	select {
	case <-h.idle:
	default:
	}
}

func msgs(n int, topic string) []*outbox.Message {
	out := make([]*outbox.Message, n)
	for i := range out {
		out[i] = outbox.NewStringMessage(topic, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
	}
	return out
}

func ids(ms []*outbox.Message) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

var errBroker = errors.New("broker says no")
