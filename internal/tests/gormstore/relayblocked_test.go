package gormstore_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestARelayReportsABlockedStoreAndRecovers runs a real relay (short
// options, StatementTimeout 500ms) on each database; another session locks
// the messages table for longer than the bound: Health reports the store's
// timeout, and once the lock is released the relay recovers and publishes
// every row exactly once (no batch was in flight during the lock, so no
// documented redelivery applies).
func TestARelayReportsABlockedStoreAndRecovers(t *testing.T) {
	const bound = 500 * time.Millisecond
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			if o.Name == testenv.SQLite {
				db = withBusyTimeout(t, db, bound)
			}
			cfg := outbox.Config{BucketCount: 4}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			insert := func(n int) []outbox.UUID {
				t.Helper()
				var ids []outbox.UUID
				for i := range n {
					m := pendingMessage(int32(i % 4))
					if err := raw(db).Table(cfg.MessagesTableName()).Create(m).Error; err != nil {
						t.Fatal(err)
					}
					ids = append(ids, m.MessageID)
				}
				return ids
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg, StatementTimeout: bound})
			if err != nil {
				t.Fatal(err)
			}
			pub := relaytest.NewPublisher()
			r := runRelay(t, db, store, pub, slog.New(slog.NewTextHandler(io.Discard, nil)))
			waitFor := func(what string, cond func() bool) {
				t.Helper()
				deadline := time.Now().Add(20 * time.Second)
				for !cond() {
					if time.Now().After(deadline) {
						t.Fatalf("timed out waiting for %s (health %v, %d acknowledged)", what, r.Health(), len(pub.Acknowledged()))
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			want := insert(40)
			waitFor("the first 40 rows", func() bool { return len(pub.Acknowledged()) == 40 && r.Health() == nil })

			release := lockMessages(t, o.Name, db, cfg.MessagesTableName())
			start := time.Now()
			waitFor("Health to report the blocked store", func() bool { return r.Health() != nil })
			herr := r.Health()
			t.Logf("Health %v after the lock: %v", time.Since(start).Round(time.Millisecond), herr)
			if o.Name != testenv.SQLite && !errors.Is(herr, context.DeadlineExceeded) {
				t.Errorf("Health = %v; want the store's statement timeout (wrapping context.DeadlineExceeded)", herr)
			}
			time.Sleep(3 * bound) // a few failing cycles
			release()
			start = time.Now()
			want = append(want, insert(40)...)
			waitFor("recovery and the next 40 rows", func() bool { return len(pub.Acknowledged()) >= 80 && r.Health() == nil })
			t.Logf("recovered %v after the release", time.Since(start).Round(time.Millisecond))

			seen := map[outbox.UUID]int{}
			for _, m := range pub.Acknowledged() {
				seen[m.MessageID]++
			}
			for _, id := range want {
				if seen[id] != 1 {
					t.Errorf("message %v published %d times; want once", id, seen[id])
				}
			}
			if len(seen) != len(want) {
				t.Errorf("published %d distinct messages; want %d", len(seen), len(want))
			}
		})
	}
}
