package outbox_test

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// recorder is a non-blocking BucketNotifier that records every notification.
type recorder struct {
	mu     sync.Mutex
	events [][]int // one entry per call; nil for NotifyCommitted
}

func (r *recorder) NonBlockingNotifier() {}
func (r *recorder) NotifyCommitted() {
	r.mu.Lock()
	r.events = append(r.events, nil)
	r.mu.Unlock()
}
func (r *recorder) NotifyBucket(b int) {
	r.mu.Lock()
	r.events = append(r.events, []int{b})
	r.mu.Unlock()
}
func (r *recorder) NotifyBuckets(bs []int) {
	r.mu.Lock()
	r.events = append(r.events, slices.Clone(bs))
	r.mu.Unlock()
}
func (r *recorder) take() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.events
	r.events = nil
	return e
}

// notifyingDB opens a fresh database with the plugin reporting to a new
// recorder and the default outbox tables migrated.
func notifyingDB(t *testing.T, o testenv.Opener, cfg *gorm.Config) (*gorm.DB, *recorder) {
	t.Helper()
	rec := &recorder{}
	db := o.Open(t, cfg)
	if err := db.Use(outbox.Plugin{Notifier: rec}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	return db, rec
}

// inBucket returns a message pinned (by partition) to bucket b of 8.
func inBucket(b int32) *outbox.Message {
	return &outbox.Message{Topic: "orders", Partition: &b, Value: []byte("v")}
}

// failCommitSetup prepares db so that failCommit makes the enclosing
// transaction's COMMIT fail, by dialect.
func failCommitSetup(t *testing.T, name string, db *gorm.DB) {
	t.Helper()
	switch name {
	case testenv.Postgres:
		testenv.MustExec(t, db, "CREATE TABLE guard (id integer, CONSTRAINT guard_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
	case testenv.SQLite:
		testenv.MustExec(t, db, "CREATE TABLE parent (id integer PRIMARY KEY)",
			"CREATE TABLE child (pid integer REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
	}
}

// failCommit runs in tx and arranges for its COMMIT to fail.
func failCommit(t *testing.T, name string, db, tx *gorm.DB) {
	t.Helper()
	switch name {
	case testenv.Postgres:
		testenv.MustExec(t, tx, "INSERT INTO guard VALUES (1)", "INSERT INTO guard VALUES (1)")
	case testenv.SQLite:
		testenv.MustExec(t, tx, "INSERT INTO child VALUES (99)")
	case testenv.MySQL:
		var id int64
		if err := tx.Raw("SELECT CONNECTION_ID()").Scan(&id).Error; err != nil {
			t.Fatal(err)
		}
		testenv.MustExec(t, db, fmt.Sprintf("KILL %d", id))
	}
}

func TestCommitNotifications(t *testing.T) {
	type scenario struct {
		name string
		// run writes and returns the buckets it expects to be notified with
		// after commit (nil: no notification at all).
		run func(t *testing.T, o testenv.Opener, db *gorm.DB, rec *recorder) []int
	}
	noneBefore := func(t *testing.T, rec *recorder) {
		t.Helper()
		if e := rec.take(); len(e) != 0 {
			t.Fatalf("notified %v before commit; want nothing yet", e)
		}
	}
	scenarios := []scenario{
		{"implicit_transaction_notifies_its_bucket", func(t *testing.T, _ testenv.Opener, db *gorm.DB, _ *recorder) []int {
			if err := db.Create(inBucket(3)).Error; err != nil {
				t.Fatal(err)
			}
			return []int{3}
		}},
		{"explicit_begin_commit_notifies_distinct_buckets_once_after_commit", func(t *testing.T, _ testenv.Opener, db *gorm.DB, rec *recorder) []int {
			tx := db.Begin()
			for _, b := range []int32{5, 1, 5} {
				if err := tx.Create(inBucket(b)).Error; err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Create(&[]outbox.Message{*inBucket(2), *inBucket(1)}).Error; err != nil {
				t.Fatal(err)
			}
			noneBefore(t, rec)
			if err := tx.Commit().Error; err != nil {
				t.Fatal(err)
			}
			return []int{1, 2, 5}
		}},
		{"db_transaction_notifies_once_after_commit", func(t *testing.T, _ testenv.Opener, db *gorm.DB, rec *recorder) []int {
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&order{Amount: 1}).Error; err != nil {
					return err
				}
				if err := tx.Create(inBucket(4)).Error; err != nil {
					return err
				}
				noneBefore(t, rec)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return []int{4}
		}},
		{"rolled_back_savepoint_is_forgotten_and_nesting_still_works", func(t *testing.T, _ testenv.Opener, db *gorm.DB, rec *recorder) []int {
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(inBucket(1)).Error; err != nil {
					return err
				}
				inner := tx.Transaction(func(tx2 *gorm.DB) error {
					if err := tx2.Create(inBucket(6)).Error; err != nil {
						return err
					}
					return errors.New("inner fails")
				})
				if inner == nil {
					t.Fatalf("inner transaction = nil; want its error")
				}
				if err := tx.Transaction(func(tx2 *gorm.DB) error { return tx2.Create(inBucket(7)).Error }); err != nil {
					return err
				}
				noneBefore(t, rec)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var bs []int32
			db.Model(&outbox.Message{}).Order("bucket").Pluck("bucket", &bs)
			if !slices.Equal(bs, []int32{1, 7}) {
				t.Fatalf("committed rows in buckets %v; want [1 7] (the rolled-back savepoint's row gone)", bs)
			}
			return []int{1, 7}
		}},
		{"rollback_never_notifies", func(t *testing.T, _ testenv.Opener, db *gorm.DB, _ *recorder) []int {
			tx := db.Begin()
			if err := tx.Create(inBucket(2)).Error; err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback().Error; err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"failed_statement_never_notifies", func(t *testing.T, _ testenv.Opener, db *gorm.DB, _ *recorder) []int {
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(inBucket(2)).Error; err != nil {
					return err
				}
				return tx.Exec("INSERT INTO no_such_table VALUES (1)").Error
			})
			if err == nil {
				t.Fatal("transaction with a failing statement = nil; want an error")
			}
			// An implicit transaction whose INSERT fails.
			if err := db.Scopes(outbox.WithConfig(outbox.Config{MessagesTable: "missing_outbox"})).Create(inBucket(3)).Error; err == nil {
				t.Fatal("Create into a missing table = nil; want an error")
			}
			return nil
		}},
		{"failed_commit_never_notifies", func(t *testing.T, o testenv.Opener, db *gorm.DB, _ *recorder) []int {
			failCommitSetup(t, o.Name, db)
			tx := db.Begin()
			if err := tx.Create(inBucket(2)).Error; err != nil {
				t.Fatal(err)
			}
			failCommit(t, o.Name, db, tx)
			if err := tx.Commit().Error; err == nil {
				t.Fatal("Commit = nil; want the forced commit failure")
			}
			return nil
		}},
	}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			for _, prepare := range []bool{false, true} {
				for _, skip := range []bool{false, true} {
					t.Run(fmt.Sprintf("prepare=%v/skipdefaulttx=%v", prepare, skip), func(t *testing.T) {
						for _, sc := range scenarios {
							t.Run(sc.name, func(t *testing.T) {
								db, rec := notifyingDB(t, o, &gorm.Config{PrepareStmt: prepare, SkipDefaultTransaction: skip})
								if err := db.AutoMigrate(&order{}); err != nil {
									t.Fatal(err)
								}
								rec.take()
								want := sc.run(t, o, db, rec)
								got := rec.take()
								if want == nil {
									if len(got) != 0 {
										t.Fatalf("notified %v; want no notification", got)
									}
									return
								}
								if len(got) != 1 || !slices.Equal(got[0], want) {
									t.Fatalf("notifications = %v; want exactly one with buckets %v", got, want)
								}
							})
						}
					})
				}
			}
		})
	}
}

func TestSessionsKeepNotifying(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db, rec := notifyingDB(t, o, nil)
			sqlDB, err := db.DB()
			if err != nil || sqlDB == nil || sqlDB.Ping() != nil {
				t.Fatalf("db.DB() = %v, %v; want the *sql.DB", sqlDB, err)
			}
			tx := db.Begin()
			if inner, err := tx.DB(); err != nil || inner != sqlDB {
				t.Fatalf("tx.DB() = %v, %v; want the same *sql.DB", inner, err)
			}
			tx.Rollback()
			rec.take()
			variants := map[string]*gorm.DB{
				"session":         db.Session(&gorm.Session{}),
				"with_context":    db.WithContext(t.Context()),
				"scopes":          db.Scopes(func(d *gorm.DB) *gorm.DB { return d }),
				"prepare_session": db.Session(&gorm.Session{PrepareStmt: true}),
			}
			for name, d := range variants {
				if err := d.Create(inBucket(6)).Error; err != nil {
					t.Fatalf("%s: Create = %v", name, err)
				}
				if got := rec.take(); len(got) != 1 || !slices.Equal(got[0], []int{6}) {
					t.Fatalf("%s: notifications = %v; want [[6]]", name, got)
				}
			}
		})
	}
}

// TestThePoolIsReachableThroughDBBehindTheWrappers proves what the Setup
// docs say of the wrappers: the pools GORM hands out are no longer a
// *sql.DB or *sql.Tx, and db.DB() (GORM's GetDBConnector hook) reaches the
// *sql.DB from the *gorm.DB and from a transaction, with and without
// prepared statements, while the transaction's gorm.ConnPool methods run
// in the transaction.
func TestThePoolIsReachableThroughDBBehindTheWrappers(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		for _, prepare := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/prepare_stmt_%v", o.Name, prepare), func(t *testing.T) {
				db, rec := notifyingDB(t, o, &gorm.Config{PrepareStmt: prepare})
				sqlDB, err := db.DB()
				if err != nil || sqlDB == nil || sqlDB.Ping() != nil {
					t.Fatalf("db.DB() = %v, %v; want the *sql.DB", sqlDB, err)
				}
				if _, ok := db.ConnPool.(*sql.DB); ok {
					t.Errorf("db.ConnPool is a *sql.DB; the docs say the plugin wraps it")
				}
				err = db.Transaction(func(tx *gorm.DB) error {
					if _, ok := tx.Statement.ConnPool.(*sql.Tx); ok {
						t.Errorf("tx.Statement.ConnPool is a *sql.Tx; the docs say the plugin wraps it")
					}
					if inner, err := tx.DB(); err != nil || inner != sqlDB {
						t.Errorf("tx.DB() = %v, %v; want db.DB()'s *sql.DB", inner, err)
					}
					if err := tx.Create(inBucket(3)).Error; err != nil {
						return err
					}
					var n int
					if err := tx.Statement.ConnPool.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM "+outbox.DefaultMessagesTable).Scan(&n); err != nil || n != 1 {
						t.Errorf("COUNT(*) through tx.Statement.ConnPool = %d, %v; want 1 (the transaction's own row)", n, err)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if got := rec.take(); len(got) != 1 || !slices.Equal(got[0], []int{3}) {
					t.Fatalf("notifications = %v; want [[3]]", got)
				}
			})
		}
	}
}

// blockingNotifier blocks until released and panics if asked to.
type blockingNotifier struct {
	release chan struct{}
	called  chan struct{}
}

func (b *blockingNotifier) NotifyCommitted() {
	b.called <- struct{}{}
	<-b.release
	panic("notifier panics after blocking")
}

func TestNotifierThatBlocksOrPanicsNeverFailsOrDelaysCommit(t *testing.T) {
	o := testenv.Databases(t)[0]
	n := &blockingNotifier{release: make(chan struct{}), called: make(chan struct{}, 1)}
	db := o.Open(t, nil)
	if err := db.Use(outbox.Plugin{Notifier: n}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	// The commit returns although the notifier has not returned yet.
	if err := db.Create(inBucket(1)).Error; err != nil {
		t.Fatalf("Create with a blocking notifier = %v; want nil", err)
	}
	select {
	case <-n.called:
	case <-time.After(10 * time.Second):
		t.Fatal("notifier was never called")
	}
	close(n.release) // it now panics on its own goroutine; the process survives
	// And a panicking inline notifier does not fail the commit either.
	db2 := o.Open(t, nil)
	if err := db2.Use(outbox.Plugin{Notifier: panicky{}}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(db2, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := db2.Create(inBucket(1)).Error; err != nil {
		t.Fatalf("Create with a panicking notifier = %v; want nil", err)
	}
	var n2 int64
	db2.Model(&outbox.Message{}).Count(&n2)
	if n2 != 1 {
		t.Fatalf("%d rows after commit with panicking notifier; want 1", n2)
	}
}

type panicky struct{}

func (panicky) NonBlockingNotifier() {}
func (panicky) NotifyCommitted()     { panic("boom") }

func TestSecondOutboxNotifiesItsOwnNotifier(t *testing.T) {
	billing := outbox.Config{BucketCount: 4, MessagesTable: "billing_outbox", LeasesTable: "billing_leases", RelaysTable: "billing_relays"}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			orders, bills := &recorder{}, &recorder{}
			db := o.Open(t, nil)
			if err := db.Use(outbox.Plugin{Notifier: orders}); err != nil {
				t.Fatal(err)
			}
			for _, cfg := range []outbox.Config{{}, billing} {
				if err := outbox.AutoMigrate(db, cfg); err != nil {
					t.Fatal(err)
				}
			}
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(inBucket(6)).Error; err != nil {
					return err
				}
				if err := tx.Scopes(outbox.WithOutbox(billing, bills)).Create(inBucket(3)).Error; err != nil {
					return err
				}
				// WithConfig alone: routed to billing, but nobody is told.
				return tx.Scopes(outbox.WithConfig(billing)).Create(inBucket(1)).Error
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := orders.take(); len(got) != 1 || !slices.Equal(got[0], []int{6}) {
				t.Fatalf("orders notifier got %v; want [[6]]", got)
			}
			if got := bills.take(); len(got) != 1 || !slices.Equal(got[0], []int{3}) {
				t.Fatalf("billing notifier got %v; want [[3]] (the WithConfig row notifies nobody)", got)
			}
			// Autocommit (implicit transaction) routes the same way.
			if err := db.Scopes(outbox.WithOutbox(billing, bills)).Create(inBucket(2)).Error; err != nil {
				t.Fatal(err)
			}
			if got, none := bills.take(), orders.take(); len(got) != 1 || !slices.Equal(got[0], []int{2}) || len(none) != 0 {
				t.Fatalf("after an implicit transaction: billing %v, orders %v; want [[2]] and nothing", got, none)
			}
		})
	}
}
