package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/gorm"
)

// TestCommitWakesIdleRelay proves the commit-notification path end to end:
// with polling effectively disabled (an hour) and a manual clock that never
// moves, a commit through the plugin wakes the idle relay and the record is
// published; a rolled-back transaction's record never is; the table empties.
func TestCommitWakesIdleRelay(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			db := o.Open(t, nil)
			n := relay.NewNotifier()
			if err := db.Use(outbox.Plugin{Notifier: n}); err != nil {
				t.Fatal(err)
			}
			if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
				t.Fatal(err)
			}
			clock := relaytest.NewManualClock(t0)
			store, err := gormstore.New(db, gormstore.Options{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			pub := relaytest.NewPublisher()
			r, err := relay.New(store, pub, relay.Options{Clock: clock, PollInterval: time.Hour, Notifier: n, RelayID: "solo", SingleWriter: db.Dialector.Name() == "sqlite"})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			// The relay acquired every bucket, found nothing, and parked on
			// the clock, which this test never advances.
			if !clock.WaitForWaiters(ctx, 1) {
				t.Fatal("relay never went idle")
			}

			rolledBack := &outbox.Message{Topic: "orders", Key: []byte("a"), Value: []byte("rolled back")}
			err = db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(rolledBack).Error; err != nil {
					return err
				}
				return errors.New("business rule failed")
			})
			if err == nil {
				t.Fatal("rolled-back transaction = nil; want its error")
			}
			committed := &outbox.Message{Topic: "orders", Key: []byte("a"), Value: []byte("committed")}
			if err := db.Create(committed).Error; err != nil {
				t.Fatal(err)
			}
			if !pub.WaitCalls(ctx, 1) {
				t.Fatal("the commit did not wake the relay: nothing published")
			}
			var published []outbox.UUID
			for _, batch := range pub.Calls() {
				for _, m := range batch {
					published = append(published, m.MessageID)
				}
			}
			if len(published) != 1 || published[0] != committed.MessageID {
				t.Fatalf("published %v; want only the committed message %s (never the rolled-back %s)", published, committed.MessageID, rolledBack.MessageID)
			}
			waitOutboxEmpty(ctx, t, db)
			if now := clock.Now(); !now.Equal(t0) {
				t.Fatalf("clock moved to %v; the test must publish without polling", now)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run = %v; want nil after cancellation", err)
			}
		})
	}
}
