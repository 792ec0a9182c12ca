package gormstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestNowIsTheClockOfTheLeases: Store.Now reads the database's clock, as
// the leases do, whatever the host clock says (here 40 s fast), and
// Options.Clock when set.
func TestNowIsTheClockOfTheLeases(t *testing.T) {
	ctx := context.Background()
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 2}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			s, err := gormstore.New(db, gormstore.Options{Config: cfg, HostClock: skewed(40 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			before := dbClockMs(t, db)
			now, err := s.Now(ctx)
			if err != nil {
				t.Fatalf("Now: %v", err)
			}
			after := dbClockMs(t, db)
			if got := now.UnixMilli(); got < before-clockTolerance || got > after+clockTolerance {
				t.Errorf("Now = %d; want the database's clock, between %d and %d", got, before, after)
			}
			if now.Location() != time.UTC {
				t.Errorf("Now().Location() = %v; want UTC", now.Location())
			}

			fixed := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
			s, err = gormstore.New(db, gormstore.Options{Config: cfg, Clock: nowFunc(func() time.Time { return fixed })})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := s.Now(ctx); err != nil || !got.Equal(fixed) {
				t.Errorf("Now with Options.Clock = %v, %v; want %v", got, err, fixed)
			}
		})
	}
}

// TestInspectionReadsLeasesHeartbeatsAndBacklog: Leases, Heartbeats and
// Backlog return the tables as they are — a relay's leases and heartbeat,
// and per bucket the pending and parked rows and the oldest pending
// created_at (parsed from every driver's form) — including a bucket
// outside the count, which an operator must see.
func TestInspectionReadsLeasesHeartbeatsAndBacklog(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 2}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			s, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.AcquireBucketLeases(ctx, "relay-1", 2, time.Minute); err != nil {
				t.Fatal(err)
			}
			msgs := []*outbox.Message{pendingMessage(1), pendingMessage(1), pendingMessage(1), pendingMessage(5)}
			for i, m := range msgs {
				m.CreatedAt = base.Add(time.Duration(i) * time.Minute)
			}
			if err := raw(db).Table(cfg.MessagesTableName()).Create(msgs).Error; err != nil {
				t.Fatal(err)
			}
			if err := db.Table(cfg.MessagesTableName()).Where("id = ?", msgs[0].ID).
				Updates(map[string]any{"parked_at_ms": 1, "parked_reason": "test"}).Error; err != nil {
				t.Fatal(err)
			}

			leases, err := s.Leases(ctx)
			if err != nil || len(leases) != 2 || leases[1].Bucket != 1 || leases[1].Owner == nil || *leases[1].Owner != "relay-1" {
				t.Errorf("Leases = %+v, %v; want buckets 0 and 1 owned by relay-1", leases, err)
			}
			hbs, err := s.Heartbeats(ctx)
			if err != nil || len(hbs) != 1 || hbs[0].RelayID != "relay-1" || hbs[0].StoppedAtMs != nil {
				t.Errorf("Heartbeats = %+v, %v; want relay-1, not stopped", hbs, err)
			}
			got, err := s.Backlog(ctx)
			want := []gormstore.BucketBacklog{
				{Bucket: 1, Pending: 2, Parked: 1, Oldest: base.Add(time.Minute)},
				{Bucket: 5, Pending: 1, Oldest: base.Add(3 * time.Minute)},
			}
			if err != nil || len(got) != len(want) {
				t.Fatalf("Backlog = %+v, %v; want %+v", got, err, want)
			}
			for i := range want {
				if got[i].Bucket != want[i].Bucket || got[i].Pending != want[i].Pending || got[i].Parked != want[i].Parked || !got[i].Oldest.Equal(want[i].Oldest) {
					t.Errorf("Backlog[%d] = %+v; want %+v", i, got[i], want[i])
				}
			}
		})
	}
}

// TestInspectionReadsTheSchemaAndThePlacementOfRows: Indexes finds the
// read path's (bucket, parked_at_ms, id) index and the primary keys,
// MissingColumns names a column the table lacks, RowsOutsideBuckets counts
// rows of a larger bucket count, and NewestRows returns the newest rows'
// placement, newest first — what outbox-relay check reports from.
func TestInspectionReadsTheSchemaAndThePlacementOfRows(t *testing.T) {
	ctx := context.Background()
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 2}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			s, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			idx, err := s.Indexes(ctx, outbox.DefaultMessagesTable)
			if err != nil {
				t.Fatal(err)
			}
			var read, pk bool
			for _, ix := range idx {
				read = read || slices.Equal(ix.Columns, []string{"bucket", "parked_at_ms", "id"}) && !ix.Partial
				pk = pk || ix.Unique && slices.Equal(ix.Columns, []string{"id"})
			}
			if !read || !pk {
				t.Errorf("Indexes(%s) = %+v; want the read path's index and the primary key", outbox.DefaultMessagesTable, idx)
			}
			missing, err := s.MissingColumns(ctx, cfg.MessagesTableName(), []string{"id", "bucket", "no_such_column"})
			if err != nil || !slices.Equal(missing, []string{"no_such_column"}) {
				t.Errorf("MissingColumns = %v, %v; want [no_such_column]", missing, err)
			}
			msgs := []*outbox.Message{pendingMessage(0), pendingMessage(1), pendingMessage(7), pendingMessage(7)}
			if err := raw(db).Table(cfg.MessagesTableName()).Create(msgs).Error; err != nil {
				t.Fatal(err)
			}
			out, err := s.RowsOutsideBuckets(ctx)
			if err != nil || len(out) != 1 || out[0] != (gormstore.BucketRows{Bucket: 7, Rows: 2}) {
				t.Errorf("RowsOutsideBuckets = %+v, %v; want bucket 7 with 2 rows", out, err)
			}
			newest, err := s.NewestRows(ctx, 3)
			if err != nil || len(newest) != 3 || newest[0].ID != msgs[3].ID || newest[2].ID != msgs[1].ID ||
				newest[0].MessageID != msgs[3].MessageID || newest[0].IDErr != nil || newest[1].Bucket != 7 {
				t.Errorf("NewestRows(3) = %+v, %v; want the last three rows, newest first, with their message ids", newest, err)
			}
		})
	}
}
