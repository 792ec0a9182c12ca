package outbox_test

import (
	"database/sql"
	"slices"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/plugin/dbresolver"
)

// dialectorOn returns a dialector of the given kind on an existing pool.
func dialectorOn(name string, sqlDB *sql.DB) gorm.Dialector {
	switch name {
	case testenv.Postgres:
		return postgres.New(postgres.Config{Conn: sqlDB})
	case testenv.MySQL:
		return mysql.New(mysql.Config{Conn: sqlDB, SkipInitializeWithVersion: true})
	default:
		return &sqlite.Dialector{Conn: sqlDB}
	}
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
			if err := db.Use(dbresolver.Register(dbresolver.Config{Replicas: []gorm.Dialector{dialectorOn(o.Name, sqlDB)}})); err != nil {
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
