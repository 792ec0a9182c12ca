package gormstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// TestNextBatchReadsTheBucketIndexOnPostgres: NextBatch's query must be
// planned on the (bucket, id) index. With "bucket = $1 ORDER BY id" the
// PostgreSQL planner walks the primary key and filters, reading every row of
// the other buckets ahead of this bucket's head (about 130 ms per batch at
// 200,000 rows instead of under 1 ms).
func TestNextBatchReadsTheBucketIndexOnPostgres(t *testing.T) {
	var pg *testenv.Opener
	for _, o := range testenv.Databases(t) {
		if o.Name == testenv.Postgres {
			pg = &o
		}
	}
	if pg == nil {
		t.Skip("OUTBOX_TEST_POSTGRES_DSN not set")
	}
	rec := &testenv.SQLRecorder{}
	db := pg.Open(t, &gorm.Config{Logger: rec})
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db,
		`INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
		 SELECT gen_random_uuid(), g % 8, 'orders', '\x00'::bytea, now() FROM generate_series(1, 50000) g`,
		"ANALYZE outbox_messages")
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec.Reset()
	batch, err := store.NextBatch(context.Background(), 3, 500)
	if err != nil || len(batch) != 500 {
		t.Fatalf("NextBatch = %d rows, %v; want 500", len(batch), err)
	}
	for i := 1; i < len(batch); i++ {
		if batch[i].Bucket != 3 || batch[i].ID <= batch[i-1].ID {
			t.Fatalf("row %d: bucket %d id %d after id %d; want bucket 3 in id order", i, batch[i].Bucket, batch[i].ID, batch[i-1].ID)
		}
	}
	stmts := rec.Statements()
	if len(stmts) != 1 {
		t.Fatalf("NextBatch issued %d statements; want 1", len(stmts))
	}
	var plan []string
	if err := db.Raw("EXPLAIN " + stmts[0]).Scan(&plan).Error; err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "idx_outbox_messages_bucket_id") {
		t.Fatalf("NextBatch plan does not use the (bucket, id) index:\n%s\n%s", stmts[0], text)
	}
}
