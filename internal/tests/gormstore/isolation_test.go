package gormstore_test

import (
	"context"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// readUncommittedPool opens a second pool on db's database whose every
// connection is at READ UNCOMMITTED by default, as a user's pool may be:
//
//   - MySQL/MariaDB: the DSN sets the session variable (tx_isolation on
//     MariaDB, transaction_isolation on MySQL) on every connection. Its lock
//     wait timeout is 3 s, so that a statement waiting on the test's open
//     transaction fails fast instead of hanging for InnoDB's 50 s.
//   - PostgreSQL: the DSN sets default_transaction_isolation, which
//     PostgreSQL runs as READ COMMITTED.
//   - SQLite: a single connection with PRAGMA read_uncommitted = 1, on the
//     private-cache (WAL) file testenv opens; the pragma only takes effect
//     in shared-cache mode, which the store does not support (package doc).
//
// It fails t unless the pool reports READ UNCOMMITTED.
func readUncommittedPool(t *testing.T, name string, db *gorm.DB) *gorm.DB {
	t.Helper()
	quiet := &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)}
	var pool *gorm.DB
	var err error
	var level, want string
	switch name {
	case testenv.MySQL:
		var dbName, version string
		if err := db.Raw("SELECT DATABASE(), VERSION()").Row().Scan(&dbName, &version); err != nil {
			t.Fatal(err)
		}
		c, err := mysqldrv.ParseDSN(os.Getenv(testenv.EnvMySQL))
		if err != nil {
			t.Fatal(err)
		}
		c.DBName, c.ParseTime, c.Loc = dbName, true, time.UTC
		variable := "transaction_isolation"
		if strings.Contains(strings.ToLower(version), "mariadb") {
			variable = "tx_isolation"
		}
		c.Params = map[string]string{variable: "'READ-UNCOMMITTED'", "innodb_lock_wait_timeout": "3"}
		if pool, err = gorm.Open(mysql.Open(c.FormatDSN()), quiet); err != nil {
			t.Fatal(err)
		}
		err = pool.Raw("SELECT @@" + variable).Row().Scan(&level)
		want = "READ-UNCOMMITTED"
	case testenv.Postgres:
		var dbName string
		if err := db.Raw("SELECT current_database()").Row().Scan(&dbName); err != nil {
			t.Fatal(err)
		}
		dsn := os.Getenv(testenv.EnvPostgres)
		if u, perr := url.Parse(dsn); perr == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
			u.Path = "/" + dbName
			q := u.Query()
			q.Set("default_transaction_isolation", "read uncommitted")
			u.RawQuery = q.Encode()
			dsn = u.String()
		} else {
			dsn += " dbname=" + dbName + " default_transaction_isolation='read uncommitted'"
		}
		if pool, err = gorm.Open(postgres.Open(dsn), quiet); err != nil {
			t.Fatal(err)
		}
		err = pool.Raw("SHOW transaction_isolation").Row().Scan(&level)
		want = "read uncommitted"
	case testenv.SQLite:
		var seq int
		var schema, file string
		if err := db.Raw("PRAGMA database_list").Row().Scan(&seq, &schema, &file); err != nil {
			t.Fatal(err)
		}
		if pool, err = gorm.Open(sqlite.Open("file:"+file+"?_busy_timeout=10000"), quiet); err != nil {
			t.Fatal(err)
		}
		sqlDB, _ := pool.DB()
		sqlDB.SetMaxOpenConns(1) // the pragma is per connection
		testenv.MustExec(t, pool, "PRAGMA read_uncommitted = 1")
		err = pool.Raw("PRAGMA read_uncommitted").Row().Scan(&level)
		want = "1"
	default:
		t.Fatalf("no READ UNCOMMITTED pool for %s", name)
	}
	if err != nil {
		t.Fatalf("read the pool's isolation level: %v", err)
	}
	if level != want {
		t.Fatalf("pool isolation level = %q; want %q", level, want)
	}
	t.Cleanup(func() {
		if sqlDB, err := pool.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return pool
}

// count counts the rows of table matching where, as a plain statement on db
// would see them: the precondition that the pool really reads dirty.
func count(t *testing.T, db *gorm.DB, table, where string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.Table(table).Where(where, args...).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMessageReadsIgnoreUncommittedRowsOnAReadUncommittedPool: on a pool
// whose connections default to READ UNCOMMITTED, NextBatch (1-row and
// 500-row batches, also what a relay serving several buckets at once calls),
// BucketsWithPending and PendingMetrics see only committed rows: a row of a
// transaction still open (then rolled back) is never returned, so the relay
// cannot publish a record that was never committed.
func TestMessageReadsIgnoreUncommittedRowsOnAReadUncommittedPool(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			ctx := t.Context()
			db := o.Open(t, nil)
			cfg := newConfig(t, db, 4)
			msgs := cfg.MessagesTableName()
			pool := readUncommittedPool(t, o.Name, db)
			store, err := gormstore.New(pool, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			committed := pendingMessage(0)
			if err := raw(db).Table(msgs).Create(committed).Error; err != nil {
				t.Fatal(err)
			}
			w := db.Begin()
			t.Cleanup(func() { w.Rollback() })
			for _, b := range []int32{0, 1} {
				if err := raw(w).Table(msgs).Create(pendingMessage(b)).Error; err != nil {
					t.Fatal(err)
				}
			}
			if o.Name == testenv.MySQL {
				if n := count(t, pool, msgs, "1 = 1"); n != 3 {
					t.Fatalf("a plain read on the pool sees %d rows; want 3 (the pool must read dirty for this test to mean anything)", n)
				}
			}

			for _, limit := range []int{1, 500} {
				got, err := nextBatch(ctx, store, 0, limit, 0)
				if err != nil {
					t.Fatalf("NextBatch(0, %d): %v", limit, err)
				}
				if len(got) != 1 || got[0].ID != committed.ID {
					t.Errorf("NextBatch(0, %d) = %d rows %v; want only the committed row %d", limit, len(got), ids(got), committed.ID)
				}
				got, err = nextBatch(ctx, store, 1, limit, 0)
				if err != nil {
					t.Fatalf("NextBatch(1, %d): %v", limit, err)
				}
				if len(got) != 0 {
					t.Errorf("NextBatch(1, %d) = rows %v; want none (bucket 1 holds only an uncommitted row)", limit, ids(got))
				}
			}
			pending, err := store.BucketsWithPending(ctx, []int{0, 1, 2, 3})
			if err != nil {
				t.Fatalf("BucketsWithPending: %v", err)
			}
			if !slices.Equal(pending, []int{0}) {
				t.Errorf("BucketsWithPending = %v; want [0]", pending)
			}
			metrics, err := store.PendingMetrics(ctx)
			if err != nil {
				t.Fatalf("PendingMetrics: %v", err)
			}
			if metrics.Count != 1 {
				t.Errorf("PendingMetrics().Count = %d; want 1", metrics.Count)
			}
			if err := w.Rollback().Error; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func ids(msgs []*outbox.Message) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// TestLeaseReadsIgnoreUncommittedWritesOnAReadUncommittedPool: on a pool
// whose connections default to READ UNCOMMITTED, an acquisition round reads
// only committed state. A transaction left open (then rolled back) that
// claims a peer's bucket for the relay, adds a live heartbeat and writes a
// row outside the bucket range changes nothing: the round neither reports
// the uncommitted claim as owned (snapshot and read-back), nor gives up a
// bucket to the uncommitted relay (active relays), nor fails on the
// uncommitted row (misconfiguration probe); and a renewal does not count the
// uncommitted claim as held.
//
// Not on SQLite, where the open write transaction blocks the round's own
// writes; its reads are only ever of committed data there (see
// TestMessageReadsIgnoreUncommittedRowsOnAReadUncommittedPool).
func TestLeaseReadsIgnoreUncommittedWritesOnAReadUncommittedPool(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			if o.Name == testenv.SQLite {
				t.Skip("SQLite has a single writer: the open transaction would block the round's heartbeat")
			}
			ctx := t.Context()
			db := o.Open(t, nil)
			cfg := newConfig(t, db, 4)
			pool := readUncommittedPool(t, o.Name, db)
			clock := relaytest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			const lease = 30 * time.Second
			// relay-b, the relay under test, sorts after its peer: with a third
			// live relay, relay-a would keep the odd bucket and relay-b give one up.
			b, err := gormstore.New(pool, gormstore.Options{Config: cfg, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			a, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			round := func(s *gormstore.Store, id string) []int {
				t.Helper()
				clock.Advance(time.Second)
				ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				got, err := relaytest.Owned(s.AcquireBucketLeases(ctx, id, 4, lease))
				if err != nil {
					t.Fatalf("AcquireBucketLeases(%s): %v", id, err)
				}
				return got
			}
			round(b, "relay-b") // all four
			round(a, "relay-a") // none free yet
			round(b, "relay-b") // releases two
			if got := round(a, "relay-a"); !slices.Equal(got, []int{2, 3}) {
				t.Fatalf("relay-a owns %v; want [2 3]", got)
			}

			w := db.Begin()
			t.Cleanup(func() { w.Rollback() })
			far := clock.Now().Add(time.Hour).UnixMilli()
			for _, err := range []error{
				w.Table(cfg.LeasesTableName()).Where("bucket = ?", 2).
					Updates(map[string]any{"owner": "relay-b", "expires_at_ms": far}).Error,
				w.Table(cfg.RelaysTableName()).Create(&outbox.RelayHeartbeat{RelayID: "relay-c", LastSeenMs: far}).Error,
				raw(w).Table(cfg.MessagesTableName()).Create(pendingMessage(7)).Error,
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			if o.Name == testenv.MySQL {
				if n := count(t, pool, cfg.LeasesTableName(), "owner = ?", "relay-b"); n != 3 {
					t.Fatalf("a plain read on the pool sees relay-b own %d leases; want 3 (the pool must read dirty for this test to mean anything)", n)
				}
			}

			if got := round(b, "relay-b"); !slices.Equal(got, []int{0, 1}) {
				t.Errorf("relay-b's round with an uncommitted claim, heartbeat and out-of-range row = %v; want [0 1]", got)
			}
			// The renewal's UPDATE skips bucket 2 (its committed owner is
			// relay-a); the read that then tells a lost lease from an unchanged
			// expiry must not count the uncommitted claim.
			if held, err := b.RenewBucketLeases(ctx, "relay-b", []int{0, 1, 2}, lease); err != nil || held {
				t.Errorf("RenewBucketLeases(relay-b, [0 1 2]) with bucket 2 claimed uncommitted = %v, %v; want false, nil", held, err)
			}
			if err := w.Rollback().Error; err != nil {
				t.Fatal(err)
			}
		})
	}
}
