package gormstore_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestPoolWithoutIdleRoomIsNamed: a pool that keeps no idle connection
// (database/sql's default of 2 is the common case: a relay keeps more
// statements in flight) reopens a database session for every statement,
// which slowed a drain's fetches and deletes by tens of milliseconds each
// and said nothing. The store must warn, naming SetMaxIdleConns, as soon
// as a lease round or a delete (at most one check a second) sees 50 or
// more such closes within 30 s — not at the window's end, nor only at a
// lease round: a drain's churn may be over by then — at most once an hour,
// and not while the pool keeps its connections.
func TestPoolWithoutIdleRoomIsNamed(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := newConfig(t, db, 4)
			sqlDB, err := db.DB()
			if err != nil {
				t.Fatal(err)
			}
			var logs strings.Builder
			clock := relaytest.NewManualClock(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))
			store, err := gormstore.New(db, gormstore.Options{Config: cfg, HostClock: clock,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			round := func() {
				t.Helper()
				if _, err := store.AcquireBucketLeases(ctx, "relay-1", 4, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			statements := func(n int) {
				t.Helper()
				for range n {
					if _, err := nextBatch(ctx, store, 0, 10, 0); err != nil {
						t.Fatal(err)
					}
				}
			}
			warnings := func() int { return strings.Count(logs.String(), "SetMaxIdleConns") }

			// A pool with idle room: no warning.
			round()
			statements(150)
			clock.Advance(31 * time.Second)
			round()
			if n := warnings(); n != 0 {
				t.Fatalf("%d warnings while the pool kept its connections:\n%s", n, logs.String())
			}

			// No idle room: every statement closes its connection. The
			// next delete a second later warns, before any lease round.
			sqlDB.SetMaxIdleConns(0)
			statements(150)
			clock.Advance(2 * time.Second)
			if err := store.MarkPublished(ctx, []*outbox.Message{{ID: 1 << 40}}); err != nil {
				t.Fatal(err)
			}
			if n := warnings(); n != 1 || !strings.Contains(logs.String(), "level=WARN") {
				t.Fatalf("%d warnings at the delete after 150 closes in 2 s; want 1 at WARN:\n%s", n, logs.String())
			}
			t.Logf("%s", logs.String())

			// Still churning, within the hour: no second warning; after it, one.
			statements(150)
			clock.Advance(31 * time.Second)
			round()
			if n := warnings(); n != 1 {
				t.Fatalf("%d warnings within the hour; want 1", n)
			}
			clock.Advance(time.Hour)
			round()
			statements(150)
			clock.Advance(31 * time.Second)
			round()
			if n := warnings(); n != 2 {
				t.Fatalf("%d warnings an hour later, still churning; want 2", n)
			}
		})
	}
}
