package gormstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Two relays sharing one SQLite database split the 8 buckets between them.
func Example() {
	dir, _ := os.MkdirTemp("", "gormstore-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open(filepath.Join(dir, "outbox.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	cfg := outbox.Config{} // 8 buckets, default table names: share it with outbox.Plugin
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		panic(err)
	}
	clock := relaytest.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a, _ := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock})
	b, _ := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock})

	ctx := context.Background()
	round := func(s *gormstore.Store, id string) []int {
		l, err := s.AcquireBucketLeases(ctx, id, s.BucketCount(), 30*time.Second)
		if err != nil {
			panic(err)
		}
		return l.Owned
	}
	fmt.Println("a alone:", round(a, "relay-a"))
	fmt.Println("b joins:", round(b, "relay-b"))
	fmt.Println("a frees its excess:", round(a, "relay-a"))
	fmt.Println("b claims them:", round(b, "relay-b"))
	// Output:
	// a alone: [0 1 2 3 4 5 6 7]
	// b joins: []
	// a frees its excess: [0 1 2 3]
	// b claims them: [4 5 6 7]
}
