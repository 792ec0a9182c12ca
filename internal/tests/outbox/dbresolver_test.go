package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
	"gorm.io/plugin/dbresolver"
)

// sourcePool is a pool of its own over a *sql.DB, as a resolver's source;
// it counts the transactions begun on it.
type sourcePool struct {
	*sql.DB
	begins atomic.Int64
}

func (p *sourcePool) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	p.begins.Add(1)
	return p.DB.BeginTx(ctx, opts)
}

// TestWithDBResolverRegisteredAfterThePlugin proves the documented order:
// db.Use(outbox.Plugin{...}) first, then db.Use(dbresolver...) with read
// replicas; writes on the default connection still notify after commit.
func TestWithDBResolverRegisteredAfterThePlugin(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db, rec := notifyingDB(t, o, nil)
			sqlDB, err := db.DB()
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Use(dbresolver.Register(dbresolver.Config{Replicas: []gorm.Dialector{testenv.DialectorOn(o.Name, sqlDB)}})); err != nil {
				t.Fatalf("db.Use(dbresolver) = %v", err)
			}
			rec.take()
			err = db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(inBucket(2)).Error; err != nil {
					return err
				}
				return tx.Create(inBucket(5)).Error
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Create(inBucket(3)).Error; err != nil {
				t.Fatal(err)
			}
			got := rec.take()
			if len(got) != 2 || !slices.Equal(got[0], []int{2, 5}) || !slices.Equal(got[1], []int{3}) {
				t.Fatalf("notifications with dbresolver = %v; want [[2 5] [3]]", got)
			}
			var n int64
			if err := db.Model(&outbox.Message{}).Count(&n).Error; err != nil || n != 3 {
				t.Fatalf("count through the replica = %d, %v; want 3", n, err)
			}
		})
	}
}

// TestWritesDBResolverRoutesToItsSourcesNotify: with Sources, dbresolver
// sends creates to pools it opened itself; their implicit transactions and
// autocommit writes still notify after commit, whichever of the two plugins
// was registered first, and no callback is registered twice.
func TestWritesDBResolverRoutesToItsSourcesNotify(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		for _, resolverFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/resolver_first=%v", o.Name, resolverFirst), func(t *testing.T) {
				rec := &recorder{}
				warnings := &testenv.SQLRecorder{}
				db := o.Open(t, &gorm.Config{Logger: warnings})
				sqlDB, err := db.DB()
				if err != nil {
					t.Fatal(err)
				}
				// A source on the same database through a pool of its own
				// (another gorm.ConnPool value).
				source := &sourcePool{DB: sqlDB}
				resolver := dbresolver.Register(dbresolver.Config{Sources: []gorm.Dialector{testenv.DialectorOn(o.Name, source)}})
				plugins := []gorm.Plugin{outbox.Plugin{Notifier: rec}, resolver}
				if resolverFirst {
					plugins[0], plugins[1] = plugins[1], plugins[0]
				}
				for _, p := range plugins {
					if err := db.Use(p); err != nil {
						t.Fatalf("db.Use(%s) = %v", p.Name(), err)
					}
				}
				if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
					t.Fatal(err)
				}
				if err := db.Create(inBucket(3)).Error; err != nil {
					t.Fatal(err)
				}
				if err := db.Session(&gorm.Session{SkipDefaultTransaction: true}).Create(inBucket(4)).Error; err != nil {
					t.Fatal(err)
				}
				if n := source.begins.Load(); n != 1 {
					t.Fatalf("%d transactions begun on dbresolver's source; want 1 (the implicit one)", n)
				}
				err = db.Transaction(func(tx *gorm.DB) error { return tx.Create(inBucket(6)).Error })
				if err != nil {
					t.Fatal(err)
				}
				got := rec.take()
				if len(got) != 3 || !slices.Equal(got[0], []int{3}) || !slices.Equal(got[1], []int{4}) || !slices.Equal(got[2], []int{6}) {
					t.Fatalf("notifications for writes routed to dbresolver's source = %v; want [[3] [4] [6]]", got)
				}
				// Rolled back on the source: nothing.
				_ = db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(inBucket(1)).Error; err != nil {
						return err
					}
					return gorm.ErrInvalidData
				})
				if got := rec.take(); len(got) != 0 {
					t.Fatalf("notified %v for a rolled-back transaction; want nothing", got)
				}
				if w := warnings.Warnings(); len(w) != 0 {
					t.Fatalf("gorm warned: %q; want no warning (no callback registered twice)", w)
				}
			})
		}
	}
}
