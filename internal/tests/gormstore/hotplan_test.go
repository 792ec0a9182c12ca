package gormstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// errRollback ends a test transaction that must change nothing.
var errRollback = errors.New("rollback")

// TestHotPathStaysOnTheIndexAfterABurstOnPostgres: 200,000 rows in 8
// buckets, then a burst that publishes 24,000 of bucket 0's 25,000 rows in
// batches of 500 through the store (autovacuum off on the table, no VACUUM,
// statistics from before the burst), leaving dead tuples at the bucket's
// head. MarkPublished must delete by location; NextBatch's statement and
// MarkPublished's DELETE by id (for rows the store does not know the
// location of) must still be index scans of the (bucket, parked_at_ms, id)
// index or the primary key (a bitmap of the listed ids in the primary key
// included) — never a bitmap scan of the whole bucket nor a sequential scan
// — for the custom plan and for the generic plan a driver's cached
// prepared statement may get. The figures (buffers, time) are logged.
func TestHotPathStaysOnTheIndexAfterABurstOnPostgres(t *testing.T) {
	pg := postgresOpener(t)
	rec := &testenv.SQLRecorder{}
	db := pg.Open(t, &gorm.Config{Logger: rec})
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db,
		"ALTER TABLE outbox_messages SET (autovacuum_enabled = false)",
		`INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
		 SELECT gen_random_uuid(), g % 8, 'orders', '\x00'::bytea, now() FROM generate_series(1, 200000) g`,
		"ANALYZE outbox_messages")
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 48 {
		batch, err := nextBatch(ctx, store, 0, 500, 0)
		if err != nil || len(batch) != 500 {
			t.Fatalf("NextBatch = %d rows, %v; want 500", len(batch), err)
		}
		if err := store.MarkPublished(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	onIndex := func(what, stmt, plan string) {
		t.Helper()
		if !strings.Contains(plan, "Index Scan using idx_outbox_messages_bucket_parked_id") &&
			!strings.Contains(plan, "Index Only Scan using idx_outbox_messages_bucket_parked_id") &&
			!strings.Contains(plan, "Index Scan using outbox_messages_pkey") &&
			!strings.Contains(plan, "Bitmap Index Scan on outbox_messages_pkey") ||
			strings.Contains(plan, "Bitmap Index Scan on idx_outbox_messages_bucket_parked_id") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
			t.Fatalf("%s is not an index scan of (bucket, parked_at_ms, id) or the primary key:\n%s\n%s", what, stmt, plan)
		}
		t.Logf("%s plan after the burst:\n%s", what, plan)
	}

	rec.Reset()
	batch, err := nextBatch(ctx, store, 0, 500, 0)
	if err != nil || len(batch) != 500 {
		t.Fatalf("NextBatch = %d rows, %v; want 500", len(batch), err)
	}
	nb := guardedSelect(t, "NextBatch", rec.Statements())
	onIndex("NextBatch", nb, explainAnalyzed(t, db, nb, true))

	rec.Reset()
	if err := store.MarkPublished(ctx, batch[:197]); err != nil {
		t.Fatal(err)
	}
	stmts := rec.Statements()
	if len(stmts) != 1 || !strings.HasPrefix(stmts[0], "DELETE") || !strings.Contains(stmts[0], byLocation) {
		t.Fatalf("MarkPublished issued %q; want one DELETE by location (no BEGIN/COMMIT)", stmts)
	}
	// The delete by id, for rows the store did not read or that moved (see
	// locations.go): explained for the next 197 rows.
	stmt := deleteStatement(t, pg, outbox.Config{}, false, 0, ids(batch[197:394])).SQL // $1 the bucket, $2 the ids
	del := strings.NewReplacer("$1", "0", "$2", "'"+idList(batch[197:394])+"'").Replace(stmt)
	onIndex("MarkPublished by id (custom plan)", del, explainAnalyzed(t, db, del, false))

	// A driver caching the statement may get PostgreSQL's generic plan.
	var generic []string
	err = db.Connection(func(c *gorm.DB) error {
		if err := c.Exec("PREPARE i17_delete(int, text) AS " + stmt).Error; err != nil {
			return err
		}
		defer c.Exec("DEALLOCATE i17_delete")
		return c.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("SET LOCAL plan_cache_mode = force_generic_plan").Error; err != nil {
				return err
			}
			if err := tx.Raw("EXPLAIN (ANALYZE, BUFFERS) EXECUTE i17_delete(0, '" + idList(batch[197:394]) + "')").Scan(&generic).Error; err != nil {
				return err
			}
			return errRollback
		})
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	onIndex("MarkPublished by id (generic plan)", "EXECUTE i17_delete", strings.Join(generic, "\n"))
}

// idList is the ids of msgs as MarkPublished's PostgreSQL array literal.
func idList(msgs []*outbox.Message) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(m.ID, 10))
	}
	b.WriteByte('}')
	return b.String()
}
