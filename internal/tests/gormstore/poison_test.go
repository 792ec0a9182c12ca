package gormstore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestARowTheStoreCannotDecodeStallsOnlyItsBucket runs a real relay on each
// database with one row in bucket 0 whose header blob has an unknown codec
// version (9, written by raw SQL as a newer writer or a hand edit would)
// and healthy rows in buckets 1-7. The store reports the row as a
// *relay.CorruptRowError naming it once it is the head of bucket 0; the 7
// healthy rows are published, the corrupt row stays in the table (not
// lost), and the relay either parks it with a corrupt-row reason (a relay
// with containment) or logs the error naming bucket 0 and retries it; it
// stays healthy either way.
func TestARowTheStoreCannotDecodeStallsOnlyItsBucket(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 8}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			table := cfg.MessagesTableName()
			bad := pendingMessage(0)
			bad.Headers = outbox.Headers{{Key: "k", Value: []byte("v")}}
			if err := raw(db).Table(table).Create(bad).Error; err != nil {
				t.Fatal(err)
			}
			blob := outbox.EncodeHeaders(bad.Headers)
			blob[0] = 9 // a codec version this build does not know
			if err := db.Exec(fmt.Sprintf("UPDATE %s SET headers = ? WHERE bucket = 0", table), blob).Error; err != nil {
				t.Fatal(err)
			}
			want := map[outbox.UUID]bool{}
			for b := int32(1); b < 8; b++ {
				m := pendingMessage(b)
				if err := raw(db).Table(table).Create(m).Error; err != nil {
					t.Fatal(err)
				}
				want[m.MessageID] = true
			}

			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			_, err = nextBatch(t.Context(), store, 0, 10, 0)
			var ce *relay.CorruptRowError
			if !errors.As(err, &ce) || ce.Bucket != 0 || ce.ID != bad.ID || !strings.Contains(err.Error(), "unknown version 9") {
				t.Fatalf("NextBatch of the corrupt row = %v; want a *relay.CorruptRowError for row %d of bucket 0 (the test's premise)", err, bad.ID)
			}
			var logs testenv.Logs
			pub := relaytest.NewPublisher()
			r := runRelay(t, db, store, pub, logs.Logger())
			deadline := time.Now().Add(20 * time.Second)
			parked := func() bool {
				var n int64
				_ = raw(db).Table(table).Where("id = ? AND parked_at_ms IS NOT NULL", bad.ID).Count(&n).Error
				return n == 1
			}
			rowsLeft := func() int64 {
				var n int64
				_ = raw(db).Table(table).Count(&n).Error
				return n
			}
			// Acknowledged is not yet deleted, and the first cycle ends after
			// the deletes: wait for both before judging.
			for len(pub.Acknowledged()) < len(want) || (len(logs.Matching("bucket store error")) < 2 && !parked()) || rowsLeft() != 1 || r.Health() != nil {
				if time.Now().After(deadline) {
					t.Fatalf("after 20s: %d of %d healthy rows published, %d WARN lines about bucket 0, corrupt row parked %v, %d rows left (want 1), Health() = %v (want nil: the error is bucket 0's)",
						len(pub.Acknowledged()), len(want), len(logs.Matching("bucket store error")), parked(), rowsLeft(), r.Health())
				}
				time.Sleep(20 * time.Millisecond)
			}
			for _, m := range pub.Acknowledged() {
				if !want[m.MessageID] {
					t.Errorf("published message %v (bucket %d); want only the 7 healthy rows", m.MessageID, m.Bucket)
				}
			}
			if err := r.Health(); err != nil {
				t.Errorf("Health() = %v; want nil (the error is bucket 0's)", err)
			}
			var left []struct {
				MessageID outbox.UUID
				Bucket    int32
			}
			if err := raw(db).Table(table).Select("message_id, bucket").Find(&left).Error; err != nil {
				t.Fatal(err)
			}
			if len(left) != 1 || left[0].MessageID != bad.MessageID || left[0].Bucket != 0 {
				t.Errorf("rows left = %+v; want only the corrupt row %v in bucket 0", left, bad.MessageID)
			}
			warns := logs.Matching("bucket store error")
			for _, w := range warns {
				if !strings.Contains(w, "bucket=0 ") || !strings.Contains(w, "unknown version 9") {
					t.Errorf("WARN line %q; want bucket=0 and the decoding error", w)
				}
			}
			if parked() {
				rows, err := store.ListParked(t.Context(), 0)
				if err != nil || len(rows) != 1 || !strings.HasPrefix(rows[0].Reason, relay.CorruptReasonPrefix) {
					t.Errorf("ListParked = %+v, %v; want the corrupt row with a %q reason", rows, err, relay.CorruptReasonPrefix)
				}
			} else {
				t.Logf("%s", warns[0])
			}
		})
	}
}
