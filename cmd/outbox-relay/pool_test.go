package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
)

// TestWorkerPoolKeepsConnectionsForItsConcurrentStatements runs the worker
// (in process, as run does) over a backlog spread on 4 buckets, with its
// default MaxConcurrentBuckets (4) and small batches so that the fetches
// and deletes of the buckets overlap, on every available database. Its
// pool must keep an idle connection for each statement the relay can have
// in flight (a fetch and a delete per bucket served at once, the lease
// renewal, the backlog sample: 2×4+2): no connection is closed for lack of
// an idle slot (sql.DBStats.MaxIdleClosed), neither in the drain nor when
// that many connections are in use at once and released. With
// database/sql's default of 2 idle connections, the worker closed and
// reopened a database session between statements.
//
// As many buckets as MaxConcurrentBuckets: a bucket's delete may still run
// while its worker serves another bucket, so with more buckets than that
// the deletes in flight are bounded by the buckets, not by 4.
func TestWorkerPoolKeepsConnectionsForItsConcurrentStatements(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		cfg := outbox.Config{BucketCount: 4, MessagesTable: "pool_messages", LeasesTable: "pool_leases", RelaysTable: "pool_relays"}
		useOutbox(t, db, cfg)
		broker := testenv.NewFake(t)
		topic := testenv.Unique("pool-")
		broker.CreateTopic(t, topic, 4, nil)
		const rows = 2000
		msgs := make([]*outbox.Message, rows)
		for i := range msgs {
			msgs[i] = outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i%64), fmt.Sprintf("value-%d", i))
		}
		for i := 0; i < rows; i += 500 {
			if err := outbox.Enqueue(db, msgs[i:i+500]...); err != nil {
				t.Fatal(err)
			}
		}

		driver, dsn := dsnOf(t, db)
		wcfg, err := parseConfig([]string{"-db-driver", driver, "-db-dsn", dsn, "-bucket-count", "4",
			"-messages-table", cfg.MessagesTable, "-leases-table", cfg.LeasesTable, "-relays-table", cfg.RelaysTable,
			"-kafka-brokers", strings.Join(broker.Addrs, ","), "-listen", "", "-log-format", "json",
			"-batch-size", "25", "-poll-interval", "50ms", "-metrics-interval", "50ms"}, noEnv)
		if err != nil {
			t.Fatal(err)
		}
		var logs testenv.Logs
		w, err := build(wcfg, &logs)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.close)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan int, 1)
		go func() { done <- w.run(ctx) }()

		eventually(t, "the messages table is empty", logDump{&logs}, func() bool {
			var n int64
			return db.Table(cfg.MessagesTableName()).Count(&n).Error == nil && n == 0
		})
		cancel()
		if code := <-done; code != exitOK {
			t.Fatalf("worker exited %d; want %d\n%s", code, exitOK, logDump{&logs})
		}
		sqlDB, err := w.db.DB()
		if err != nil {
			t.Fatal(err)
		}
		st := sqlDB.Stats()
		closed := st.MaxIdleClosed
		if closed != 0 {
			t.Errorf("draining %d rows closed %d connections for lack of an idle slot (%d open at the end); want 0",
				rows, closed, st.OpenConnections)
		}

		// As many connections in use at once as the relay may have
		// statements in flight all stay open once released.
		inFlight := 2*relay.DefaultMaxConcurrentBuckets + 2
		conns := make([]*sql.Conn, inFlight)
		for i := range conns {
			if conns[i], err = sqlDB.Conn(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range conns {
			_ = c.Close()
		}
		if st := sqlDB.Stats(); st.MaxIdleClosed != closed || st.Idle < inFlight {
			t.Errorf("after %d connections in use at once were released: %d closed for lack of an idle slot, %d idle; want 0 closed, %d idle",
				inFlight, st.MaxIdleClosed-closed, st.Idle, inFlight)
		}
	})
}

// logDump prints collected logs on failure.
type logDump struct{ *testenv.Logs }

func (l logDump) String() string { return strings.Join(l.Matching(""), "\n") }
