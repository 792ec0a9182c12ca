package gormstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
)

// raw writes rows exactly as given: no hooks recompute the bucket.
func raw(db *gorm.DB) *gorm.DB { return db.Session(&gorm.Session{SkipHooks: true}) }

// pendingMessage returns a pending row of bucket, ready to insert.
func pendingMessage(bucket int32) *outbox.Message {
	return &outbox.Message{
		MessageID: outbox.UUID(uuid.New()), Bucket: bucket, Topic: "orders",
		Value: []byte("v"), CreatedAt: time.Now().UTC(),
	}
}

// BenchmarkNextBatch measures one one-bucket fetch of 1 and of 500 rows (of
// 1000 pending in the bucket, values of 100 bytes, no parked row) on every
// available database, alternating with the previous release's statement
// (without the hold condition of issue 27): current/previous is their
// ratio in one run.
func BenchmarkNextBatch(b *testing.B) {
	for _, o := range testenv.Databases(b) {
		b.Run(o.Name, func(b *testing.B) {
			db := o.Open(b, nil)
			cfg := outbox.Config{BucketCount: 8}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				b.Fatal(err)
			}
			rows := make([]*outbox.Message, 1000)
			for i := range rows {
				rows[i] = pendingMessage(0)
				rows[i].Value = make([]byte, 100)
			}
			if err := raw(db).Table(cfg.MessagesTableName()).CreateInBatches(rows, 250).Error; err != nil {
				b.Fatal(err)
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			previousBatch := previousNextBatch(b, o.Name, db, cfg)
			for _, limit := range []int{1, 500} {
				b.Run(fmt.Sprintf("batch=%d", limit), func(b *testing.B) {
					fetch := func(previous bool) time.Duration {
						start := time.Now()
						var got int
						var err error
						if previous {
							got, err = previousBatch(b.Context(), 0, limit)
						} else {
							var msgs []*outbox.Message
							msgs, err = nextBatch(b.Context(), store, 0, limit, 0)
							got = len(msgs)
						}
						if err != nil || got != limit {
							b.Fatalf("fetch = %d rows, %v; want %d", got, err, limit)
						}
						return time.Since(start)
					}
					// Alternating calls, so that both statements see the
					// same machine: ns/op is the current statement's,
					// previous-ns/op the previous release's.
					var cur, prev time.Duration
					n := 0
					for b.Loop() {
						if n%2 == 0 {
							prev += fetch(true)
							cur += fetch(false)
						} else {
							cur += fetch(false)
							prev += fetch(true)
						}
						n++
					}
					b.ReportMetric(float64(cur.Nanoseconds())/float64(n), "current-ns/op")
					b.ReportMetric(float64(prev.Nanoseconds())/float64(n), "previous-ns/op")
					b.ReportMetric(float64(cur)/float64(prev), "current/previous")
				})
			}
		})
	}
}

// previousNextBatch returns the one-bucket fetch's statement as the release before
// issue 27 had it (no hold condition; on MySQL and MariaDB the range form
// and the index's ORDER BY), built here, as a function that runs it on db
// for a bucket and a limit as the store runs a read — through
// database/sql, with the store's statement prefix (MariaDB's timeout,
// observed on a first NextBatch of a store on db), on MySQL and MariaDB in
// a READ COMMITTED read-only transaction — and returns the rows read, each
// row's columns copied out of the driver's buffers.
func previousNextBatch(b *testing.B, dialect string, db *gorm.DB, cfg outbox.Config) func(ctx context.Context, bucket, limit int) (int, error) {
	b.Helper()
	probe := db.Session(&gorm.Session{Logger: &testenv.SQLRecorder{}})
	obs := observe(probe)
	s, err := gormstore.New(probe, gormstore.Options{Config: cfg})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := nextBatch(b.Context(), s, 0, 1, 0); err != nil {
		b.Fatal(err)
	}
	var prefix string
	if st, ok := obs.find(" m WHERE"); ok && strings.HasPrefix(st.SQL, "SET STATEMENT") {
		prefix = st.SQL[:strings.Index(st.SQL, " FOR ")+len(" FOR ")]
	}
	const columns = "id, message_id, bucket, topic, record_key, record_value, headers, record_partition, created_at"
	query := prefix + "SELECT " + columns + " FROM " + cfg.MessagesTableName() +
		" WHERE bucket >= ? AND bucket <= ? AND parked_at_ms IS NULL ORDER BY bucket, parked_at_ms, id LIMIT ?"
	args := func(bucket, limit int) []any { return []any{bucket, bucket, limit} }
	switch dialect {
	case testenv.Postgres:
		query = strings.NewReplacer("bucket >= ?", "bucket >= $1", "bucket <= ?", "bucket <= $2", "LIMIT ?", "LIMIT $3").Replace(query)
	case testenv.SQLite:
		query = prefix + "SELECT " + columns + " FROM " + cfg.MessagesTableName() +
			" WHERE bucket = ? AND parked_at_ms IS NULL ORDER BY bucket, parked_at_ms, id LIMIT ?"
		args = func(bucket, limit int) []any { return []any{bucket, limit} }
	}
	sqlDB, err := db.DB()
	if err != nil {
		b.Fatal(err)
	}
	read := func(ctx context.Context, q interface {
		QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	}, bucket, limit int) (int, error) {
		rows, err := q.QueryContext(ctx, query, args(bucket, limit)...)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		cols := make([]sql.RawBytes, 9)
		dest := make([]any, len(cols))
		for i := range cols {
			dest[i] = &cols[i]
		}
		var n int
		var arena []byte
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				return n, err
			}
			arena = append(append(arena[:0], cols[4]...), cols[5]...) // the key and the value
			n++
		}
		return n, rows.Err()
	}
	return func(ctx context.Context, bucket, limit int) (int, error) {
		if dialect != testenv.MySQL {
			return read(ctx, sqlDB, bucket, limit)
		}
		tx, err := sqlDB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted, ReadOnly: true})
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		n, err := read(ctx, tx, bucket, limit)
		if err != nil {
			return n, err
		}
		return n, tx.Commit()
	}
}

// BenchmarkMarkPublished measures one MarkPublished call deleting 1 and
// 500 rows of a bucket (the rows are inserted, untimed, before each call,
// beside 1000 other pending rows of the bucket) on every available database.
func BenchmarkMarkPublished(b *testing.B) {
	for _, o := range testenv.Databases(b) {
		b.Run(o.Name, func(b *testing.B) {
			db := o.Open(b, nil)
			cfg := outbox.Config{BucketCount: 8}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				b.Fatal(err)
			}
			insert := func(n int) []*outbox.Message {
				rows := make([]*outbox.Message, n)
				for i := range rows {
					rows[i] = pendingMessage(0)
					rows[i].Value = make([]byte, 100)
				}
				if err := raw(db).Table(cfg.MessagesTableName()).CreateInBatches(rows, 250).Error; err != nil {
					b.Fatal(err)
				}
				return rows
			}
			insert(1000)
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			for _, n := range []int{1, 500} {
				b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
					for b.Loop() {
						b.StopTimer()
						rows := insert(n)
						b.StartTimer()
						if err := store.MarkPublished(b.Context(), rows); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// BenchmarkNextBatches compares, on every available database, reading 64
// shallow buckets (2 pending rows each, values of 100 bytes, no parked
// row) with a request per bucket and with one NextBatches call, in
// alternating calls: loop-ns/op and multi-ns/op are the two ways' times
// per round of 64 buckets, multi/loop their ratio in one run.
func BenchmarkNextBatches(b *testing.B) {
	const buckets, perBucket = 64, 2
	for _, o := range testenv.Databases(b) {
		b.Run(o.Name, func(b *testing.B) {
			db := o.Open(b, nil)
			cfg := outbox.Config{BucketCount: buckets}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				b.Fatal(err)
			}
			var rows []*outbox.Message
			for range perBucket {
				for bk := range buckets {
					m := pendingMessage(int32(bk))
					m.Value = make([]byte, 100)
					rows = append(rows, m)
				}
			}
			if err := raw(db).Table(cfg.MessagesTableName()).CreateInBatches(rows, 64).Error; err != nil {
				b.Fatal(err)
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]relay.BatchRequest, buckets)
			for bk := range reqs {
				reqs[bk] = relay.BatchRequest{Buckets: []int{bk}, Limit: 500, MaxBytes: 1 << 20}
			}
			loop := func() time.Duration {
				start := time.Now()
				for _, r := range reqs {
					got, err := nextBatch(b.Context(), store, r.Buckets[0], r.Limit, r.MaxBytes)
					if err != nil || len(got) != perBucket {
						b.Fatalf("fetch of bucket %d = %d rows, %v; want %d", r.Buckets[0], len(got), err, perBucket)
					}
				}
				return time.Since(start)
			}
			multi := func() time.Duration {
				start := time.Now()
				got, err := store.NextBatches(b.Context(), reqs)
				if err != nil {
					b.Fatal(err)
				}
				for i, r := range got {
					if r.Err != nil || len(r.Rows) != perBucket {
						b.Fatalf("NextBatches bucket %d = %d rows, %v; want %d", reqs[i].Buckets[0], len(r.Rows), r.Err, perBucket)
					}
				}
				return time.Since(start)
			}
			var l, m time.Duration
			n := 0
			for b.Loop() {
				if n%2 == 0 {
					l += loop()
					m += multi()
				} else {
					m += multi()
					l += loop()
				}
				n++
			}
			b.ReportMetric(float64(l.Nanoseconds())/float64(n), "loop-ns/op")
			b.ReportMetric(float64(m.Nanoseconds())/float64(n), "multi-ns/op")
			b.ReportMetric(float64(m)/float64(l), "multi/loop")
		})
	}
}
