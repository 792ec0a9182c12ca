package gormstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"github.com/gorm-outbox/outbox/storetest"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

var errInjected = errors.New("gormstore_test: injected transient failure")

// nextBatch is s's batch of bucket: NextBatches of one request.
func nextBatch(ctx context.Context, s relay.Store, bucket, limit int, maxBytes int64) ([]*outbox.Message, error) {
	res, err := s.NextBatches(ctx, []relay.BatchRequest{{Buckets: []int{bucket}, Limit: limit, MaxBytes: maxBytes}})
	if err != nil {
		return nil, err
	}
	return res[0].Rows, res[0].Err
}

// failures makes the next create statement on a table fail once; the
// heartbeat is a create (upsert) on the relays table and seeding one on the
// leases table.
type failures struct {
	mu     sync.Mutex
	tables map[string]bool
}

func (f *failures) arm(table string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tables[table] = true
}

func (f *failures) check(db *gorm.DB) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tables[db.Statement.Table] {
		delete(f.tables, db.Statement.Table)
		_ = db.AddError(errInjected)
	}
}

// openDB opens a fresh database of o with the failure-injection callback.
func openDB(t *testing.T, o testenv.Opener) (*gorm.DB, *failures) {
	t.Helper()
	db := o.Open(t, nil)
	f := &failures{tables: map[string]bool{}}
	if err := db.Callback().Create().Before("gorm:create").Register("gormstore_test:fail", f.check); err != nil {
		t.Fatalf("register failure callback: %v", err)
	}
	return db, f
}

// newConfig migrates a fresh set of tables with unique names in db, so that
// scenarios share one database but never each other's rows.
func newConfig(t *testing.T, db *gorm.DB, n int) outbox.Config {
	t.Helper()
	p := testenv.Unique("s")
	cfg := outbox.Config{BucketCount: n, MessagesTable: p + "_messages", LeasesTable: p + "_leases", RelaysTable: p + "_relays"}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatalf("AutoMigrate: %v", err)
	}
	return cfg
}

func harness(t *testing.T, db *gorm.DB, f *failures, n int) *storetest.Harness {
	t.Helper()
	cfg := newConfig(t, db, n)
	if err := db.Exec("DELETE FROM " + cfg.LeasesTableName()).Error; err != nil { // a fresh backend: the first relay seeds
		t.Fatal(err)
	}
	return &storetest.Harness{
		NewStore: func(now func() time.Time) relay.Store {
			s, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clockOf(now)})
			if err != nil {
				t.Fatalf("gormstore.New: %v", err)
			}
			return s
		},
		Insert: func(ctx context.Context, msgs []*outbox.Message) error {
			return db.WithContext(ctx).Session(&gorm.Session{SkipHooks: true}).Table(cfg.MessagesTableName()).Create(&msgs).Error
		},
		Leases: func(ctx context.Context) ([]storetest.Lease, error) {
			var rows []outbox.BucketLease
			if err := db.WithContext(ctx).Table(cfg.LeasesTableName()).Order("bucket").Find(&rows).Error; err != nil {
				return nil, err
			}
			out := make([]storetest.Lease, len(rows))
			for i, r := range rows {
				out[i].Bucket = int(r.Bucket)
				if r.Owner != nil {
					out[i].Owner = *r.Owner
				}
				if r.ExpiresAtMs != 0 {
					out[i].ExpiresAt = time.UnixMilli(r.ExpiresAtMs).UTC()
				}
			}
			return out, nil
		},
		SetLease: func(ctx context.Context, l storetest.Lease) error {
			row := outbox.BucketLease{Bucket: int32(l.Bucket)}
			if l.Owner != "" {
				row.Owner = &l.Owner
			}
			if !l.ExpiresAt.IsZero() {
				row.ExpiresAtMs = l.ExpiresAt.UnixMilli()
			}
			return db.WithContext(ctx).Table(cfg.LeasesTableName()).Clauses(clause.OnConflict{UpdateAll: true}).Create(&row).Error
		},
		InsertCorrupt: func(ctx context.Context, bucket int) error {
			blob := outbox.EncodeHeaders(outbox.Headers{{Key: "k", Value: []byte("v")}})
			blob[0] = 9 // a codec version this build does not know
			m := &outbox.Message{MessageID: outbox.NewUUID(), Bucket: int32(bucket), Topic: "storetest", Key: []byte("corrupt"), CreatedAt: time.Now().UTC()}
			q := db.WithContext(ctx).Session(&gorm.Session{SkipHooks: true}).Table(cfg.MessagesTableName())
			if err := q.Create(m).Error; err != nil {
				return err
			}
			return db.WithContext(ctx).Table(cfg.MessagesTableName()).Where("id = ?", m.ID).Update("headers", blob).Error
		},
		FailNext: func(step storetest.Step) {
			switch step {
			case storetest.StepHeartbeat:
				f.arm(cfg.RelaysTableName())
			case storetest.StepSeed:
				f.arm(cfg.LeasesTableName())
			}
		},
	}
}

// TestConformance runs the storetest kit on every available database.
func TestConformance(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db, f := openDB(t, o)
			began := time.Now()
			storetest.Run(t, func(t *testing.T, n int) *storetest.Harness { return harness(t, db, f, n) })
			t.Logf("%s: conformance suite took %v", o.Name, time.Since(began).Round(time.Millisecond))
		})
	}
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	db := testenv.Databases(t)[0].Open(t, nil)
	for _, c := range []struct {
		name string
		db   *gorm.DB
		opts gormstore.Options
		want string
	}{
		{"nil_db", nil, gormstore.Options{}, "nil *gorm.DB"},
		{"negative_bucket_count", db, gormstore.Options{Config: outbox.Config{BucketCount: -1}}, "Config.BucketCount"},
		{"bad_table_name", db, gormstore.Options{Config: outbox.Config{LeasesTable: "x; DROP TABLE y"}}, "Config.LeasesTable"},
		{"negative_prune_interval", db, gormstore.Options{PruneInterval: -time.Second}, "Options.PruneInterval"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := gormstore.New(c.db, c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New = %v, %v; want an error naming %s", s, err, c.want)
			}
		})
	}
}

func TestBucketCountComesFromConfig(t *testing.T) {
	db := testenv.Databases(t)[0].Open(t, nil)
	for _, c := range []struct {
		cfg  outbox.Config
		want int
	}{{outbox.Config{}, outbox.DefaultBucketCount}, {outbox.Config{BucketCount: 3}, 3}} {
		s, err := gormstore.New(db, gormstore.Options{Config: c.cfg})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if got := s.BucketCount(); got != c.want {
			t.Errorf("BucketCount() with Config.BucketCount %d = %d; want %d", c.cfg.BucketCount, got, c.want)
		}
	}
}

// counter records the statements run on a db while armed.
type counter struct {
	mu    sync.Mutex
	on    bool
	stmts []string
}

func (c *counter) record(db *gorm.DB) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.on && db.Error == nil {
		c.stmts = append(c.stmts, db.Dialector.Explain(db.Statement.SQL.String(), db.Statement.Vars...))
	}
}

func (c *counter) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on, c.stmts = true, nil
}

func (c *counter) stop() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = false
	return c.stmts
}

func countingDB(t *testing.T, o testenv.Opener) (*gorm.DB, *counter) {
	t.Helper()
	db := o.Open(t, nil)
	c := &counter{}
	cb := db.Callback()
	for _, err := range []error{
		cb.Create().After("gorm:create").Register("count", c.record),
		cb.Query().After("gorm:query").Register("count", c.record),
		cb.Update().After("gorm:update").Register("count", c.record),
		cb.Delete().After("gorm:delete").Register("count", c.record),
		cb.Row().After("gorm:row").Register("count", c.record),
		cb.Raw().After("gorm:raw").Register("count", c.record),
	} {
		if err != nil {
			t.Fatalf("register counter: %v", err)
		}
	}
	return db, c
}

// TestIdleRoundStatements measures the statements of an acquisition round
// that changes nothing (a relay already holding its share) and of the other
// operations, logging their SQL.
func TestIdleRoundStatements(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			ctx := t.Context()
			db, c := countingDB(t, o)
			cfg := newConfig(t, db, 8)
			clock := relaytest.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			s, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			peer, _ := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock})
			measure := func(what string, f func() error) []string {
				t.Helper()
				c.start()
				err := f()
				stmts := c.stop()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				for _, q := range stmts {
					t.Logf("%s: %s", what, q)
				}
				return stmts
			}
			acquire := func(st *gormstore.Store, id string) func() error {
				return func() error { _, err := st.AcquireBucketLeases(ctx, id, 8, 30*time.Second); return err }
			}
			measure("first round", acquire(s, "relay-a"))
			measure("peer joins", acquire(peer, "relay-b"))
			measure("excess release round", acquire(s, "relay-a"))
			measure("claim round", acquire(peer, "relay-b"))
			clock.Advance(time.Second)
			measure("idle round (peer)", acquire(peer, "relay-b"))
			clock.Advance(time.Second)
			idle := measure("idle round", acquire(s, "relay-a"))
			// heartbeat, probe, active relays, snapshot, extend, read back.
			if len(idle) != 6 {
				t.Errorf("idle acquisition round ran %d statements; want 6", len(idle))
			}
			owned, _ := relaytest.Owned(s.AcquireBucketLeases(ctx, "relay-a", 8, 30*time.Second))
			measure("renew", func() error { _, err := s.RenewBucketLeases(ctx, "relay-a", owned, 30*time.Second); return err })
			measure("renew (no change)", func() error { _, err := s.RenewBucketLeases(ctx, "relay-a", owned, 30*time.Second); return err })
			measure("buckets with pending", func() error { _, err := s.BucketsWithPending(ctx, owned); return err })
			var batch []*outbox.Message
			measure("next batch", func() error { var err error; batch, err = nextBatch(ctx, s, owned[0], 500, 0); return err })
			measure("mark published", func() error {
				return s.MarkPublished(ctx, append(batch, &outbox.Message{ID: 1}, &outbox.Message{ID: 2}))
			})
			// A small table: the row estimate (none on SQLite), then the
			// exact count and oldest row (on SQLite two statements).
			if got := measure("pending metrics", func() error { _, err := s.PendingMetrics(ctx); return err }); len(got) != 2 {
				t.Errorf("PendingMetrics ran %d statements; want 2", len(got))
			}
			measure("release", func() error { return s.ReleaseBucketLeases(ctx, "relay-a") })
		})
	}
}

// TestStaleHeartbeatsArePruned: an acquisition round deletes the heartbeat
// rows of relays unseen for 10 × the lease duration, and of relays stopped
// more than one lease duration ago, at most once per PruneInterval; live
// and recently stopped relays stay.
func TestStaleHeartbeatsArePruned(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := newConfig(t, db, 4)
			clock := relaytest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			store, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock, PruneInterval: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			const lease = 30 * time.Second
			acquire := func(id string) {
				t.Helper()
				if _, err := store.AcquireBucketLeases(ctx, id, 4, lease); err != nil {
					t.Fatalf("AcquireBucketLeases(%s): %v", id, err)
				}
			}
			relays := func() []string {
				t.Helper()
				var ids []string
				if err := db.Table(cfg.RelaysTableName()).Order("relay_id").Pluck("relay_id", &ids).Error; err != nil {
					t.Fatal(err)
				}
				return ids
			}
			acquire("crashed")  // never seen again
			acquire("stopped")  // released below
			acquire("survivor") // keeps heartbeating
			if err := store.ReleaseBucketLeases(ctx, "stopped"); err != nil {
				t.Fatal(err)
			}
			clock.Advance(5 * time.Minute) // past 1 × lease for "stopped", not 10 × for "crashed"
			acquire("survivor")
			if got := relays(); !slices.Equal(got, []string{"crashed", "survivor"}) {
				t.Fatalf("relays after 5m = %v; want [crashed survivor] (the stopped relay pruned)", got)
			}
			clock.Advance(5 * time.Minute) // "crashed" unseen for 10m > 10 × 30s
			acquire("survivor")
			if got := relays(); !slices.Equal(got, []string{"survivor"}) {
				t.Fatalf("relays after 10m = %v; want [survivor]", got)
			}
		})
	}
}

// TestDeletedLeaseRowsNeverGiveABucketTwoOwners: after the lease rows are
// deleted under a running relay (a restore, a mistaken DELETE FROM
// outbox_leases), the next round of any relay recreates them (saying so at
// WARN) but none can claim them before the previous holder's lease has run
// out, whichever relay comes first: a peer starting on the emptied table,
// or the holder itself. The holder's renewal reports the leases lost.
func TestDeletedLeaseRowsNeverGiveABucketTwoOwners(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		for _, holderFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/holder_first=%v", o.Name, holderFirst), func(t *testing.T) {
				db := o.Open(t, nil)
				cfg := newConfig(t, db, 4)
				clock := relaytest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
				var logs strings.Builder
				open := func() *gormstore.Store {
					s, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
				holder, peer := open(), open()
				ctx := context.Background()
				const ld = 30 * time.Second
				round := func(s *gormstore.Store, id string) relay.Leases {
					t.Helper()
					l, err := s.AcquireBucketLeases(ctx, id, 4, ld)
					if err != nil {
						t.Fatalf("AcquireBucketLeases(%s): %v", id, err)
					}
					return l
				}
				if got := round(holder, "holder").Owned; len(got) != 4 {
					t.Fatalf("holder's first round = %v; want all 4 buckets", got)
				}
				held := clock.Now() // the holder trusts its leases until held + ld
				if err := db.Exec("DELETE FROM " + cfg.LeasesTableName()).Error; err != nil {
					t.Fatal(err)
				}
				clock.Advance(time.Second)
				order := []struct {
					s  *gormstore.Store
					id string
				}{{peer, "peer"}, {holder, "holder"}}
				if holderFirst {
					order[0], order[1] = order[1], order[0]
				}
				for clock.Now().Before(held.Add(ld)) {
					for _, r := range order {
						if l := round(r.s, r.id); len(l.Owned) != 0 || l.Unowned != 4 {
							t.Fatalf("%s's round %v after the lease rows were deleted = %+v; want none owned (the holder's lease may still run) and 4 unowned", r.id, clock.Now().Sub(held), l)
						}
					}
					clock.Advance(5 * time.Second)
				}
				if ok, err := holder.RenewBucketLeases(ctx, "holder", []int{0, 1, 2, 3}, ld); err != nil || ok {
					t.Fatalf("holder's renewal = %v, %v; want false (its leases are gone)", ok, err)
				}
				clock.Advance(time.Second)
				owned := map[int]string{}
				for range 2 {
					for _, r := range order {
						for _, b := range round(r.s, r.id).Owned {
							owned[b] = r.id
						}
					}
				}
				if len(owned) != 4 {
					t.Fatalf("owners once the holder's lease ran out = %v; want all 4 buckets owned", owned)
				}
				if !strings.Contains(logs.String(), "level=WARN msg=\"lease rows were missing") || !strings.Contains(logs.String(), "recreated=4") {
					t.Errorf("no WARN about the recreated lease rows:\n%s", logs.String())
				}
			})
		}
	}
}
