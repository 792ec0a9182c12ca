package gormstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestNowIsTheClockOfTheLeases: Store.Now reads the database's clock, as
// the leases do, whatever the host clock says (here 40 s fast), and
// Options.Clock when set.
func TestNowIsTheClockOfTheLeases(t *testing.T) {
	ctx := context.Background()
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 2}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			s, err := gormstore.New(db, gormstore.Options{Config: cfg, HostClock: skewed(40 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			before := dbClockMs(t, db)
			now, err := s.Now(ctx)
			if err != nil {
				t.Fatalf("Now: %v", err)
			}
			after := dbClockMs(t, db)
			if got := now.UnixMilli(); got < before-clockTolerance || got > after+clockTolerance {
				t.Errorf("Now = %d; want the database's clock, between %d and %d", got, before, after)
			}
			if now.Location() != time.UTC {
				t.Errorf("Now().Location() = %v; want UTC", now.Location())
			}

			fixed := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
			s, err = gormstore.New(db, gormstore.Options{Config: cfg, Clock: nowFunc(func() time.Time { return fixed })})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := s.Now(ctx); err != nil || !got.Equal(fixed) {
				t.Errorf("Now with Options.Clock = %v, %v; want %v", got, err, fixed)
			}
		})
	}
}
