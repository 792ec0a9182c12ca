package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
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

// enqueueVariant writes one outbox row, through GORM (gorm, in a
// transaction of db) or through database/sql (sql).
type enqueueVariant struct {
	name string
	db   *gorm.DB
	gorm func(tx *gorm.DB) error
	sql  func(tx *sql.Tx) error
}

// enqueueBenchSetup opens a fresh database of o with the plugin and the
// tables, and returns the variants of BenchmarkEnqueueVsHandInsert, warmed
// up, the *gorm.DB and its *sql.DB.
func enqueueBenchSetup(b *testing.B, o testenv.Opener) ([]enqueueVariant, *gorm.DB, *sql.DB) {
	b.Helper()
	value := bytes.Repeat([]byte("v"), 1024)
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
	ctx := context.Background()
	variants := []enqueueVariant{
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
	variants = append(variants, enqueueVariant{name: "sql_returning", sql: func(tx *sql.Tx) error {
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
			if err := v.once(ctx, sqlDB); err != nil {
				b.Fatal(err)
			}
		}
	}
	return variants, db, sqlDB
}

// once writes one row in a transaction of its own.
func (v enqueueVariant) once(ctx context.Context, sqlDB *sql.DB) error {
	if v.gorm != nil {
		return v.db.Transaction(v.gorm)
	}
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := v.sql(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// BenchmarkEnqueueVsHandInsert compares one outbox row written through the
// plugin (tx.Create, outbox.Enqueue) with the same row written by hand
// (through the same *gorm.DB's Exec, and through database/sql), per
// database: each in its own transaction (tx: BEGIN, INSERT, COMMIT) and as
// the statement alone inside one long transaction (stmt). The hand-written
// variants compute what the plugin computes (message id, bucket, created
// at). Variants also cover Plugin.SkipIDReadBack (a second *gorm.DB on the
// same pool) and the database/sql INSERT with RETURNING id read back.
// BenchmarkEnqueueInterleaved gives the ratios under a changing load.
//
//	go test -run '^$' -bench EnqueueVsHandInsert -benchtime 2000x -count 5 ./internal/tests/outbox
func BenchmarkEnqueueVsHandInsert(b *testing.B) {
	for _, o := range testenv.Databases(b) {
		b.Run(o.Name, func(b *testing.B) {
			variants, _, sqlDB := enqueueBenchSetup(b, o)
			ctx := context.Background()
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

// BenchmarkEnqueueInterleaved runs the variants of
// BenchmarkEnqueueVsHandInsert in turn, so that a machine whose load
// changes (shared cores) loads them alike, and reports each variant's
// median time per row (<variant>-ns) and the ratios to the hand-written
// INSERT through GORM's Exec (<variant>/gorm_exec). tx: each row in its own
// transaction, the variants alternating row by row (in a random order
// each round); stmt: the statement alone, the variants alternating by
// blocks of 20 rows, each block in a
// transaction of its own (not timed). b.N is the rows per variant.
//
//	go test -run '^$' -bench EnqueueInterleaved -benchtime 2000x -count 5 ./internal/tests/outbox
func BenchmarkEnqueueInterleaved(b *testing.B) {
	const block = 20
	for _, o := range testenv.Databases(b) {
		b.Run(o.Name, func(b *testing.B) {
			variants, _, sqlDB := enqueueBenchSetup(b, o)
			ctx := context.Background()
			report := func(b *testing.B, times [][]time.Duration) {
				med := make([]float64, len(variants))
				base := 0.0
				for i, v := range variants {
					slices.Sort(times[i])
					med[i] = float64(times[i][len(times[i])/2].Nanoseconds())
					if v.name == "gorm_exec" {
						base = med[i]
					}
				}
				for i, v := range variants {
					b.ReportMetric(med[i], v.name+"-ns")
					if v.name != "gorm_exec" && base > 0 {
						b.ReportMetric(med[i]/base, v.name+"/gorm_exec")
					}
				}
				b.ReportMetric(0, "ns/op")
			}
			b.Run("tx", func(b *testing.B) {
				times := make([][]time.Duration, len(variants))
				for range b.N {
					for _, i := range rand.Perm(len(variants)) { // no variant always first
						v := variants[i]
						start := time.Now()
						if err := v.once(ctx, sqlDB); err != nil {
							b.Fatal(err)
						}
						times[i] = append(times[i], time.Since(start))
					}
				}
				report(b, times)
			})
			b.Run("stmt", func(b *testing.B) {
				times := make([][]time.Duration, len(variants))
				for done := 0; done < b.N; done += block {
					n := min(block, b.N-done)
					for _, i := range rand.Perm(len(variants)) {
						v := variants[i]
						var err error
						if v.gorm != nil {
							err = v.db.Transaction(func(tx *gorm.DB) error {
								for range n {
									start := time.Now()
									if err := v.gorm(tx); err != nil {
										return err
									}
									times[i] = append(times[i], time.Since(start))
								}
								return nil
							})
						} else {
							var tx *sql.Tx
							if tx, err = sqlDB.BeginTx(ctx, nil); err == nil {
								for range n {
									start := time.Now()
									if err = v.sql(tx); err != nil {
										break
									}
									times[i] = append(times[i], time.Since(start))
								}
								if err == nil {
									err = tx.Commit()
								} else {
									_ = tx.Rollback()
								}
							}
						}
						if err != nil {
							b.Fatalf("%s: %v", v.name, err)
						}
					}
				}
				report(b, times)
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
