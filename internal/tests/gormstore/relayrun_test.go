package gormstore_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/gorm"
)

// runRelay runs a relay on store with fast test timings until the test
// ends, then stops it (failing the test if it does not stop).
func runRelay(t *testing.T, db *gorm.DB, store relay.Store, pub relay.Publisher, logger *slog.Logger) *relay.Relay {
	t.Helper()
	r, err := relay.New(store, pub, relay.Options{
		PollInterval: 50 * time.Millisecond, ErrorBackoff: 100 * time.Millisecond,
		LeaseDuration: 5 * time.Second, LeaseRenewInterval: time.Second,
		Logger: logger, SingleWriter: db.Dialector.Name() == "sqlite",
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

// TestRunWithoutTheTablesFailsNamingThem: a relay on a store whose tables
// were never created stops at once with an error that names the missing
// tables and outbox.AutoMigrate and wraps relay.ErrMisconfigured (it
// retried every round forever, logging "no such table", and Run returned
// nil when cancelled). MissingTables names them too, and none once they
// exist.
func TestRunWithoutTheTablesFailsNamingThem(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 2, MessagesTable: "nt_messages", LeasesTable: "nt_leases", RelaysTable: "nt_relays"}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatalf("New without the tables: %v; want it to succeed (it does no I/O)", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if missing, err := store.MissingTables(ctx); err != nil || !slices.Equal(missing, []string{"nt_messages", "nt_leases", "nt_relays"}) {
				t.Errorf("MissingTables = %v, %v; want the three", missing, err)
			}
			r, err := relay.New(store, relaytest.NewPublisher(), relay.Options{BucketCount: 2, ErrorBackoff: 10 * time.Millisecond, SingleWriter: db.Dialector.Name() == "sqlite"})
			if err != nil {
				t.Fatal(err)
			}
			err = r.Run(ctx)
			if !errors.Is(err, relay.ErrMisconfigured) || !strings.Contains(err.Error(), "missing outbox tables nt_messages, nt_leases, nt_relays") ||
				!strings.Contains(err.Error(), "outbox.AutoMigrate") {
				t.Errorf("Run = %v; want ErrMisconfigured naming the three tables and outbox.AutoMigrate", err)
			}
			if ctx.Err() != nil {
				t.Errorf("Run returned only when its context ended")
			}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			if missing, err := store.MissingTables(ctx); err != nil || len(missing) != 0 {
				t.Errorf("MissingTables after AutoMigrate = %v, %v; want none", missing, err)
			}
		})
	}
}

// TestTableMissingAfterAFirstRoundIsRetriedNotFatal: once an acquisition
// round has succeeded, a table that goes missing (renamed during a
// migration, say) fails the rounds without relay.ErrMisconfigured, so the
// relay retries them, and the round after the table is back succeeds.
func TestTableMissingAfterAFirstRoundIsRetriedNotFatal(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 2, MessagesTable: "tm_messages", LeasesTable: "tm_leases", RelaysTable: "tm_relays"}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if _, err := store.AcquireBucketLeases(ctx, "r1", 2, time.Minute); err != nil {
				t.Fatalf("first round: %v", err)
			}
			if err := db.Migrator().RenameTable("tm_relays", "tm_relays_away"); err != nil {
				t.Fatal(err)
			}
			_, err = store.AcquireBucketLeases(ctx, "r1", 2, time.Minute)
			if err == nil || errors.Is(err, relay.ErrMisconfigured) {
				t.Errorf("round without the heartbeat table = %v; want an error that is not ErrMisconfigured", err)
			}
			if err := db.Migrator().RenameTable("tm_relays_away", "tm_relays"); err != nil {
				t.Fatal(err)
			}
			if got, err := relaytest.Owned(store.AcquireBucketLeases(ctx, "r1", 2, time.Minute)); err != nil || len(got) != 2 {
				t.Errorf("round with the table back = %v, %v; want both buckets", got, err)
			}
		})
	}
}
