package relay_test

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// A copy of the part of relay/harness_test.go (and park_test.go's step)
// that TestRecordTooLargeForTheTopicIsParkedWhileItsBucketFlows uses. Relay's
// own harness learns that Run went idle from the SetIdleHook of its
// export_test.go, which a test outside the package cannot reach: this one
// learns it from its clock (idleClock).

// waitLimit bounds every wait for the relay goroutine; reaching it is a
// failure, never a path to success.
const waitLimit = 20 * time.Second

// harness runs one relay on a manual clock, a MemStore and a Publisher.
type harness struct {
	t      *testing.T
	clock  *idleClock
	store  *relaytest.MemStore
	pub    *relaytest.Publisher
	r      *relay.Relay
	idle   chan struct{}
	cancel context.CancelFunc
	done   chan error
}

// idleClock is a ManualClock that signals idle whenever Run sets the timer
// of an idle wait or a backoff: the moment relay's SetIdleHook reports (once
// the timer is set, so the test may move the clock). It tells those timers
// from the others (lease renewal, metrics, stop) by their caller, the
// relay's (*Relay).idle and (*Relay).sleep; were they renamed, waitIdle
// would fail, never pass.
type idleClock struct {
	*relaytest.ManualClock
	idle chan<- struct{}
}

// runWaits are the functions whose timers are Run's idle waits and backoffs.
var runWaits = []string{"github.com/gorm-outbox/outbox/relay.(*Relay).idle", "github.com/gorm-outbox/outbox/relay.(*Relay).sleep"}

func (c *idleClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	ch, stop := c.ManualClock.NewTimer(d)
	var pcs [16]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	for more := true; more; {
		var f runtime.Frame
		f, more = frames.Next()
		for _, w := range runWaits {
			if f.Function == w || strings.HasPrefix(f.Function, w+".") { // or a closure of it
				select {
				case c.idle <- struct{}{}:
				default:
				}
				return ch, stop
			}
		}
	}
	return ch, stop
}

// newHarness builds the relay without starting it. wrap, when non-nil,
// replaces the store the relay sees.
func newHarness(t *testing.T, opts relay.Options, wrap func(*relaytest.MemStore) relay.Store) *harness {
	t.Helper()
	h := &harness{t: t, pub: relaytest.NewPublisher(), idle: make(chan struct{}, 1)}
	h.clock = &idleClock{ManualClock: relaytest.NewManualClock(t0), idle: h.idle}
	n := opts.BucketCount
	if n == 0 {
		n = relay.DefaultBucketCount
	}
	h.store = relaytest.NewMemStore(n, h.clock.Now)
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
	r, err := relay.New(s, h.pub, opts)
	if err != nil {
		t.Fatalf("relay.New: %v", err)
	}
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

// waitIdle waits until the relay next parks in an idle wait or backoff.
func (h *harness) waitIdle() {
	h.t.Helper()
	select {
	case <-h.idle:
	case <-time.After(waitLimit):
		h.t.Fatalf("relay did not become idle")
	}
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

func (h *harness) drainIdle() {
	select {
	case <-h.idle:
	default:
	}
}

// step moves the manual clock to the next timer deadline, one wake-up at a
// time, until cond holds; it fails after limit wake-ups. The relay must be
// idle when it is called.
func (h *harness) step(what string, limit int, cond func() bool) {
	h.t.Helper()
	for i := 0; !cond(); i++ {
		if i == limit {
			h.t.Fatalf("no %s after %d wake-ups (clock at +%v)", what, limit, h.clock.Now().Sub(t0))
		}
		next, ok := h.clock.NextDeadline()
		if !ok {
			h.t.Fatalf("no %s and no timer pending", what)
		}
		h.drainIdle()
		h.clock.Set(next)
		h.waitFor(what+" or the next idle wait", func() bool {
			select {
			case <-h.idle:
				return true
			default:
				return false
			}
		})
	}
}
