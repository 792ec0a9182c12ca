package gormstore_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/gorm"
)

// parkEnv is a fresh set of outbox tables on one database with a store on a
// manual clock.
type parkEnv struct {
	t     *testing.T
	db    *gorm.DB
	cfg   outbox.Config
	clock *relaytest.ManualClock
	s     *gormstore.Store
	dial  string
}

func newParkEnv(t *testing.T, o testenv.Opener, db *gorm.DB) *parkEnv {
	t.Helper()
	if db == nil {
		db = o.Open(t, nil)
	}
	cfg := newConfig(t, db, 4)
	clock := relaytest.NewManualClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	s, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := relaytest.Owned(s.AcquireBucketLeases(t.Context(), "relay-a", 4, 30*time.Second)); err != nil || len(got) != 4 {
		t.Fatalf("AcquireBucketLeases = %v, %v; want all 4 buckets", got, err)
	}
	return &parkEnv{t: t, db: db, cfg: cfg, clock: clock, s: s, dial: o.Name}
}

// insert writes rows of key (nil = keyless) in bucket, in order, and
// returns their ids.
func (e *parkEnv) insert(bucket int32, key []byte, n int) []int64 {
	e.t.Helper()
	ids := make([]int64, n)
	for i := range n {
		m := pendingMessage(bucket)
		m.Key = key
		if err := raw(e.db).Table(e.cfg.MessagesTableName()).Create(m).Error; err != nil {
			e.t.Fatal(err)
		}
		ids[i] = m.ID
	}
	return ids
}

func (e *parkEnv) park(bucket int, id int64, reason string) {
	e.t.Helper()
	if err := e.s.Park(e.t.Context(), "relay-a", bucket, id, reason); err != nil {
		e.t.Fatalf("Park(%d, %d): %v", bucket, id, err)
	}
}

// batchIDs returns the ids NextBatch gives for bucket.
func (e *parkEnv) batchIDs(bucket int) []int64 {
	e.t.Helper()
	b, err := nextBatch(e.t.Context(), e.s, bucket, 100, 0)
	if err != nil {
		e.t.Fatalf("NextBatch(%d): %v", bucket, err)
	}
	out := []int64{}
	for _, m := range b {
		out = append(out, m.ID)
	}
	return out
}

// parkedRow is a row's parking state as stored.
type parkedRow struct {
	ID           int64
	ParkedAtMs   *int64
	ParkedReason *string
}

func (e *parkEnv) state() map[int64]parkedRow {
	e.t.Helper()
	var rows []parkedRow
	if err := e.db.Table(e.cfg.MessagesTableName()).Select("id, parked_at_ms, parked_reason").Find(&rows).Error; err != nil {
		e.t.Fatal(err)
	}
	m := map[int64]parkedRow{}
	for _, r := range rows {
		m[r.ID] = r
	}
	return m
}

func (e *parkEnv) parkedIDs() []int64 {
	e.t.Helper()
	var ids []int64
	for id, r := range e.state() {
		if r.ParkedAtMs != nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func forEachParkDB(t *testing.T, f func(t *testing.T, e *parkEnv)) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) { f(t, newParkEnv(t, o, nil)) })
	}
}

func TestParkedRowsAreSkippedByNextBatchAndBucketsWithPendingAndCountedApart(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		ctx := t.Context()
		a := e.insert(1, []byte("a"), 3)
		b := e.insert(1, []byte("b"), 2)
		only := e.insert(2, []byte("c"), 1)
		e.park(1, a[0], "rejected")
		e.park(2, only[0], "rejected")
		if got := e.batchIDs(1); !slices.Equal(got, b) {
			t.Fatalf("NextBatch(1) = %v; want only key b's rows %v", got, b)
		}
		if got := e.batchIDs(2); len(got) != 0 {
			t.Fatalf("NextBatch(2) = %v; want none (its only row is parked)", got)
		}
		if got, err := e.s.BucketsWithPending(ctx, []int{0, 1, 2, 3}); err != nil || !slices.Equal(got, []int{1}) {
			t.Fatalf("BucketsWithPending = %v, %v; want [1] (bucket 2 holds only a parked row)", got, err)
		}
		p, err := e.s.PendingMetrics(ctx)
		if err != nil || p.Count != 4 || p.Parked != 2 {
			t.Fatalf("PendingMetrics = %+v, %v; want Count 4 (a's waiting rows are pending), Parked 2", p, err)
		}
		st := e.state()
		if r := st[a[1]]; r.ParkedAtMs != nil {
			t.Fatalf("row %d behind the parked row is marked parked (%v); want it unmarked, held by the read", a[1], *r.ParkedReason)
		}
		if r := st[a[0]]; r.ParkedAtMs == nil || *r.ParkedAtMs != e.clock.Now().UnixMilli() {
			t.Fatalf("parked_at_ms = %v; want the store clock's %d", r.ParkedAtMs, e.clock.Now().UnixMilli())
		}
	})
}

// corrupt writes a header blob of unknown version 9 into row id.
func (e *parkEnv) corruptHeaders(id int64) {
	e.t.Helper()
	blob := outbox.EncodeHeaders(outbox.Headers{{Key: "k", Value: []byte("v")}})
	blob[0] = 9
	if err := e.db.Table(e.cfg.MessagesTableName()).Where("id = ?", id).Update("headers", blob).Error; err != nil {
		e.t.Fatal(err)
	}
}

func TestACorruptRowEndsTheBatchWithItsError(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		ctx := t.Context()
		ids := e.insert(0, []byte("k"), 4)
		e.corruptHeaders(ids[2])
		batch, err := nextBatch(ctx, e.s, 0, 10, 0)
		var ce *relay.CorruptRowError
		if !errors.As(err, &ce) || ce.ID != ids[2] || len(batch) != 2 || batch[0].ID != ids[0] || batch[1].ID != ids[1] {
			t.Fatalf("NextBatch = %d rows, %v; want the 2 rows before the corrupt one, with its *relay.CorruptRowError", len(batch), err)
		}
		if err := e.s.MarkPublished(ctx, batch); err != nil {
			t.Fatal(err)
		}
		batch, err = nextBatch(ctx, e.s, 0, 10, 0)
		if !errors.As(err, &ce) || len(batch) != 0 || ce.ID != ids[2] || ce.Bucket != 0 || !errors.Is(err, outbox.ErrCorruptHeaders) {
			t.Fatalf("NextBatch at the corrupt head = %v; want a *relay.CorruptRowError for row %d in bucket 0 wrapping ErrCorruptHeaders", err, ids[2])
		}
		e.park(0, ce.ID, relay.CorruptReasonPrefix+ce.Err.Error())
		if got := e.batchIDs(0); !slices.Equal(got, ids[3:]) {
			t.Fatalf("NextBatch after parking the corrupt row = %v; want %v", got, ids[3:])
		}
	})
}

func TestARowWhoseMessageIDIsNotAUUIDIsCorruptAndCanBeParkedAndListed(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		if o.Name == testenv.Postgres {
			continue // a native uuid column holds only UUIDs
		}
		t.Run(o.Name, func(t *testing.T) {
			e := newParkEnv(t, o, nil)
			ctx := t.Context()
			ids := e.insert(3, []byte("k"), 2)
			if err := e.db.Table(e.cfg.MessagesTableName()).Where("id = ?", ids[0]).Update("message_id", "not-a-uuid-16chr").Error; err != nil {
				t.Fatal(err)
			}
			_, err := nextBatch(ctx, e.s, 3, 10, 0)
			var ce *relay.CorruptRowError
			if !errors.As(err, &ce) || ce.ID != ids[0] || ce.Bucket != 3 {
				t.Fatalf("NextBatch = %v; want a *relay.CorruptRowError for row %d", err, ids[0])
			}
			e.park(3, ids[0], relay.CorruptReasonPrefix+ce.Err.Error())
			rows, err := e.s.ListParked(ctx, 0)
			if err != nil || len(rows) != 1 || rows[0].ID != ids[0] || rows[0].MessageID != "not-a-uuid-16chr" || rows[0].Bucket != 3 ||
				!strings.HasPrefix(rows[0].Reason, relay.CorruptReasonPrefix) || string(rows[0].Key) != "k" || rows[0].Size != 2 {
				t.Fatalf("ListParked = %+v, %v; want row %d with its stored message id, key k, size 2 and a corrupt reason", rows, err, ids[0])
			}
			if !rows[0].ParkedAt.Equal(e.clock.Now()) || rows[0].CreatedAt.IsZero() {
				t.Fatalf("ListParked times = created %v parked %v; want parked at %v", rows[0].CreatedAt, rows[0].ParkedAt, e.clock.Now())
			}
			if got := e.batchIDs(3); !slices.Equal(got, ids[1:]) {
				t.Fatalf("NextBatch after parking = %v; want %v", got, ids[1:])
			}
			if n, err := e.s.DeleteParked(ctx, relay.ParkedSelector{ID: ids[0]}); err != nil || n != 1 {
				t.Fatalf("DeleteParked(id) = %d, %v; want 1 (the corrupt row alone)", n, err)
			}
		})
	}
}

func TestRequeueRestoresTheKeysRowsInIDOrderAheadOfLaterRows(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		ctx := t.Context()
		early := e.insert(1, []byte("k"), 3)
		e.park(1, early[0], "rejected")
		// Rows an earlier release held behind the head (parked with a held
		// reason).
		e.markParked(early[1], relay.HeldReasonPrefix+strconv.FormatInt(early[0], 10))
		e.markParked(early[2], relay.HeldReasonPrefix+strconv.FormatInt(early[0], 10))
		later := e.insert(1, []byte("k"), 2)
		other := e.insert(1, []byte("other"), 1)
		newest := e.insert(1, []byte("k"), 1)
		if got := e.batchIDs(1); !slices.Equal(got, other) {
			t.Fatalf("NextBatch while k is parked = %v; want only %v", got, other)
		}
		// By a held row's id: the key's parked rows in the bucket come back.
		n, err := e.s.RequeueParked(ctx, relay.ParkedSelector{ID: early[2]})
		if err != nil || n != 3 {
			t.Fatalf("RequeueParked(id of a held row) = %d, %v; want the key's 3 parked rows", n, err)
		}
		want := slices.Concat(early, later, other, newest)
		if got := e.batchIDs(1); !slices.Equal(got, want) {
			t.Fatalf("NextBatch after requeue = %v; want %v (the requeued rows first, in id order)", got, want)
		}
		if n, err := e.s.RequeueParked(ctx, relay.ParkedSelector{All: true}); err != nil || n != 0 {
			t.Fatalf("RequeueParked(all) with nothing parked = %d, %v; want 0", n, err)
		}
		if _, err := e.s.RequeueParked(ctx, relay.ParkedSelector{}); err == nil {
			t.Fatal("RequeueParked(empty selector) succeeded; want a validation error")
		}
	})
}

func TestDeleteParkedNeverDeletesAnUnparkedRow(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		ctx := t.Context()
		k := e.insert(0, []byte("k"), 2)
		keyless := e.insert(0, nil, 2)
		e.park(0, k[0], "rejected")
		e.park(0, keyless[0], "rejected")
		if n, err := e.s.DeleteParked(ctx, relay.ParkedSelector{ID: keyless[0]}); err != nil || n != 1 {
			t.Fatalf("DeleteParked(keyless id) = %d, %v; want 1", n, err)
		}
		if n, err := e.s.DeleteParked(ctx, relay.ParkedSelector{ID: keyless[1]}); err != nil || n != 0 {
			t.Fatalf("DeleteParked(unparked id) = %d, %v; want 0", n, err)
		}
		if n, err := e.s.DeleteParked(ctx, relay.ParkedSelector{All: true}); err != nil || n != 1 {
			t.Fatalf("DeleteParked(all) = %d, %v; want 1", n, err)
		}
		if got := e.batchIDs(0); !slices.Equal(got, []int64{k[1], keyless[1]}) {
			t.Fatalf("rows left = %v; want the unparked %v", got, []int64{k[1], keyless[1]})
		}
	})
}

func TestFleetCanParkWaitsForEveryLiveRelayToSupportParking(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		ctx := t.Context()
		can := func() bool {
			t.Helper()
			f, err := e.s.Fleet(ctx)
			if err != nil {
				t.Fatalf("Fleet: %v", err)
			}
			return f.CanPark
		}
		oldBeat := func(id string, at time.Time, stopped bool) {
			t.Helper()
			var st any
			if stopped {
				st = at.UnixMilli()
			}
			if err := e.db.Exec(fmt.Sprintf("INSERT INTO %s (relay_id, last_seen_ms, stopped_at_ms) VALUES (?, ?, ?)", e.cfg.RelaysTableName()),
				id, at.UnixMilli(), st).Error; err != nil {
				t.Fatal(err)
			}
		}
		// Before any acquisition the window is DefaultLiveness.
		oldBeat("old-stale", e.clock.Now().Add(-gormstore.DefaultLiveness-time.Second), false)
		oldBeat("old-stopped", e.clock.Now(), true)
		if !can() {
			t.Fatal("Fleet().CanPark = false with only a stale and a stopped old relay; want true")
		}
		if _, err := e.s.AcquireBucketLeases(ctx, "new", 4, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if !can() {
			t.Fatal("Fleet().CanPark = false with only this (parking) relay live; want true")
		}
		oldBeat("old-live", e.clock.Now().Add(-5*time.Second), false)
		if can() {
			t.Fatal("Fleet().CanPark = true with a live relay whose features is 0; want false")
		}
		// Past the latest acquisition's lease duration (10s) it is not live.
		e.clock.Advance(6 * time.Second)
		if !can() {
			t.Fatal("Fleet().CanPark = false once the old relay's heartbeat is older than the lease; want true")
		}
		var features int64
		if err := e.db.Table(e.cfg.RelaysTableName()).Where("relay_id = ?", "new").Pluck("features", &features).Error; err != nil || features != outbox.RelayFeatureParking {
			t.Fatalf("features of the store's heartbeat = %d, %v; want %d", features, err, outbox.RelayFeatureParking)
		}
	})
}

func TestParkStoresAReasonTheColumnHolds(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		id := e.insert(0, []byte("k"), 1)[0]
		long := strings.Repeat("é", 600) + strings.Repeat("x", 600) + "\x00\xff"
		e.park(0, id, long)
		r := e.state()[id]
		if r.ParkedReason == nil {
			t.Fatal("parked_reason is NULL")
		}
		got := *r.ParkedReason
		if n := len([]rune(got)); n != outbox.MaxParkedReasonLength {
			t.Fatalf("stored reason has %d characters; want %d", n, outbox.MaxParkedReasonLength)
		}
		if e.dial != testenv.MySQL && !strings.HasPrefix(got, "éé") {
			t.Fatalf("stored reason starts %q; want the original characters", got[:8])
		}
		// Parking again changes nothing.
		e.clock.Advance(time.Second) // within the lease
		e.park(0, id, "second")
		if again := e.state()[id]; *again.ParkedAtMs != *r.ParkedAtMs || *again.ParkedReason != got {
			t.Fatalf("Park of a parked row changed it to %v %q", *again.ParkedAtMs, *again.ParkedReason)
		}
	})
}

func TestTheParkingColumnsAreNeverWrittenThroughTheModel(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		at, why := int64(42), "user"
		m := &outbox.Message{Topic: "orders", Value: []byte("v"), ParkedAtMs: &at, ParkedReason: &why}
		if err := e.db.Scopes(outbox.WithConfig(e.cfg)).Create(m).Error; err != nil {
			t.Fatal(err)
		}
		if err := e.db.Table(e.cfg.MessagesTableName()).Where("id = ?", m.ID).Updates(&outbox.Message{ParkedAtMs: &at, ParkedReason: &why, Topic: "t2"}).Error; err != nil {
			t.Fatal(err)
		}
		if r := e.state()[m.ID]; r.ParkedAtMs != nil || r.ParkedReason != nil {
			t.Fatalf("after Create and Updates through the model: parked_at_ms %v, parked_reason %v; want NULL", r.ParkedAtMs, r.ParkedReason)
		}
	})
}

// markParked parks row id as a relay of any release would have, straight
// in the table.
func (e *parkEnv) markParked(id int64, reason string) {
	e.t.Helper()
	if err := raw(e.db).Table(e.cfg.MessagesTableName()).Where("id = ?", id).
		Updates(map[string]any{"parked_at_ms": e.clock.Now().UnixMilli(), "parked_reason": reason}).Error; err != nil {
		e.t.Fatal(err)
	}
}

// TestDiscardByIDLeavesTheCorruptRowsOfItsKey (defect 4 of issue 27): an
// ID selection of a parked key's row chooses the key's parked rows in its
// bucket except the corrupt ones (parked alone), as the CLI's preview
// lists them.
func TestDiscardByIDLeavesTheCorruptRowsOfItsKey(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		ctx := t.Context()
		k := e.insert(0, []byte("K"), 3)
		e.markParked(k[0], relay.CorruptReasonPrefix+"message id is not a UUID")
		e.markParked(k[1], "rejected")
		e.markParked(k[2], relay.HeldReasonPrefix+strconv.FormatInt(k[1], 10))
		if n, err := e.s.DeleteParked(ctx, relay.ParkedSelector{ID: k[1]}); err != nil || n != 2 {
			t.Fatalf("DeleteParked(ID %d) = %d, %v; want 2 (the head and the row held behind it)", k[1], n, err)
		}
		if got := e.parkedIDs(); !slices.Equal(got, k[:1]) {
			t.Fatalf("parked after the discard: %v; want the corrupt row %v", got, k[:1])
		}
	})
}

// TestRequeueByKeyFindsTheKeysRowsInEveryBucketOfTheTable (issue 27): a
// requeue by key finds the rows from the table, including a bucket beyond
// the store's BucketCount (rows written with another count).
func TestRequeueByKeyFindsTheKeysRowsInEveryBucketOfTheTable(t *testing.T) {
	forEachParkDB(t, func(t *testing.T, e *parkEnv) {
		ctx := t.Context()
		in := e.insert(1, []byte("K"), 1)
		beyond := e.insert(9, []byte("K"), 1)
		e.markParked(in[0], "rejected")
		e.markParked(beyond[0], "rejected")
		rows, err := e.s.ListParked(ctx, 0)
		if err != nil || len(rows) != 2 {
			t.Fatalf("ListParked = %d rows, %v; want 2", len(rows), err)
		}
		if n, err := e.s.RequeueParked(ctx, relay.ParkedSelector{Key: []byte("K")}); err != nil || n != 2 {
			t.Fatalf("RequeueParked(key K) = %d, %v; want 2", n, err)
		}
	})
}
