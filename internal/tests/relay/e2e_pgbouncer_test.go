package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestEndToEndGormToKafkaPgBouncer runs writers (the outbox plugin) and a
// relay (gormstore, the Kafka publisher) through PgBouncer in transaction
// pooling mode, with the supported settings: default_query_exec_mode=exec
// in the DSN (OUTBOX_TEST_PGBOUNCER_DSN) and gorm's PrepareStmt false. The
// same workload runs directly on PostgreSQL for comparison. It also shows
// what the README says does not work through a transaction pooler: gorm's
// PrepareStmt, and pgx's default exec mode (its statement cache).
func TestEndToEndGormToKafkaPgBouncer(t *testing.T) {
	if _, ok := testenv.PgBouncerOpener(t); !ok {
		t.Skipf("%s not set", testenv.EnvPgBouncer)
	}
	b, ok := testenv.RealBroker(t)
	if !ok {
		b = testenv.NewFake(t)
	}
	open := func(t *testing.T, dsn string, cfg *gorm.Config) *gorm.DB {
		cfg.Logger = logger.Default.LogMode(logger.Silent)
		db, err := gorm.Open(postgres.Open(dsn), cfg)
		if err != nil {
			t.Fatalf("open %s: %v", dsn, err)
		}
		t.Cleanup(func() {
			if s, err := db.DB(); err == nil {
				_ = s.Close()
			}
		})
		return db
	}

	took := map[string]time.Duration{}
	for _, path := range []string{"direct", "pgbouncer_exec", "pgbouncer_simple_protocol"} {
		t.Run(path+"_"+b.Name, func(t *testing.T) {
			dsn, direct, _ := testenv.PgBouncerDSN(t)
			switch path {
			case "direct":
				dsn = direct
			case "pgbouncer_simple_protocol":
				dsn += " default_query_exec_mode=simple_protocol"
			}
			db := open(t, dsn, &gorm.Config{PrepareStmt: false})
			took[path] = e2ePooled(t, db, b, 4, 500)
		})
	}
	if took["direct"] > 0 && took["pgbouncer_exec"] > 0 {
		t.Logf("2000 messages (4 writers x 500, transactions of 2 with 1 in 5 rolled back) to %s: direct %v, through pgbouncer (exec) %v, (simple_protocol) %v",
			b.Name, took["direct"].Round(time.Millisecond), took["pgbouncer_exec"].Round(time.Millisecond), took["pgbouncer_simple_protocol"].Round(time.Millisecond))
	}

	// What fails in transaction pooling mode, and how.
	for _, c := range []struct {
		name  string
		extra string
		cfg   gorm.Config
	}{
		{"PrepareStmt_true_fails", "", gorm.Config{PrepareStmt: true}},
		{"pgx_default_exec_mode_cache_statement_fails", " default_query_exec_mode=cache_statement", gorm.Config{}},
		{"pgx_describe_exec_fails", " default_query_exec_mode=describe_exec", gorm.Config{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dsn, _, _ := testenv.PgBouncerDSN(t)
			cfg := c.cfg
			db := open(t, dsn+c.extra, &cfg)
			err := storeWorkload(t, db)
			if err == nil {
				t.Fatalf("writers and store through pgbouncer with %s: no error; want a prepared statement error", c.name)
			}
			if !strings.Contains(err.Error(), "prepared statement") {
				t.Fatalf("first error = %v; want a prepared statement error", err)
			}
			t.Logf("first error: %v", err)
		})
	}
}

// storeWorkload runs writer transactions and every store operation from
// several goroutines and returns the first error, or nil.
func storeWorkload(t *testing.T, db *gorm.DB) error {
	t.Helper()
	cfg := outbox.Config{BucketCount: 4}
	if err := db.Use(outbox.Plugin{Config: cfg}); err != nil {
		return err
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		return err
	}
	ctx := context.Background()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				fail(err)
				return
			}
			id := fmt.Sprintf("relay-%d", g)
			for i := 0; i < 30; i++ {
				if err := db.Transaction(func(tx *gorm.DB) error {
					return outbox.Enqueue(tx, outbox.NewStringMessage("t", fmt.Sprint(i), "v"))
				}); err != nil {
					fail(fmt.Errorf("enqueue: %w", err))
					return
				}
				buckets, err := relaytest.Owned(store.AcquireBucketLeases(ctx, id, cfg.BucketCount, time.Minute))
				if err != nil {
					fail(fmt.Errorf("AcquireBucketLeases: %w", err))
					return
				}
				for _, bk := range buckets {
					res, err := store.NextBatches(ctx, []relay.BatchRequest{{Buckets: []int{bk}, Limit: 10}})
					if err != nil {
						fail(fmt.Errorf("NextBatches: %w", err))
						return
					}
					if err := store.MarkPublished(ctx, res[0].Rows); err != nil {
						fail(fmt.Errorf("MarkPublished: %w", err))
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// e2ePooled writes writers×perWriter messages (transactions of two, one in
// five rolled back) while a relay publishes them to b, checks that exactly
// the committed ones arrive and the table drains, and returns the time from
// the first write to the drained table.
func e2ePooled(t *testing.T, db *gorm.DB, b testenv.Broker, writers, perWriter int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.Unique("e2e-pgb-")
	b.CreateTopic(t, topic, 4, nil)
	n := relay.NewNotifier()
	store := e2eStore(t, db, n)
	_, done := startKafkaRelay(ctx, t, db, store, n, kafkapub.Config{Brokers: b.Addrs})

	began := time.Now()
	committed, rolledBack := writeTransactions(ctx, t, db, topic, writers, perWriter/2)
	waitOutboxEmpty(ctx, t, db)
	elapsed := time.Since(began)

	checkRecords(t, b.ReadAll(t, topic, len(committed), time.Minute), committed, rolledBack)
	stopRelay(t, cancel, done)
	t.Logf("%d committed of %d written, drained in %v (%.0f msg/s)", len(committed), writers*perWriter, elapsed.Round(time.Millisecond), float64(len(committed))/elapsed.Seconds())
	return elapsed
}
