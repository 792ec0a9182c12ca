package inbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// remaining returns the message ids left in the default table, sorted.
func remaining(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var ids []string
	if err := db.Model(&inbox.ProcessedMessage{}).Order("message_id").Pluck("message_id", &ids).Error; err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestPurgeRemovesOnlyExpiredIDs records ids over ten days of a manual
// clock, then purges with a 7-day retention: only the ids recorded more
// than 7 days before the clock's time go, in statements of at most
// PurgeBatchSize rows; a purged id is processed again, a kept one is
// still a duplicate.
func TestPurgeRemovesOnlyExpiredIDs(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			ctx := withTimeout(t, time.Minute)
			rec := &testenv.SQLRecorder{}
			db := o.Open(t, &gorm.Config{Logger: rec})
			start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			clock := relaytest.NewManualClock(start)
			ib, reader := setup(t, db, inbox.Options{Clock: clock, Retention: 7 * 24 * time.Hour, PurgeBatchSize: 2})
			// Day 0: five ids; day 3: two; day 10: one.
			handle := func(id string) {
				t.Helper()
				if out, err := ib.Handle(ctx, "h", record("orders", 0, 0, id), func(*gorm.DB) error { return nil }); err != nil || out != inbox.Processed {
					t.Fatalf("Handle(%s) = %v, %v; want processed", id, out, err)
				}
			}
			for i := range 5 {
				handle(fmt.Sprintf("day0-%d", i))
			}
			clock.Advance(3 * 24 * time.Hour)
			handle("day3-0")
			handle("day3-1")
			clock.Advance(7 * 24 * time.Hour) // day 10: the cutoff is day 3
			handle("day10-0")

			rec.Reset()
			n, err := ib.Purge(ctx)
			if err != nil || n != 5 {
				t.Fatalf("Purge = %d, %v; want 5, nil", n, err)
			}
			if got, want := remaining(t, db), []string{"day10-0", "day3-0", "day3-1"}; !slices.Equal(got, want) {
				t.Fatalf("ids left = %v; want %v", got, want)
			}
			var deletes int
			for _, s := range rec.Statements() {
				if strings.HasPrefix(strings.ToUpper(s), "DELETE") {
					deletes++
				}
			}
			if deletes != 3 {
				t.Fatalf("Purge ran %d DELETE statements; want 3 (2 + 2 + 1 rows)", deletes)
			}
			collect(t, reader).Check(t, readings{inbox.MetricPurged: 5})

			// Exactly at the boundary: recorded at day 3 12:00, purged once
			// the clock is past day 10 12:00.
			clock.Set(start.Add(10 * 24 * time.Hour))
			if n, err := ib.Purge(ctx); err != nil || n != 0 {
				t.Fatalf("Purge at the boundary = %d, %v; want 0", n, err)
			}
			clock.Advance(time.Millisecond)
			if n, err := ib.Purge(ctx); err != nil || n != 2 {
				t.Fatalf("Purge past the boundary = %d, %v; want 2", n, err)
			}
			handle("day0-0") // purged: processed again
			if out, _ := ib.Handle(ctx, "h", record("orders", 0, 0, "day10-0"), func(*gorm.DB) error { return nil }); out != inbox.Duplicate {
				t.Fatalf("Handle(day10-0) = %v; want duplicate (kept)", out)
			}
		})
	}
}

// TestRunPurgePurgesEveryInterval: RunPurge purges at once, then each time
// the manual clock passes PurgeInterval, and returns nil when its context
// ends.
func TestRunPurgePurgesEveryInterval(t *testing.T) {
	db := testenv.Databases(t)[0].Open(t, nil) // SQLite
	clock := relaytest.NewManualClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	ib, reader := setup(t, db, inbox.Options{Clock: clock, Retention: time.Hour, PurgeInterval: 10 * time.Minute})
	ctx := withTimeout(t, time.Minute)
	for i := range 3 {
		if _, err := ib.Handle(ctx, "h", record("orders", 0, 0, fmt.Sprint("a", i)), func(*gorm.DB) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(2 * time.Hour)
	if _, err := ib.Handle(ctx, "h", record("orders", 0, 0, "b"), func(*gorm.DB) error { return nil }); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ib.RunPurge(runCtx) }()

	if !clock.WaitForWaiters(ctx, 1) {
		t.Fatal("RunPurge never waited for its interval")
	}
	if got := remaining(t, db); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("ids after the first purge = %v; want [b]", got)
	}
	// Each Advance fires the interval's timer; RunPurge purges, then waits
	// on a new timer, which WaitForWaiters sees.
	clock.Advance(50 * time.Minute)
	if !clock.WaitForWaiters(ctx, 1) {
		t.Fatal("RunPurge did not wait again after its second purge")
	}
	if got := remaining(t, db); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("ids 50 minutes after b = %v; want [b] (kept)", got)
	}
	clock.Advance(20 * time.Minute)
	if !clock.WaitForWaiters(ctx, 1) {
		t.Fatal("RunPurge did not wait again after its third purge")
	}
	if got := remaining(t, db); len(got) != 0 {
		t.Fatalf("ids 70 minutes after b = %v; want none", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunPurge = %v; want nil after the stop", err)
	}
	collect(t, reader).Check(t, readings{inbox.MetricPurged: 4})
}
