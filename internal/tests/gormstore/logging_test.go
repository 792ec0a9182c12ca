package gormstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// traceLog is a GORM logger that records its traces and their errors.
type traceLog struct {
	mu     sync.Mutex
	traces int
	errs   []error
}

func (l *traceLog) LogMode(logger.LogLevel) logger.Interface { return l }
func (l *traceLog) Info(context.Context, string, ...any)     {}
func (l *traceLog) Warn(context.Context, string, ...any)     {}
func (l *traceLog) Error(context.Context, string, ...any)    {}
func (l *traceLog) Trace(_ context.Context, _ time.Time, fc func() (string, int64), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.traces++
	if err != nil {
		l.errs = append(l.errs, err)
	}
}

// TestStoreErrorsAreNotLoggedThroughGORM: a failing store statement (here
// the messages table is gone) returns its error to the relay, which logs it
// once with its context; it is not also printed through the user's GORM
// logger (at ERROR with the full SQL, every second while a database is
// down). Successful statements are still traced through it.
func TestStoreErrorsAreNotLoggedThroughGORM(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			log := &traceLog{}
			db := o.Open(t, &gorm.Config{Logger: log})
			cfg := newConfig(t, db, 4)
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if _, err := store.AcquireBucketLeases(ctx, "relay-a", 4, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := nextBatch(ctx, store, 0, 10, 0); err != nil {
				t.Fatal(err)
			}
			log.mu.Lock()
			traced := log.traces
			log.mu.Unlock()
			if traced == 0 {
				t.Fatal("no statement of the store was traced through GORM's logger")
			}
			if err := db.Migrator().DropTable(cfg.MessagesTableName()); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if _, err := nextBatch(ctx, store, 0, 10, 0); err == nil {
					t.Fatal("NextBatch on a dropped table succeeded")
				}
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			if len(log.errs) > 0 {
				t.Fatalf("GORM's logger was given %d store errors (first: %v); want none: the relay reports them", len(log.errs), log.errs[0])
			}
		})
	}
}
