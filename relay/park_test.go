package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// errTooLarge is a publish error that recurs for the row as stored.
var errTooLarge = fmt.Errorf("record of 2000000 bytes: %w", relay.ErrUnpublishable)

// keyed returns n messages of key, values key-0, key-1…
func keyed(key string, n int) []*outbox.Message {
	out := make([]*outbox.Message, n)
	for i := range out {
		out[i] = outbox.NewStringMessage("orders", key, fmt.Sprintf("%s-%d", key, i))
	}
	return out
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

// parkReasons returns the parked rows' reasons by id.
func parkReasons(s *relaytest.MemStore) map[int64]string {
	out := map[int64]string{}
	for _, p := range s.Parked() {
		out[p.ID] = p.Reason
	}
	return out
}

// keyOrder returns the ids of key's acknowledged messages, deduplicated by
// message id (first copy kept), in acknowledgement order.
func keyOrder(acked []*outbox.Message, key string) []int64 {
	seen := map[outbox.UUID]bool{}
	var out []int64
	for _, m := range acked {
		if string(m.Key) != key || seen[m.MessageID] {
			continue
		}
		seen[m.MessageID] = true
		out = append(out, m.ID)
	}
	return out
}

// rejectKey makes h's publisher fail rows of key with err while reject
// holds, acknowledging the rows before them.
func rejectKey(h *harness, key string, err error, reject *atomic.Bool) {
	h.pub.SetHandler(relaytest.FailWhere(func(m *outbox.Message) error {
		if string(m.Key) == key && reject.Load() {
			return err
		}
		return nil
	}))
}

// TestCorruptHeadRowIsParkedAloneWhileOtherBucketsFlow: an undecodable row
// at the head of bucket 0 is parked alone with a "corrupt row: " reason, at
// once; the healthy rows of buckets 1–7 and the row behind it (of the same
// key: a corrupt row holds nothing) are published; the relay stays healthy
// and says so once at WARN.
func TestCorruptHeadRowIsParkedAloneWhileOtherBucketsFlow(t *testing.T) {
	logs := &recorder{}
	reader := metrictest.NewReader()
	h := newHarness(t, relay.Options{Logger: slog.New(logs), MeterProvider: reader.MeterProvider()}, nil)
	bad := h.store.AddCorrupt(0, []byte("c"))
	behind := outbox.NewStringMessage("orders", "c", "behind")
	h.store.AddToBucket(0, behind)
	for b := 1; b < relay.DefaultBucketCount; b++ {
		h.store.AddToBucket(b, msgs(1, fmt.Sprintf("t%d", b))...)
	}
	h.start()
	h.waitFor("every healthy row published", func() bool { return h.store.Len() == 1 })
	h.waitIdle()

	parked := h.store.Parked()
	if len(parked) != 1 || parked[0].ID != bad {
		t.Fatalf("parked rows = %+v; want row %d alone", parked, bad)
	}
	if r := parked[0].Reason; !strings.HasPrefix(r, relay.CorruptReasonPrefix) || !strings.Contains(r, "not a UUID") {
		t.Fatalf("parked reason = %q; want %q followed by the decoding error", r, relay.CorruptReasonPrefix)
	}
	if parked[0].MessageID != relaytest.CorruptMessageID {
		t.Fatalf("parked message id = %q; want the stored %q", parked[0].MessageID, relaytest.CorruptMessageID)
	}
	for b := range relay.DefaultBucketCount {
		if got := publishedIDs(h.pub.Calls(), b); len(got) != 1 {
			t.Fatalf("bucket %d published %v; want its one healthy row", b, got)
		}
	}
	if got := publishedIDs(h.pub.Calls(), 0); got[0] != behind.ID {
		t.Fatalf("bucket 0 published %v; want the row behind the corrupt one, %d", got, behind.ID)
	}
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() = %v; want nil (a parked row is not the relay's failure)", err)
	}
	warns := logs.matching(slog.LevelWarn, "corrupt row parked")
	if len(warns) != 1 {
		t.Fatalf("%d WARN lines about the corrupt row; want 1", len(warns))
	}
	if v, ok := attr(warns[0], "id"); !ok || v.Int64() != bad {
		t.Fatalf("WARN line names id %v; want %d", v, bad)
	}
	if v, ok := attr(warns[0], "bucket"); !ok || v.Int64() != 0 {
		t.Fatalf("WARN line names bucket %v; want 0", v)
	}
	if n := len(logs.matching(slog.LevelWarn, "bucket store error")); n != 0 {
		t.Fatalf("%d bucket store error lines; want none (the bucket does not back off)", n)
	}
	if got := reader.SumBy(t, relay.MetricParked, relay.AttrParkReason); got[relay.ParkReasonCorrupt] != 1 || got[relay.ParkReasonHeld] != 0 {
		t.Fatalf("%s = %v; want corrupt=1, nothing held", relay.MetricParked, got)
	}
}

// TestUnpublishableRowParksItsKeyWhileOtherKeysFlow: keys A and B share a
// bucket and A's first row is rejected with an ErrUnpublishable error.
// After ParkAfter single-row attempts the row is parked; A's later rows,
// those present then and those committed after, are held behind it; B's
// rows flow. Once the broker accepts A and an operator requeues A, A's rows
// are published in id order and the store ends empty.
func TestUnpublishableRowParksItsKeyWhileOtherKeysFlow(t *testing.T) {
	logs := &recorder{}
	reader := metrictest.NewReader()
	h := newHarness(t, relay.Options{BucketCount: 1, Logger: slog.New(logs), MeterProvider: reader.MeterProvider()}, nil)
	a, b := keyed("A", 3), keyed("B", 3)
	h.store.AddToBucket(0, a[0], b[0], a[1], b[1], a[2])
	var reject atomic.Bool
	reject.Store(true)
	rejectKey(h, "A", errTooLarge, &reject)
	h.start()
	h.waitIdle()
	h.step("B's first row published", 20, func() bool { return !slices.Contains(ids(h.store.Pending(0)), b[0].ID) })
	bWaited := h.clock.Now().Sub(t0)
	t.Logf("B's first row waited %v behind A's rejected row (clock time)", bWaited)

	// A's row was tried alone ParkAfter times, then parked; B flowed.
	alone := 0
	for _, c := range h.pub.Calls() {
		if len(c) == 1 && c[0].ID == a[0].ID {
			alone++
		}
	}
	if alone != relay.DefaultParkAfter {
		t.Fatalf("A's row was published alone %d times before parking; want ParkAfter = %d", alone, relay.DefaultParkAfter)
	}
	h.waitFor("B's second row published", func() bool { return h.store.Len() == 3 })
	if got, want := h.store.ParkedIDs(0), []int64{a[0].ID}; !slices.Equal(got, want) {
		t.Fatalf("parked ids = %v; want A's head row %v (the store holds the rows behind it)", got, want)
	}
	reasons := parkReasons(h.store)
	if r := reasons[a[0].ID]; !strings.Contains(r, errTooLarge.Error()) {
		t.Fatalf("A's head row parked with reason %q; want the publish error", r)
	}

	// Rows committed after the parking: A's are held, B's flow.
	a3, b2 := keyed("A", 1)[0], keyed("B", 1)[0]
	h.store.AddToBucket(0, a3, b2)
	h.r.Notifier().NotifyBucket(0)
	h.waitFor("the late B row published", func() bool { return !slices.Contains(ids(h.store.Pending(0)), b2.ID) })
	h.waitIdle()
	if got := ids(h.store.Pending(0)); !slices.Contains(got, a3.ID) {
		t.Fatalf("pending ids = %v; want the late A row %d held too", got, a3.ID)
	}
	for _, m := range h.pub.Acknowledged() {
		if string(m.Key) == "A" {
			t.Fatalf("A's row %d was acknowledged while A is parked", m.ID)
		}
	}
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() = %v; want nil", err)
	}
	warns := logs.matching(slog.LevelWarn, "row parked")
	if len(warns) != 1 {
		t.Fatalf("%d 'row parked' WARN lines; want 1", len(warns))
	}
	for k, want := range map[string]any{"id": a[0].ID, "key": "A", "topic": "orders", "attempts": int64(relay.DefaultParkAfter), "message_id": a[0].MessageID.String()} {
		if v, ok := attr(warns[0], k); !ok || fmt.Sprint(v.Any()) != fmt.Sprint(want) {
			t.Fatalf("WARN attribute %s = %v; want %v", k, v, want)
		}
	}
	if got := reader.SumBy(t, relay.MetricParked, relay.AttrParkReason); got[relay.ParkReasonUnpublishable] != 1 || got[relay.ParkReasonHeld] != 0 {
		t.Fatalf("%s = %v; want unpublishable=1, held=0", relay.MetricParked, got)
	}

	// The fix, then the requeue: A's rows go out in id order.
	reject.Store(false)
	n, err := h.store.RequeueParked(context.Background(), relay.ParkedSelector{Key: []byte("A")})
	if err != nil || n != 1 {
		t.Fatalf("RequeueParked(A) = %d, %v; want 1 (the parked head), nil", n, err)
	}
	h.r.Notifier().NotifyBucket(0)
	h.waitFor("the store empty", func() bool { return h.store.Len() == 0 })
	if got, want := keyOrder(h.pub.Acknowledged(), "A"), []int64{a[0].ID, a[1].ID, a[2].ID, a3.ID}; !slices.Equal(got, want) {
		t.Fatalf("A acknowledged in order %v; want %v", got, want)
	}
	if got, want := keyOrder(h.pub.Acknowledged(), "B"), []int64{b[0].ID, b[1].ID, b2.ID}; !slices.Equal(got, want) {
		t.Fatalf("B acknowledged in order %v; want %v", got, want)
	}
}

// TestParkPolicyDecidesWhichFailuresPark: under the default policy a
// transient error parks nothing however long it lasts; ParkNever parks
// nothing even for ErrUnpublishable; ParkAnyFailure parks after ParkAfter
// single-row failures of any kind.
func TestParkPolicyDecidesWhichFailuresPark(t *testing.T) {
	for _, tc := range []struct {
		name      string
		policy    relay.ParkPolicy
		err       error
		parkAfter int
		wantPark  bool
	}{
		{"transient_errors_never_park_by_default", relay.ParkUnpublishable, errBroker, 0, false},
		{"never_parks_nothing_even_unpublishable", relay.ParkNever, errTooLarge, 0, false},
		{"any_failure_parks_transient_errors", relay.ParkAnyFailure, errBroker, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, relay.Options{BucketCount: 1, ParkPolicy: tc.policy, ParkAfter: tc.parkAfter}, nil)
			a, b := keyed("A", 2), keyed("B", 1)
			h.store.AddToBucket(0, a[0], b[0], a[1])
			var reject atomic.Bool
			reject.Store(true)
			rejectKey(h, "A", tc.err, &reject)
			h.start()
			h.waitIdle()
			aloneCalls := func() int {
				n := 0
				for _, c := range h.pub.Calls() {
					if len(c) == 1 && c[0].ID == a[0].ID {
						n++
					}
				}
				return n
			}
			if tc.wantPark {
				h.step("A's head row parked", 20, func() bool { return len(h.store.ParkedIDs(0)) > 0 })
				if got := aloneCalls(); got != tc.parkAfter {
					t.Fatalf("A's row published alone %d times before parking; want ParkAfter = %d", got, tc.parkAfter)
				}
				h.waitFor("B published", func() bool { return h.store.Len() == 2 })
				if got, want := h.store.ParkedIDs(0), []int64{a[0].ID}; !slices.Equal(got, want) {
					t.Fatalf("parked = %v; want %v", got, want)
				}
				return
			}
			h.step("ten single-row attempts", 200, func() bool { return aloneCalls() >= 10 })
			if got := h.store.Parked(); len(got) != 0 {
				t.Fatalf("parked %+v after %d failures; want nothing parked", got, aloneCalls())
			}
			if got := h.store.Len(); got != 3 {
				t.Fatalf("%d rows left; want all 3 kept (the bucket is stopped by its head row)", got)
			}
			reject.Store(false)
			h.step("the store empty", 40, func() bool { return h.store.Len() == 0 })
			if got, want := keyOrder(h.pub.Acknowledged(), "A"), ids(a); !slices.Equal(got, want) {
				t.Fatalf("A acknowledged %v; want %v", got, want)
			}
		})
	}
}

// TestParkingWaitsForTheFleet: while Fleet reports CanPark false (a live relay
// predates parking) an unpublishable row is retried, not parked, with one
// WARN line for the row; once the fleet can park, the row parks at its next
// failure.
func TestParkingWaitsForTheFleet(t *testing.T) {
	logs := &recorder{}
	h := newHarness(t, relay.Options{BucketCount: 1, Logger: slog.New(logs)}, nil)
	h.store.SetFleetCanPark(false)
	a, b := keyed("A", 1), keyed("B", 1)
	h.store.AddToBucket(0, a[0], b[0])
	var reject atomic.Bool
	reject.Store(true)
	rejectKey(h, "A", errTooLarge, &reject)
	h.start()
	h.waitIdle()
	calls := func() int { return len(h.pub.Calls()) }
	h.step("eight attempts", 200, func() bool { return calls() >= 8 })
	if got := h.store.Parked(); len(got) != 0 {
		t.Fatalf("parked %+v while the fleet cannot park; want nothing", got)
	}
	if n := len(logs.matching(slog.LevelWarn, "parking deferred")); n != 1 {
		t.Fatalf("%d 'parking deferred' WARN lines after %d attempts; want 1", n, calls())
	}
	h.store.SetFleetCanPark(true)
	h.step("A's row parked", 40, func() bool { return len(h.store.ParkedIDs(0)) == 1 })
	h.waitFor("B published", func() bool { return h.store.Len() == 1 })
	if n := len(logs.matching(slog.LevelWarn, "parking deferred")); n != 1 {
		t.Fatalf("%d 'parking deferred' WARN lines; want still 1", n)
	}
}

// TestCorruptRowWaitsForTheFleet: a corrupt head row is not parked while
// the fleet cannot park: its bucket backs off as before, and the row parks
// once the fleet can.
func TestCorruptRowWaitsForTheFleet(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 1}, nil)
	h.store.SetFleetCanPark(false)
	h.store.AddCorrupt(0, nil)
	h.store.AddToBucket(0, msgs(1, "t")...)
	h.start()
	h.waitIdle()
	h.step("five fetches", 200, func() bool { return h.ops.count(relaytest.OpNextBatches) >= 5 })
	if len(h.store.Parked()) != 0 || len(h.pub.Calls()) != 0 {
		t.Fatalf("parked %v, published %d batches while the fleet cannot park; want neither", h.store.Parked(), len(h.pub.Calls()))
	}
	h.store.SetFleetCanPark(true)
	h.step("the healthy row published", 40, func() bool { return h.store.Len() == 1 })
	if got := h.store.Parked(); len(got) != 1 || !strings.HasPrefix(got[0].Reason, relay.CorruptReasonPrefix) {
		t.Fatalf("parked %+v; want the corrupt row", got)
	}
}

// noRelease is a MemStore whose relays never release their leases: a
// crashed relay, as its peers see it.
type noRelease struct{ *relaytest.MemStore }

func (noRelease) ReleaseBucketLeases(context.Context, string) error { return nil }

// peer returns a harness for another relay on h's store and clock; wrap,
// when non-nil, replaces the store it sees.
func (h *harness) peer(id string, opts relay.Options, wrap func(*relaytest.MemStore) relay.Store) *harness {
	h.t.Helper()
	p := &harness{t: h.t, clock: h.clock, store: h.store, pub: relaytest.NewPublisher(), idle: make(chan struct{}, 1), ops: h.ops}
	opts.RelayID = id
	opts.Clock = h.clock
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var s relay.Store = h.store
	if wrap != nil {
		s = wrap(h.store)
	}
	r, err := relay.New(s, p.pub, opts)
	if err != nil {
		h.t.Fatalf("relay.New: %v", err)
	}
	relay.SetIdleHook(r, func() {
		select {
		case p.idle <- struct{}{}:
		default:
		}
	})
	p.r = r
	return p
}

// TestParkedKeysSurviveRestartAndTakeover: a relay that starts owning a
// bucket (after a peer's graceful stop, or taking over from a crashed one)
// holds the key's new rows (its store's read does)
// instead of publishing them, even though its broker would accept them.
func TestParkedKeysSurviveRestartAndTakeover(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 1}, nil)
	a := keyed("A", 4)
	b := keyed("B", 3)
	h.store.AddToBucket(0, a[0], b[0], a[1])
	var reject atomic.Bool
	reject.Store(true)
	rejectKey(h, "A", errTooLarge, &reject)
	h.start()
	h.waitIdle()
	h.step("A parked and B published", 20, func() bool { return h.store.Len() == 2 && len(h.store.ParkedIDs(0)) == 1 })
	if err := h.stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}

	// Restart: relay-b takes the released bucket; its broker accepts A.
	h.store.AddToBucket(0, a[2], b[1])
	rb := h.peer("relay-b", relay.Options{BucketCount: 1}, func(m *relaytest.MemStore) relay.Store { return noRelease{m} })
	rb.start()
	rb.waitFor("relay-b published B's new row", func() bool { return len(rb.pub.Acknowledged()) == 1 })
	rb.waitIdle()
	if got, want := ids(h.store.Pending(0)), []int64{a[0].ID, a[1].ID, a[2].ID}; !slices.Equal(got, want) {
		t.Fatalf("after the restart rows left = %v; want %v (A's new row held)", got, want)
	}
	if err := rb.stop(); err != nil {
		t.Fatalf("relay-b Run = %v", err)
	}

	// Takeover: relay-b "crashed" (no release); relay-c waits out its lease.
	h.store.AddToBucket(0, a[3], b[2])
	h.clock.Advance(relay.DefaultLeaseDuration + time.Second)
	rc := h.peer("relay-c", relay.Options{BucketCount: 1}, nil)
	rc.start()
	rc.waitFor("relay-c published B's newest row", func() bool { return len(rc.pub.Acknowledged()) == 1 })
	rc.waitIdle()
	if got, want := ids(h.store.Pending(0)), []int64{a[0].ID, a[1].ID, a[2].ID, a[3].ID}; !slices.Equal(got, want) {
		t.Fatalf("after the takeover rows left = %v; want %v", got, want)
	}
	for _, p := range []*harness{rb, rc} {
		for _, m := range p.pub.Calls() {
			for _, r := range m {
				if string(r.Key) == "A" {
					t.Fatalf("row %d of the parked key A was published after a restart", r.ID)
				}
			}
		}
	}

	if n, err := h.store.RequeueParked(context.Background(), relay.ParkedSelector{ID: a[0].ID}); err != nil || n != 1 {
		t.Fatalf("RequeueParked(ID %d) = %d, %v; want 1, nil", a[0].ID, n, err)
	}
	rc.r.Notifier().NotifyBucket(0)
	rc.waitFor("the store empty", func() bool { return h.store.Len() == 0 })
	if got, want := keyOrder(rc.pub.Acknowledged(), "A"), ids(a); !slices.Equal(got, want) {
		t.Fatalf("A acknowledged %v; want %v", got, want)
	}
}

// requeueOnOp makes store call op requeue key (once armed) just before it
// runs, to land a requeue in the window between a relay's fetch and its
// hold.
func requeueOnOp(h *harness, op string, key []byte, armed *atomic.Bool) {
	h.ops.setBlock(op, func(ctx context.Context) error {
		if armed.CompareAndSwap(true, false) {
			if _, err := h.store.RequeueParked(ctx, relay.ParkedSelector{Key: key}); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestRequeueRacingAPublishingRelayKeepsKeyOrder: a requeue of key A that
// lands while the relay publishes, just before it fetches, or while new
// rows of A keep arriving: A's rows are acknowledged in
// id order, with no gap, and nothing stays parked. A and B share bucket 1,
// served beside bucket 0 (key C).
func TestRequeueRacingAPublishingRelayKeepsKeyOrder(t *testing.T) {
	for _, window := range []string{relaytest.OpNextBatches, "free-running"} {
		t.Run(window, func(t *testing.T) {
			logs := &recorder{}
			h := newHarness(t, relay.Options{BucketCount: 2, BatchSize: 4, Logger: slog.New(logs)}, asConcurrent)
			var all []*outbox.Message
			add := func(ms ...*outbox.Message) {
				h.store.AddToBucket(1, ms...)
				h.store.AddToBucket(0, keyed("C", 1)...)
				all = append(all, ms...)
				h.r.Notifier().NotifyBucket(0)
				h.r.Notifier().NotifyBucket(1)
			}
			var reject atomic.Bool
			reject.Store(true)
			rejectKey(h, "A", errTooLarge, &reject)
			add(keyed("A", 1)[0], keyed("B", 1)[0], keyed("A", 1)[0])
			h.start()
			h.waitIdle()
			h.step("A parked", 20, func() bool { return len(h.store.ParkedIDs(1)) == 1 })
			reject.Store(false)

			var armed atomic.Bool
			if window != "free-running" {
				requeueOnOp(h, window, []byte("A"), &armed)
			}
			// Rows of A and B arrive while the requeue lands.
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := range 30 {
					if i == 10 {
						if window == "free-running" {
							if _, err := h.store.RequeueParked(context.Background(), relay.ParkedSelector{Key: []byte("A")}); err != nil {
								t.Errorf("RequeueParked: %v", err)
							}
						} else {
							armed.Store(true)
						}
					}
					add(keyed("A", 1)[0], keyed("B", 1)[0])
				}
			}()
			<-done
			h.waitFor("the store empty", func() bool { return !armed.Load() && h.store.Len() == 0 })
			if got := h.store.Parked(); len(got) != 0 {
				t.Fatalf("parked at the end: %+v; want nothing", got)
			}
			var wantA []int64
			for _, m := range all {
				if string(m.Key) == "A" {
					wantA = append(wantA, m.ID)
				}
			}
			if got := keyOrder(h.pub.Acknowledged(), "A"); !slices.Equal(got, wantA) {
				t.Fatalf("A acknowledged %v; want %v (id order, no gap)", got, wantA)
			}
		})
	}
}

// TestParkOptionsAreValidated: ParkAfter must not be negative and ParkPolicy
// must be one of the three policies; New names the option.
func TestParkOptionsAreValidated(t *testing.T) {
	store := relaytest.NewMemStore(1, nil)
	for _, tc := range []struct {
		opts relay.Options
		want string
	}{
		{relay.Options{ParkAfter: -1}, "Options.ParkAfter"},
		{relay.Options{ParkPolicy: relay.ParkPolicy(7)}, "Options.ParkPolicy"},
		{relay.Options{ParkPolicy: -1}, "Options.ParkPolicy"},
	} {
		if _, err := relay.New(store, relaytest.NewPublisher(), tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v; want an error naming %s", tc.opts, err, tc.want)
		}
	}
	for _, p := range []relay.ParkPolicy{relay.ParkUnpublishable, relay.ParkNever, relay.ParkAnyFailure} {
		if _, err := relay.New(store, relaytest.NewPublisher(), relay.Options{ParkPolicy: p, ParkAfter: 1}); err != nil {
			t.Errorf("New(ParkPolicy %v) = %v; want nil", p, err)
		}
	}
}

// TestParkedMessagesGauge: outbox.parked.messages reports the parked rows
// of the latest backlog sample, and outbox.pending.messages leaves them out.
func TestParkedMessagesGauge(t *testing.T) {
	reader := metrictest.NewReader()
	h := newHarness(t, relay.Options{BucketCount: 1, MetricsBacklog: true, MetricsInterval: time.Minute, MeterProvider: reader.MeterProvider()}, nil)
	h.store.AddCorrupt(0, nil)
	h.store.AddToBucket(0, msgs(2, "t")...)
	if v, ok := reader.Read(t).Values[relay.MetricParkedMessages]; ok {
		t.Fatalf("%s = %v before any sample; want no value", relay.MetricParkedMessages, v)
	}
	h.start()
	h.waitFor("the corrupt row parked and the rest published", func() bool { return h.store.Len() == 1 && len(h.store.Parked()) == 1 })
	h.waitFor("a sample after the parking", func() bool {
		h.clock.Advance(time.Minute)
		got := reader.Read(t).Values
		return got[relay.MetricParkedMessages] == 1 && got[relay.MetricPendingMessages] == 0
	})
}
