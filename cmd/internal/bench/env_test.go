package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestResetStartsAFreshWriteAheadLogCycle proves that every contender of a
// drain starts in a write-ahead log cycle of its own: after reset, the
// rows written before it are behind the database's latest checkpoint, so
// that no contender's deletes pay for page images that another's escaped
// by its place in the run (see reset). SQLite: the WAL file
// is empty; PostgreSQL: the latest checkpoint's redo point is past the
// log written before reset.
func TestResetStartsAFreshWriteAheadLogCycle(t *testing.T) {
	ctx := context.Background()
	dbs := []struct{ name, db, dsn string }{{"sqlite", "sqlite", ""}}
	for _, o := range testenv.Databases(t) {
		if o.Name == testenv.Postgres {
			dbs = append(dbs, struct{ name, db, dsn string }{"postgres", "postgres", os.Getenv(testenv.EnvPostgres)})
		}
	}
	for _, d := range dbs {
		t.Run(d.name, func(t *testing.T) {
			e, err := newEnv(ctx, Config{DB: d.db, DSN: d.dsn, Broker: "kfake", Partitions: 1, Buckets: 8})
			if err != nil {
				t.Fatal(err)
			}
			defer e.close()
			db, err := e.open(nil)
			if err != nil {
				t.Fatal(err)
			}
			defer closeDB(db)
			msgs := make([]*outbox.Message, 200)
			for i := range msgs {
				msgs[i] = outbox.NewMessage("t", []byte("k"), make([]byte, 1024))
			}
			if err := outbox.Enqueue(db, msgs...); err != nil {
				t.Fatal(err)
			}
			var before string
			if d.db == "postgres" {
				if err := db.Raw("SELECT pg_current_wal_insert_lsn()::text").Scan(&before).Error; err != nil {
					t.Fatal(err)
				}
			}
			if err := e.reset(db); err != nil {
				t.Fatal(err)
			}
			switch d.db {
			case "sqlite":
				fi, err := os.Stat(filepath.Join(e.tmp, "bench.db-wal"))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Size() != 0 {
					t.Errorf("WAL file after reset: %d bytes; want 0 (checkpointed and truncated)", fi.Size())
				}
			case "postgres":
				var behind float64
				if err := db.Raw("SELECT pg_wal_lsn_diff(redo_lsn, ?::pg_lsn) FROM pg_control_checkpoint()", before).Scan(&behind).Error; err != nil {
					t.Fatal(err)
				}
				if behind < 0 {
					t.Errorf("latest checkpoint's redo point is %v bytes before the log written before reset (%s); want a checkpoint after it", -behind, before)
				}
			}
		})
	}
}
