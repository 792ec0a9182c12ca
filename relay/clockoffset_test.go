package relay_test

import (
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// offsetStore is a MemStore that reports a settable clock offset, as
// gormstore does.
type offsetStore struct {
	*relaytest.MemStore
	mu     sync.Mutex
	offset time.Duration
	unc    time.Duration
	ok     bool
}

func (s *offsetStore) ClockOffset() (time.Duration, time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offset, s.unc, s.ok
}

func (s *offsetStore) set(offset, unc time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offset, s.unc, s.ok = offset, unc, true
}

const clockWarning = "host's clock is off from the database's"

// TestClockOffsetGaugeIsObservedOnlyWhenTheStoreReportsOne: the gauge
// outbox.clock.offset is absent while the store has measured nothing, then
// reports the store's offset in seconds (database minus host), sign kept.
func TestClockOffsetGaugeIsObservedOnlyWhenTheStoreReportsOne(t *testing.T) {
	reader := metrictest.NewReader()
	mp := reader.MeterProvider()
	var st *offsetStore
	h := newHarness(t, relay.Options{BucketCount: 2, MeterProvider: mp}, func(m *relaytest.MemStore) relay.Store {
		st = &offsetStore{MemStore: m}
		return st
	})
	h.start()
	h.waitIdle()
	if v, ok := reader.Read(t).Values[relay.MetricClockOffset]; ok {
		t.Fatalf("%s = %v before the store measured an offset; want it absent", relay.MetricClockOffset, v)
	}
	st.set(-40*time.Second-250*time.Millisecond, 3*time.Millisecond)
	if v, ok := reader.Read(t).Values[relay.MetricClockOffset]; !ok || math.Abs(v-(-40.25)) > 1e-9 {
		t.Fatalf("%s = %v (present %v); want -40.25", relay.MetricClockOffset, v, ok)
	}
	st.set(1500*time.Millisecond, 0)
	if v := reader.Read(t).Values[relay.MetricClockOffset]; math.Abs(v-1.5) > 1e-9 {
		t.Fatalf("%s = %v; want 1.5", relay.MetricClockOffset, v)
	}
}

// TestClockOffsetWarningIsLoggedOnceAboveTheThresholdAndAgainAfterItCameBack:
// one WARN when the offset (beyond its uncertainty) exceeds
// ClockOffsetWarnThreshold, none while it stays above, none for an offset
// within its uncertainty of the threshold, and a new one only after the
// offset came back within the threshold.
func TestClockOffsetWarningIsLoggedOnceAboveTheThresholdAndAgainAfterItCameBack(t *testing.T) {
	logs := &recorder{}
	var st *offsetStore
	h := newHarness(t, relay.Options{BucketCount: 2, Logger: slog.New(logs)}, func(m *relaytest.MemStore) relay.Store {
		st = &offsetStore{MemStore: m}
		return st
	})
	const th = relay.ClockOffsetWarnThreshold
	st.set(th/2, time.Millisecond)
	h.start()
	h.waitIdle()
	warnings := func() int { return len(logs.matching(slog.LevelWarn, clockWarning)) }
	// round runs one more acquisition round with the store reporting offset.
	round := func(offset, unc time.Duration) {
		t.Helper()
		st.set(offset, unc)
		before := h.ops.count(relaytest.OpAcquire)
		h.advanceIdle(relay.DefaultLeaseRenewInterval)
		if h.ops.count(relaytest.OpAcquire) == before {
			t.Fatalf("no acquisition round after %v", relay.DefaultLeaseRenewInterval)
		}
	}
	steps := []struct {
		offset, unc time.Duration
		want        int
		why         string
	}{
		{th/2 + th, time.Second, 0, "an offset within its uncertainty of the threshold"},
		{-40 * time.Second, 2 * time.Millisecond, 1, "-40s"},
		{-41 * time.Second, 2 * time.Millisecond, 1, "still above"},
		{th + th/2, time.Millisecond, 1, "above with the other sign"},
		{th - time.Millisecond, time.Millisecond, 1, "back within the threshold"},
		{th + 100*time.Millisecond, 10 * time.Millisecond, 2, "above again"},
	}
	for i, s := range steps {
		round(s.offset, s.unc)
		if got := warnings(); got != s.want {
			t.Fatalf("step %d (%s: offset %v ± %v): %d warnings; want %d", i, s.why, s.offset, s.unc, got, s.want)
		}
	}
	rec := logs.matching(slog.LevelWarn, clockWarning)[0]
	if v, ok := attr(rec, "offset"); !ok || v.Duration() != -40*time.Second {
		t.Fatalf("warning's offset attribute = %v (%v); want -40s", v, ok)
	}
	for _, want := range []string{"leases do not depend on it", "created_at", "backlog ages"} {
		if !strings.Contains(rec.Message, want) {
			t.Errorf("warning %q does not say %q", rec.Message, want)
		}
	}
	if n := len(logs.matching(slog.LevelInfo, "back within the threshold")); n != 1 {
		t.Errorf("%d 'back within the threshold' lines; want 1", n)
	}
}
