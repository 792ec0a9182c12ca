package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// nopNotifier is a relay-like notifier (non-blocking, bucket hints) that
// does nothing, so that the benchmarks pay the plugin's full bookkeeping.
type nopNotifier struct{}

func (nopNotifier) NonBlockingNotifier() {}
func (nopNotifier) NotifyCommitted()     {}
func (nopNotifier) NotifyBucket(int)     {}
func (nopNotifier) NotifyBuckets([]int)  {}

// handInsert is the INSERT a writer would write by hand: the same columns
// GORM's Create writes, no RETURNING.
const handInsert = "INSERT INTO outbox_messages (message_id, bucket, topic, record_key, record_value, headers, record_partition, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"

// dollarPlaceholders rewrites ? to $1, $2, … for database/sql on PostgreSQL.
func dollarPlaceholders(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// BenchmarkEnqueueVsHandInsert compares one outbox row written through the
// plugin (tx.Create, outbox.Enqueue) with the same row written by hand
// (through the same *gorm.DB's Exec, and through database/sql), per
// database: each in its own transaction (tx: BEGIN, INSERT, COMMIT) and as
// the statement alone inside one long transaction (stmt). The hand-written
// variants compute what the plugin computes (message id, bucket, created
// at).
//
//	go test -run '^$' -bench EnqueueVsHandInsert -benchtime 2000x -count 5 .
func BenchmarkEnqueueVsHandInsert(b *testing.B) {
	value := bytes.Repeat([]byte("v"), 1024)
	for _, o := range testenv.Databases(b) {
		b.Run(o.Name, func(b *testing.B) {
			db := o.Open(b, nil)
			if err := db.Use(outbox.Plugin{Notifier: nopNotifier{}}); err != nil {
				b.Fatal(err)
			}
			if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
				b.Fatal(err)
			}
			sqlDB, err := db.DB()
			if err != nil {
				b.Fatal(err)
			}
			// The same database through a second *gorm.DB whose plugin skips
			// reading the ids back.
			noIDs, err := gorm.Open(testenv.DialectorOn(o.Name, sqlDB), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
			if err != nil {
				b.Fatal(err)
			}
			if err := noIDs.Use(outbox.Plugin{Notifier: nopNotifier{}, SkipIDReadBack: true}); err != nil {
				b.Fatal(err)
			}
			rawInsert := handInsert
			if o.Name == testenv.Postgres {
				rawInsert = dollarPlaceholders(handInsert)
			}
			seq := 0
			msg := func() *outbox.Message {
				seq++
				return &outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "order-%010d", seq), Value: value}
			}
			handArgs := func() []any {
				seq++
				key := fmt.Appendf(nil, "order-%010d", seq)
				id := outbox.NewUUID()
				return []any{id, outbox.BucketOf(key, nil, id, outbox.DefaultBucketCount), "orders", key, value, nil, nil, time.Now().UTC()}
			}
			// A gorm-side writer and a database/sql-side writer of one row.
			type variant struct {
				name string
				db   *gorm.DB // nil: db
				gorm func(tx *gorm.DB) error
				sql  func(tx *sql.Tx) error
			}
			ctx := context.Background()
			variants := []variant{
				{name: "create", gorm: func(tx *gorm.DB) error { return tx.Create(msg()).Error }},
				{name: "enqueue", gorm: func(tx *gorm.DB) error { return outbox.Enqueue(tx, msg()) }},
				{name: "create_skip_id", db: noIDs, gorm: func(tx *gorm.DB) error { return tx.Create(msg()).Error }},
				{name: "enqueue_skip_id", db: noIDs, gorm: func(tx *gorm.DB) error { return outbox.Enqueue(tx, msg()) }},
				{name: "gorm_exec", gorm: func(tx *gorm.DB) error { return tx.Exec(handInsert, handArgs()...).Error }},
				{name: "sql_exec", sql: func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, rawInsert, handArgs()...)
					return err
				}},
			}
			// The same INSERT with RETURNING id read back: what reading the
			// id costs at the driver, whatever writes the SQL.
			variants = append(variants, variant{name: "sql_returning", sql: func(tx *sql.Tx) error {
				var id int64
				return tx.QueryRowContext(ctx, rawInsert+" RETURNING id", handArgs()...).Scan(&id)
			}})
			for i := range variants {
				if variants[i].db == nil {
					variants[i].db = db
				}
			}
			for _, v := range variants {
				// Warm up the statement caches and the connection.
				for range 20 {
					if v.gorm != nil {
						if err := v.db.Transaction(v.gorm); err != nil {
							b.Fatal(err)
						}
					} else {
						tx, err := sqlDB.BeginTx(ctx, nil)
						if err != nil {
							b.Fatal(err)
						}
						if err := v.sql(tx); err != nil {
							b.Fatal(err)
						}
						if err := tx.Commit(); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.Run("tx", func(b *testing.B) {
				for _, v := range variants {
					b.Run(v.name, func(b *testing.B) {
						b.ReportAllocs()
						defer reportCPU(b)()
						for range b.N {
							if v.gorm != nil {
								if err := v.db.Transaction(v.gorm); err != nil {
									b.Fatal(err)
								}
								continue
							}
							tx, err := sqlDB.BeginTx(ctx, nil)
							if err != nil {
								b.Fatal(err)
							}
							if err := v.sql(tx); err != nil {
								b.Fatal(err)
							}
							if err := tx.Commit(); err != nil {
								b.Fatal(err)
							}
						}
					})
				}
			})
			b.Run("stmt", func(b *testing.B) {
				for _, v := range variants {
					b.Run(v.name, func(b *testing.B) {
						b.ReportAllocs()
						if v.gorm != nil {
							tx := v.db.Begin()
							if tx.Error != nil {
								b.Fatal(tx.Error)
							}
							b.ResetTimer()
							done := reportCPU(b)
							for range b.N {
								if err := v.gorm(tx); err != nil {
									b.Fatal(err)
								}
							}
							done()
							b.StopTimer()
							if err := tx.Commit().Error; err != nil {
								b.Fatal(err)
							}
							return
						}
						tx, err := sqlDB.BeginTx(ctx, nil)
						if err != nil {
							b.Fatal(err)
						}
						b.ResetTimer()
						done := reportCPU(b)
						for range b.N {
							if err := v.sql(tx); err != nil {
								b.Fatal(err)
							}
						}
						done()
						b.StopTimer()
						if err := tx.Commit(); err != nil {
							b.Fatal(err)
						}
					})
				}
			})
		})
	}
}

// reportCPU reports, when the returned func is called, the process's CPU
// time (user + system) per operation since reportCPU was called: the
// client's cost (the whole cost on SQLite), far less sensitive than ns/op
// to other work on a loaded machine.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		b.ReportMetric(float64((cpuTime()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
