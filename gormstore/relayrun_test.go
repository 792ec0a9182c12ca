package gormstore_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/relay"
)

// runRelay runs a relay on store with fast test timings until the test
// ends, then stops it (failing the test if it does not stop).
func runRelay(t *testing.T, store relay.Store, pub relay.Publisher, logger *slog.Logger) *relay.Relay {
	t.Helper()
	r, err := relay.New(store, pub, relay.Options{
		PollInterval: 50 * time.Millisecond, ErrorBackoff: 100 * time.Millisecond,
		LeaseDuration: 5 * time.Second, LeaseRenewInterval: time.Second,
		Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("relay did not stop")
		}
	})
	return r
}
