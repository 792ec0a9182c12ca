package relay_test

import (
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestHealth proves that Health is nil only while Run runs and its latest
// cycle succeeded: a store error or a failed lease acquisition makes it
// report the error until a later cycle (acquisition) succeeds, and a stopped
// relay is unhealthy.
func TestHealth(t *testing.T) {
	h := newHarness(t, relay.Options{}, nil)
	if err := h.r.Health(); err == nil {
		t.Fatalf("Health() before Run = nil; want an error")
	}
	h.start()
	h.waitIdle()
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() after a successful cycle = %v; want nil", err)
	}

	h.ops.failNext(relaytest.OpBucketsWithPending, 1)
	h.advanceIdle(relay.DefaultPollInterval) // discovery fails; the relay backs off
	if err := h.r.Health(); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Health() after a failed cycle = %v; want the store error", err)
	}
	h.advanceIdle(relay.DefaultErrorBackoff) // the retry succeeds
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() after the store recovered = %v; want nil", err)
	}

	// A failed lease acquisition (the database refuses the heartbeat, say)
	// makes the relay unhealthy until an acquisition succeeds again.
	h.ops.failNext(relaytest.OpAcquire, 1)
	h.advanceIdle(relay.DefaultLeaseRenewInterval)
	if err := h.r.Health(); err == nil || !strings.Contains(err.Error(), "acquire leases") {
		t.Fatalf("Health() after a failed acquisition = %v; want the acquisition error", err)
	}
	h.advanceIdle(relay.DefaultErrorBackoff) // the next acquisition succeeds
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() after a successful acquisition = %v; want nil", err)
	}

	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v; want nil", err)
	}
	if err := h.r.Health(); err == nil {
		t.Fatalf("Health() after Run returned = nil; want an error")
	}
}
