package gormstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// isTimeout reports whether err is a statement bound firing: the context
// deadline, or the database's own statement/lock timeout.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	s := strings.ToLower(err.Error())
	for _, m := range []string{"lock timeout", "statement timeout", "max_statement_time", "lock wait timeout", "interrupted", "database is locked"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// lockMessages holds, on its own connection, a lock that blocks the store's
// statements on the messages table: PostgreSQL LOCK TABLE … ACCESS
// EXCLUSIVE in an open transaction, MariaDB LOCK TABLES … WRITE, SQLite an
// open write transaction. The returned func releases it.
func lockMessages(t *testing.T, name string, db *gorm.DB, table string) func() {
	t.Helper()
	pool, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pool.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var stmts, undo []string
	switch name {
	case testenv.Postgres:
		stmts = []string{"BEGIN", `LOCK TABLE "` + table + `" IN ACCESS EXCLUSIVE MODE`}
		undo = []string{"ROLLBACK"}
	case testenv.MySQL:
		stmts = []string{"LOCK TABLES `" + table + "` WRITE"}
		undo = []string{"UNLOCK TABLES"}
	default:
		stmts = []string{"BEGIN IMMEDIATE", "DELETE FROM `" + table + "` WHERE id < 0"}
		undo = []string{"ROLLBACK"}
	}
	for _, s := range stmts {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	done := false
	release := func() {
		if done {
			return
		}
		done = true
		for _, s := range undo {
			if _, err := conn.ExecContext(ctx, s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
		_ = conn.Close()
	}
	t.Cleanup(release)
	return release
}

// waiting counts the server sessions of db's database waiting on a lock.
func waiting(t *testing.T, name string, db *gorm.DB) int64 {
	t.Helper()
	var n int64
	var q string
	switch name {
	case testenv.Postgres:
		q = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
	case testenv.MySQL:
		q = "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() AND (state LIKE 'Waiting%' OR state LIKE '%lock%')"
	default:
		return 0
	}
	if err := db.Raw(q).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// withBusyTimeout reopens a SQLite database with a busy timeout of d (the
// setting that bounds a write waiting for another writer).
func withBusyTimeout(t *testing.T, db *gorm.DB, d time.Duration) *gorm.DB {
	t.Helper()
	var list []struct {
		Seq  int
		Name string
		File string
	}
	if err := db.Raw("PRAGMA database_list").Scan(&list).Error; err != nil || len(list) == 0 {
		t.Fatalf("PRAGMA database_list = %v, %v", list, err)
	}
	dsn := fmt.Sprintf("file:%s?_busy_timeout=%d&_journal_mode=WAL&_txlock=immediate", list[0].File, d.Milliseconds())
	short, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p, err := short.DB(); err == nil {
			_ = p.Close()
		}
	})
	return short
}

// TestABlockedStatementReturnsWithinTheStatementTimeout: another session
// holds a lock on the messages table for longer than the store's
// StatementTimeout (1s); NextBatch, BucketsWithPending, PendingMetrics,
// MarkPublished and an acquisition round return a timeout error within a
// few times the bound, leave no statement waiting on the server, and
// succeed once the lock is released. On SQLite (WAL) only writes wait for a
// writer, bounded by the busy timeout (1s here, as recommended).
func TestABlockedStatementReturnsWithinTheStatementTimeout(t *testing.T) {
	const bound = time.Second
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			if o.Name == testenv.SQLite {
				db = withBusyTimeout(t, db, bound)
			}
			cfg := outbox.Config{BucketCount: 2}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			if err := raw(db).Table(cfg.MessagesTableName()).Create(pendingMessage(0)).Error; err != nil {
				t.Fatal(err)
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg, StatementTimeout: bound})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			if _, err := store.AcquireBucketLeases(ctx, "relay-a", 2, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			batch, err := nextBatch(ctx, store, 0, 10, 0)
			if err != nil || len(batch) != 1 {
				t.Fatalf("NextBatch = %d, %v; want 1 row", len(batch), err)
			}
			release := lockMessages(t, o.Name, db, cfg.MessagesTableName())
			ops := []struct {
				name  string
				call  func() error
				reads bool
			}{
				{"NextBatch", func() error { _, err := nextBatch(ctx, store, 0, 10, 0); return err }, true},
				{"BucketsWithPending", func() error { _, err := store.BucketsWithPending(ctx, []int{0, 1}); return err }, true},
				{"AcquireBucketLeases", func() error { _, err := store.AcquireBucketLeases(ctx, "relay-a", 2, 30*time.Second); return err }, false},
				{"PendingMetrics", func() error { _, err := store.PendingMetrics(ctx); return err }, true},
				{"MarkPublished", func() error { return store.MarkPublished(ctx, batch) }, false},
			}
			for _, op := range ops {
				start := time.Now()
				err := op.call()
				took := time.Since(start)
				if o.Name == testenv.SQLite && op.reads {
					// WAL: readers never wait for a writer.
					if err != nil {
						t.Errorf("%s on SQLite during a write transaction = %v; want success (WAL)", op.name, err)
					}
					continue
				}
				t.Logf("%s blocked: returned after %v: %v", op.name, took.Round(time.Millisecond), err)
				if o.Name != testenv.SQLite && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s blocked = %v; want an error wrapping context.DeadlineExceeded", op.name, err)
				}
				if err == nil || !isTimeout(err) {
					t.Errorf("%s blocked = %v; want a timeout error", op.name, err)
				}
				if took > 5*bound {
					t.Errorf("%s blocked took %v; want under 5 × %v", op.name, took, bound)
				}
			}
			time.Sleep(200 * time.Millisecond)
			if n := waiting(t, o.Name, db); n != 0 {
				t.Errorf("%d server sessions still wait on the lock after the store's calls returned; want 0", n)
			}
			release()
			if _, err := store.AcquireBucketLeases(ctx, "relay-a", 2, 30*time.Second); err != nil {
				t.Fatalf("AcquireBucketLeases after release: %v", err)
			}
			if got, err := nextBatch(ctx, store, 0, 10, 0); err != nil || len(got) != 1 {
				t.Fatalf("NextBatch after release = %d, %v; want 1 row", len(got), err)
			}
			if err := store.MarkPublished(ctx, batch); err != nil {
				t.Fatalf("MarkPublished after release: %v", err)
			}
			if p, err := store.PendingMetrics(ctx); err != nil || p.Count != 0 {
				t.Fatalf("PendingMetrics after release = %+v, %v; want 0 rows", p, err)
			}
		})
	}
}

// TestAStatementAbandonedByItsContext documents why the store bounds
// MariaDB statements on the server and PostgreSQL ones by their context
// only: when a context gives up a statement waiting for a lock, pgx closes
// the connection and sends a cancel request, so the server ends the
// statement; go-sql-driver only closes the connection, and the statement
// keeps waiting on the server (one more session per attempt, until the lock
// is released).
func TestAStatementAbandonedByItsContext(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		if o.Name == testenv.SQLite {
			continue
		}
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 2}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			release := lockMessages(t, o.Name, db, cfg.MessagesTableName())
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			var n int64
			err := db.WithContext(ctx).Table(cfg.MessagesTableName()).Count(&n).Error
			if err == nil {
				t.Fatal("a count on the locked table returned")
			}
			time.Sleep(300 * time.Millisecond)
			left := waiting(t, o.Name, db)
			t.Logf("after the context gave up (%v): %d server session(s) still waiting on the lock", err, left)
			switch o.Name {
			case testenv.Postgres:
				if left != 0 {
					t.Errorf("%d sessions still waiting; want 0 (pgx sends a cancel request)", left)
				}
			default:
				if left == 0 {
					t.Errorf("no session waiting; want 1 (go-sql-driver only closes the connection)")
				}
			}
			release()
		})
	}
}
