package relay_test

import (
	"fmt"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

func TestEndToEndTakeoverGormstore(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		testTakeoverGormstore(t, o, false)
		if o.Name != testenv.SQLite {
			testTakeoverGormstore(t, o, true) // buckets served concurrently
		}
	}
}

func testTakeoverGormstore(t *testing.T, o testenv.Opener, concurrent bool) {
	name := o.Name + "_50000_rows_two_relays_forced_takeover"
	if concurrent {
		name += "_concurrent_buckets"
	}
	{
		t.Run(name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			const total = 50000
			rows := make([]*outbox.Message, 0, total)
			for i := 0; i < total; i++ {
				rows = append(rows, outbox.NewStringMessage("orders", fmt.Sprintf("order-%d", i%997), "v"))
			}
			if err := db.CreateInBatches(rows, 1000).Error; err != nil {
				t.Fatalf("insert: %v", err)
			}
			clock := relaytest.NewManualClock(t0)
			a, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			b, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			pending := func() int {
				var n int64
				if err := db.Model(&outbox.Message{}).Count(&n).Error; err != nil {
					t.Fatalf("count: %v", err)
				}
				return int(n)
			}
			runTakeover(t, e2eEnv{clock: clock, storeA: a, storeB: b, pending: pending, total: total, singleWriter: o.Name == testenv.SQLite})
		})
	}
}
