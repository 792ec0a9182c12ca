package relay_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// TestHealthReportsAuthenticationFailure proves that a publish failing to
// authenticate to the broker (an error wrapping ErrPublisherAuth, as
// kafkapub's SASL failures do, or a broker certificate that does not
// verify) makes Health report it, wrapping the publish error, with the rows
// kept; and that the first acknowledged publish makes the relay healthy
// again. Other publish failures keep Health nil
// (TestPublishFailureKeepsTheRelayHealthy).
func TestHealthReportsAuthenticationFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cause error
	}{
		{"sasl", fmt.Errorf("metadata: [58] SASL Authentication Failed: %w", relay.ErrPublisherAuth)},
		{"sasl_mechanism", fmt.Errorf("metadata: [33] Unsupported SASL Mechanism: %w", relay.ErrPublisherAuth)},
		{"tls_unknown_ca", fmt.Errorf("metadata: %w", x509.UnknownAuthorityError{})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, relay.Options{}, nil)
			h.store.AddToBucket(0, msgs(3, "t")...)
			h.pub.SetHandler(func(context.Context, []*outbox.Message) relay.Result {
				return relay.Result{Err: fmt.Errorf("relay: publish message x to t: %w", tc.cause)}
			})
			h.start()
			h.waitFor("the failed publish", func() bool { return len(h.pub.Calls()) == 1 })
			h.waitIdle()
			err := h.r.Health()
			if err == nil || !errors.Is(err, tc.cause) {
				t.Fatalf("Health() after an authentication failure = %v; want an error wrapping %v", err, tc.cause)
			}
			t.Logf("Health() = %v", err)
			if n := h.store.Len(); n != 3 {
				t.Fatalf("%d rows pending after the failure; want all 3 kept", n)
			}

			h.pub.SetHandler(nil) // the credentials are fixed (a rotated secret, say)
			for i := 0; i < 10 && h.store.Len() > 0; i++ {
				h.advanceIdle(relay.DefaultLeaseRenewInterval)
			}
			if n := h.store.Len(); n != 0 {
				t.Fatalf("%d rows pending after the retries succeeded; want 0", n)
			}
			if err := h.r.Health(); err != nil {
				t.Fatalf("Health() after an acknowledged publish = %v; want nil", err)
			}
			if err := h.stop(); err != nil {
				t.Fatalf("Run() = %v; want nil", err)
			}
		})
	}
}
