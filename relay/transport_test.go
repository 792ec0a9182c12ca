package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// hub is an in-memory broadcast: what one endpoint publishes, every
// listening endpoint receives (itself included, as LISTEN/NOTIFY does).
type hub struct {
	mu        sync.Mutex
	listeners map[*endpoint]chan []int
	sends     [][]int
}

func newHub() *hub { return &hub{listeners: map[*endpoint]chan []int{}} }

func (h *hub) sent() [][]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sends)
}

// endpoint is one relay's Transport on the hub.
type endpoint struct {
	h        *hub
	drop     chan error    // a value ends the current Listen with that error
	inFn     chan struct{} // when non-nil, Listen signals here before each callback
	slowFn   chan struct{} // when non-nil, each callback waits for it
	listens  atomic.Int32  // Listen calls so far
	active   atomic.Int32  // Listen calls running now
	sendFail atomic.Bool
	failed   atomic.Int32 // Publish calls failed by sendFail
}

func (h *hub) endpoint() *endpoint { return &endpoint{h: h, drop: make(chan error, 1)} }

func (e *endpoint) Publish(ctx context.Context, buckets []int) error {
	if e.sendFail.Load() {
		e.failed.Add(1)
		return errors.New("hub: send failed")
	}
	e.h.mu.Lock()
	defer e.h.mu.Unlock()
	e.h.sends = append(e.h.sends, slices.Clone(buckets))
	for _, ch := range e.h.listeners {
		select {
		case ch <- slices.Clone(buckets):
		default:
		}
	}
	return nil
}

func (e *endpoint) Listen(ctx context.Context, fn func(int)) error {
	e.listens.Add(1)
	e.active.Add(1)
	defer e.active.Add(-1)
	ch := make(chan []int, 64)
	e.h.mu.Lock()
	e.h.listeners[e] = ch
	e.h.mu.Unlock()
	defer func() {
		e.h.mu.Lock()
		delete(e.h.listeners, e)
		e.h.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-e.drop:
			return err
		case bs := <-ch:
			for _, b := range bs {
				if e.inFn != nil {
					e.inFn <- struct{}{}
				}
				if e.slowFn != nil {
					<-e.slowFn
				}
				fn(b)
			}
		}
	}
}

func (e *endpoint) listening() bool {
	e.h.mu.Lock()
	defer e.h.mu.Unlock()
	_, ok := e.h.listeners[e]
	return ok
}

// pod is one relay process of the cross-pod tests.
type pod struct {
	r      *relay.Relay
	pub    *relaytest.Publisher
	tr     *endpoint
	idle   chan struct{}
	cancel context.CancelFunc
	done   chan error
}

// twoPods starts relays A and B on one store with polling at poll, each with
// its own hub endpoint, and waits until A owns buckets 0-3 and B owns 4-7.
func twoPods(t *testing.T, poll time.Duration) (*relaytest.ManualClock, *relaytest.MemStore, *hub, *pod, *pod) {
	t.Helper()
	clock := relaytest.NewManualClock(t0)
	store := relaytest.NewMemStore(8, clock.Now)
	h := newHub()
	mk := func(id string) *pod {
		p := &pod{pub: relaytest.NewPublisher(), tr: h.endpoint(), idle: make(chan struct{}, 1), done: make(chan error, 1)}
		r, err := relay.New(store, p.pub, relay.Options{RelayID: id, Clock: clock, PollInterval: poll, HintTransport: p.tr, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		relay.SetIdleHook(r, func() {
			select {
			case p.idle <- struct{}{}:
			default:
			}
		})
		p.r = r
		ctx, cancel := context.WithCancel(context.Background())
		p.cancel = cancel
		go func() { p.done <- r.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case <-p.done:
			case <-time.After(waitLimit):
				t.Errorf("%s: Run did not return after cancel", id)
			}
		})
		return p
	}
	waitIdle := func(p *pod) {
		t.Helper()
		select {
		case <-p.idle:
		case <-time.After(waitLimit):
			t.Fatal("relay did not become idle")
		}
	}
	a := mk("relay-a")
	waitIdle(a) // A owns all 8
	b := mk("relay-b")
	waitIdle(b) // B owns none yet
	for i := 0; i < 4; i++ {
		owners := store.Owners()
		if owners[0] == "relay-a" && owners[3] == "relay-a" && owners[4] == "relay-b" && owners[7] == "relay-b" {
			waitUntil(t, "both listeners subscribed", func() bool { return a.tr.listening() && b.tr.listening() })
			return clock, store, h, a, b
		}
		clock.Advance(relay.DefaultLeaseRenewInterval)
		waitIdle(a)
		waitIdle(b)
	}
	t.Fatalf("owners = %v; want relay-a on 0-3 and relay-b on 4-7", store.Owners())
	return nil, nil, nil, nil, nil
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCrossPodNotifications(t *testing.T) {
	t.Run("commit_in_A_to_a_bucket_owned_by_B_wakes_B_before_its_poll_interval", func(t *testing.T) {
		clock, store, h, a, b := twoPods(t, time.Hour)
		before := clock.Now()
		store.AddToBucket(5, msgs(1, "orders")...)
		a.r.Notifier().NotifyBucket(5) // A's plugin after the commit
		waitUntil(t, "B publishes bucket 5", func() bool { return len(store.Pending(5)) == 0 })
		if got := bucketsOf(b.pub.Calls()); !slices.Equal(got, []int32{5}) {
			t.Fatalf("B published buckets %v; want [5]", got)
		}
		if n := len(a.pub.Calls()); n != 0 {
			t.Fatalf("A published %d batches; want 0 (it does not own bucket 5)", n)
		}
		if !clock.Now().Equal(before) {
			t.Fatalf("clock moved; B must wake without polling")
		}
		// Only A's commit was sent: neither B nor A's self-echo rebroadcast it.
		if sends := h.sent(); len(sends) != 1 || !slices.Equal(sends[0], []int{5}) {
			t.Fatalf("hub carried %v; want exactly [[5]] (hints are never rebroadcast)", sends)
		}
	})

	t.Run("duplicate_hints_publish_each_row_once", func(t *testing.T) {
		_, store, h, a, b := twoPods(t, time.Hour)
		store.AddToBucket(6, msgs(2, "orders")...)
		other := h.endpoint()
		for i := 0; i < 5; i++ {
			if err := other.Publish(context.Background(), []int{6, 6, 6}); err != nil {
				t.Fatal(err)
			}
		}
		waitUntil(t, "B publishes bucket 6", func() bool { return len(store.Pending(6)) == 0 })
		rows := 0
		for _, c := range b.pub.Calls() {
			rows += len(c)
		}
		if rows != 2 || len(a.pub.Calls()) != 0 {
			t.Fatalf("B published %d rows, A %d batches; want 2 rows by B only", rows, len(a.pub.Calls()))
		}
	})

	t.Run("dropped_transport_restarts_and_polling_delivers_meanwhile", func(t *testing.T) {
		clock, store, _, a, b := twoPods(t, time.Minute)
		b.tr.drop <- errors.New("connection reset")
		waitUntil(t, "B's listener ended", func() bool { return !b.tr.listening() })
		store.AddToBucket(7, msgs(1, "orders")...)
		a.r.Notifier().NotifyBucket(7) // sent, but B is not listening
		// Polling still finds it: move past the poll interval (and B's
		// listener backoff) in steps, as time passes.
		for i := 0; i < 10 && len(store.Pending(7)) > 0; i++ {
			clock.Advance(10 * time.Second)
			time.Sleep(time.Millisecond)
			waitUntil(t, "relays settle", func() bool { return clock.Waiters() >= 2 })
		}
		waitUntil(t, "bucket 7 published by polling", func() bool { return len(store.Pending(7)) == 0 })
		waitUntil(t, "B's listener restarted", func() bool { return b.tr.listens.Load() >= 2 && b.tr.listening() })
		// And hints work again.
		owner := store.Owners()[4]
		store.AddToBucket(4, msgs(1, "orders")...)
		a.r.Notifier().NotifyBucket(4)
		waitUntil(t, "bucket 4 published after the restart", func() bool { return len(store.Pending(4)) == 0 })
		_ = owner
	})

	t.Run("send_failure_drops_the_batch_and_backs_off", func(t *testing.T) {
		clock, store, h, a, _ := twoPods(t, time.Hour)
		a.tr.sendFail.Store(true)
		a.r.Notifier().NotifyBucket(5)
		// The failed send, then the sender's backoff timer (the relays'
		// own timers count among the waiters too).
		waitUntil(t, "A's send fails", func() bool { return a.tr.failed.Load() >= 1 })
		waitUntil(t, "A's sender backs off", func() bool { return clock.Waiters() >= 3 })
		a.tr.sendFail.Store(false)
		clock.Advance(relay.DefaultErrorBackoff)
		store.AddToBucket(6, msgs(1, "orders")...)
		a.r.Notifier().NotifyBucket(6)
		waitUntil(t, "bucket 6 published after the backoff", func() bool { return len(store.Pending(6)) == 0 })
		for _, s := range h.sent() {
			if slices.Contains(s, 5) {
				t.Fatalf("hub carried %v; the failed batch [5] must be dropped, not resent", h.sent())
			}
		}
	})

	t.Run("cancellation_waits_for_running_callbacks_and_leaves_no_listener", func(t *testing.T) {
		_, _, h, a, b := twoPods(t, time.Hour)
		b.tr.inFn = make(chan struct{}, 1)
		b.tr.slowFn = make(chan struct{})
		// inFn and slowFn are read by B's running Listen only after the next
		// delivery, which happens below.
		if err := h.endpoint().Publish(context.Background(), []int{4}); err != nil {
			t.Fatal(err)
		}
		<-b.tr.inFn // B's callback is about to run and blocks in slowFn
		b.cancel()
		select {
		case err := <-b.done:
			t.Fatalf("Run returned %v while a transport callback was running", err)
		case <-time.After(20 * time.Millisecond):
		}
		close(b.tr.slowFn)
		select {
		case err := <-b.done:
			b.done <- err
			if err != nil {
				t.Fatalf("Run = %v; want nil", err)
			}
		case <-time.After(waitLimit):
			t.Fatal("Run did not return")
		}
		if n := b.tr.active.Load(); n != 0 {
			t.Fatalf("%d Listen calls still running after Run returned; want 0", n)
		}
		_ = a
	})
}
