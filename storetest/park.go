package storetest

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// parkScenarios run only for a store implementing relay.Parker (and, for
// the admin ones, relay.ParkAdmin).
var parkScenarios = []struct {
	name string
	run  func(t *testing.T, f Factory)
}{
	{"parked_rows_are_skipped_by_next_batch_and_pending_probe_and_counted_apart", parkedRowsSkipped},
	{"parked_heads_are_the_lowest_id_per_key_neither_held_nor_corrupt", parkedHeads},
	{"hold_behind_parks_only_while_the_head_is_parked", holdBehindNeedsParkedHead},
	{"requeue_by_key_restores_the_rows_in_id_order", requeueRestoresOrder},
	{"delete_parked_never_deletes_an_unparked_row", deleteParkedOnlyParked},
	{"a_fleet_of_current_relays_can_park", fleetCanPark},
	{"a_corrupt_row_ends_the_batch_and_is_reported_at_the_head", corruptRow},
}

// parker returns a store of e implementing relay.Parker, or skips t.
func (e *env) parker() (relay.Store, relay.Parker) {
	e.t.Helper()
	s := e.relay("relay-a").s
	p, ok := s.(relay.Parker)
	if !ok {
		e.t.Skip("storetest: the store does not implement relay.Parker")
	}
	return s, p
}

func (e *env) admin(s relay.Store) relay.ParkAdmin {
	e.t.Helper()
	a, ok := s.(relay.ParkAdmin)
	if !ok {
		e.t.Skip("storetest: the store does not implement relay.ParkAdmin")
	}
	return a
}

// keyed inserts n messages of key in bucket and returns them as NextBatch
// reads them back (with their ids).
func (e *env) keyed(s relay.Store, bucket int, key string, n int) []*outbox.Message {
	e.t.Helper()
	before, err := s.NextBatch(e.ctx, bucket, 10000)
	if err != nil {
		e.t.Fatalf("NextBatch(%d): %v", bucket, err)
	}
	for range n {
		m := e.msg(bucket, start)
		m.Key = []byte(key)
		e.insert(m)
	}
	after, err := s.NextBatch(e.ctx, bucket, 10000)
	if err != nil || len(after) != len(before)+n {
		e.t.Fatalf("NextBatch(%d) after inserting %d rows = %d rows, %v; want %d", bucket, n, len(after), err, len(before)+n)
	}
	return after[len(before):]
}

func msgIDs(ms []*outbox.Message) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func (e *env) batch(s relay.Store, bucket int) []int64 {
	e.t.Helper()
	got, err := s.NextBatch(e.ctx, bucket, 10000)
	if err != nil {
		e.t.Fatalf("NextBatch(%d): %v", bucket, err)
	}
	return msgIDs(got)
}

func (e *env) park(p relay.Parker, bucket int, id int64, reason string) {
	e.t.Helper()
	if err := p.Park(e.ctx, bucket, id, reason); err != nil {
		e.t.Fatalf("Park(%d, %d): %v", bucket, id, err)
	}
}

func (e *env) hold(p relay.Parker, bucket int, head int64, ids []int64, want bool) {
	e.t.Helper()
	if ok, err := p.HoldBehind(e.ctx, bucket, head, ids); err != nil || ok != want {
		e.t.Fatalf("HoldBehind(%d, head %d, %v) = %v, %v; want %v", bucket, head, ids, ok, err, want)
	}
}

func parkedRowsSkipped(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s, p := e.parker()
	a := msgIDs(e.keyed(s, 1, "a", 3))
	b := msgIDs(e.keyed(s, 1, "b", 2))
	only := msgIDs(e.keyed(s, 2, "c", 1))
	e.park(p, 1, a[0], "rejected")
	e.hold(p, 1, a[0], a[1:], true)
	e.park(p, 2, only[0], "rejected")
	if got := e.batch(s, 1); !slices.Equal(got, b) {
		t.Fatalf("NextBatch(1) = %v; want the unparked rows %v", got, b)
	}
	if got, err := s.BucketsWithPending(e.ctx, all(8)); err != nil || !slices.Equal(got, []int{1}) {
		t.Fatalf("BucketsWithPending = %v, %v; want [1] (bucket 2 holds only a parked row)", got, err)
	}
	if pm, ok := s.(relay.PendingMetricsStore); ok {
		got, err := pm.PendingMetrics(e.ctx)
		if err != nil || got == nil || got.Count != 2 || got.Parked != 4 {
			t.Fatalf("PendingMetrics = %+v, %v; want Count 2, Parked 4", got, err)
		}
	}
}

func parkedHeads(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s, p := e.parker()
	a := msgIDs(e.keyed(s, 1, "a", 3))
	c := msgIDs(e.keyed(s, 1, "c", 1))
	d := msgIDs(e.keyed(s, 3, "d", 2))
	e.park(p, 1, a[0], "rejected")
	e.hold(p, 1, a[0], a[1:], true)
	e.park(p, 1, c[0], relay.CorruptReasonPrefix+"bad headers")
	e.park(p, 3, d[1], "rejected")
	got, err := p.ParkedHeads(e.ctx, []int{1, 2, 3})
	if err != nil {
		t.Fatalf("ParkedHeads: %v", err)
	}
	want := []relay.ParkedHead{{Bucket: 1, Key: []byte("a"), ID: a[0]}, {Bucket: 3, Key: []byte("d"), ID: d[1]}}
	slices.SortFunc(got, func(x, y relay.ParkedHead) int { return x.Bucket - y.Bucket })
	if len(got) != len(want) {
		t.Fatalf("ParkedHeads = %v; want %v", got, want)
	}
	for i := range want {
		if got[i].Bucket != want[i].Bucket || string(got[i].Key) != string(want[i].Key) || got[i].ID != want[i].ID {
			t.Fatalf("ParkedHeads = %v; want %v (held and corrupt rows are not heads)", got, want)
		}
	}
	if got, err := p.ParkedHeads(e.ctx, []int{2}); err != nil || len(got) != 0 {
		t.Fatalf("ParkedHeads(bucket without parked rows) = %v, %v; want none", got, err)
	}
}

func holdBehindNeedsParkedHead(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s, p := e.parker()
	k := msgIDs(e.keyed(s, 4, "k", 3))
	e.hold(p, 4, k[0], k[1:], false)
	if got := e.batch(s, 4); !slices.Equal(got, k) {
		t.Fatalf("NextBatch after HoldBehind of an unparked head = %v; want every row %v", got, k)
	}
	e.park(p, 4, k[0], "rejected")
	e.hold(p, 4, k[0], k[1:2], true)
	if got := e.batch(s, 4); !slices.Equal(got, k[2:]) {
		t.Fatalf("NextBatch after HoldBehind = %v; want %v", got, k[2:])
	}
	a, ok := s.(relay.ParkAdmin)
	if !ok {
		return
	}
	if n, err := a.RequeueParked(e.ctx, relay.ParkedSelector{Key: []byte("k")}); err != nil || n != 2 {
		t.Fatalf("RequeueParked(key k) = %d, %v; want 2", n, err)
	}
	e.hold(p, 4, k[0], k[2:], false)
	if got := e.batch(s, 4); !slices.Equal(got, k) {
		t.Fatalf("NextBatch after requeue and a late HoldBehind = %v; want every row %v", got, k)
	}
}

func requeueRestoresOrder(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s, p := e.parker()
	a := e.admin(s)
	k := msgIDs(e.keyed(s, 5, "k", 3))
	e.park(p, 5, k[0], "rejected")
	e.hold(p, 5, k[0], k[1:], true)
	later := msgIDs(e.keyed(s, 5, "other", 2))
	rows, err := a.ListParked(e.ctx, 0)
	if err != nil || len(rows) != 3 || rows[0].ID != k[0] || rows[0].Bucket != 5 || string(rows[0].Key) != "k" || rows[0].Reason != "rejected" ||
		!strings.HasPrefix(rows[1].Reason, relay.HeldReasonPrefix) {
		t.Fatalf("ListParked = %+v, %v; want the 3 parked rows of key k in id order", rows, err)
	}
	if rows, err := a.ListParked(e.ctx, 2); err != nil || len(rows) != 2 {
		t.Fatalf("ListParked(limit 2) = %d rows, %v; want 2", len(rows), err)
	}
	if n, err := a.RequeueParked(e.ctx, relay.ParkedSelector{Key: []byte("k")}); err != nil || n != 3 {
		t.Fatalf("RequeueParked(key k) = %d, %v; want 3", n, err)
	}
	if got, want := e.batch(s, 5), slices.Concat(k, later); !slices.Equal(got, want) {
		t.Fatalf("NextBatch after requeue = %v; want %v (the key's rows first, in id order)", got, want)
	}
	if _, err := a.RequeueParked(e.ctx, relay.ParkedSelector{ID: 1, All: true}); err == nil {
		t.Fatal("RequeueParked(ID and All) succeeded; want a validation error")
	}
}

func deleteParkedOnlyParked(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s, p := e.parker()
	a := e.admin(s)
	k := msgIDs(e.keyed(s, 6, "k", 3))
	e.park(p, 6, k[0], "rejected")
	e.hold(p, 6, k[0], k[1:2], true)
	if n, err := a.DeleteParked(e.ctx, relay.ParkedSelector{ID: k[0]}); err != nil || n != 2 {
		t.Fatalf("DeleteParked(id of the head) = %d, %v; want the key's 2 parked rows", n, err)
	}
	if n, err := a.DeleteParked(e.ctx, relay.ParkedSelector{ID: k[2]}); err != nil || n != 0 {
		t.Fatalf("DeleteParked(id of an unparked row) = %d, %v; want 0", n, err)
	}
	if n, err := a.DeleteParked(e.ctx, relay.ParkedSelector{Key: []byte("k")}); err != nil || n != 0 {
		t.Fatalf("DeleteParked(key with no parked row) = %d, %v; want 0", n, err)
	}
	if n, err := a.DeleteParked(e.ctx, relay.ParkedSelector{All: true}); err != nil || n != 0 {
		t.Fatalf("DeleteParked(all, nothing parked) = %d, %v; want 0", n, err)
	}
	if got := e.batch(s, 6); !slices.Equal(got, k[2:]) {
		t.Fatalf("rows left = %v; want the unparked %v", got, k[2:])
	}
}

func fleetCanPark(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	_, p := e.parker()
	if ok, err := p.FleetCanPark(e.ctx); err != nil || !ok {
		t.Fatalf("FleetCanPark before any relay = %v, %v; want true", ok, err)
	}
	e.converge(2, e.relay("relay-a"), e.relay("relay-b"))
	if ok, err := p.FleetCanPark(e.ctx); err != nil || !ok {
		t.Fatalf("FleetCanPark with two relays of this store = %v, %v; want true", ok, err)
	}
}

func corruptRow(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s, p := e.parker()
	if e.h.InsertCorrupt == nil {
		t.Skip("storetest: Harness.InsertCorrupt is nil")
	}
	good := msgIDs(e.keyed(s, 7, "k", 1))
	if err := e.h.InsertCorrupt(e.ctx, 7); err != nil {
		t.Fatalf("Harness.InsertCorrupt: %v", err)
	}
	m := e.msg(7, start)
	e.insert(m)
	got, err := s.NextBatch(e.ctx, 7, 100)
	if err != nil || !slices.Equal(msgIDs(got), good) {
		t.Fatalf("NextBatch = %v, %v; want only the row before the corrupt one %v, no error", msgIDs(got), err, good)
	}
	if err := s.MarkPublished(e.ctx, 7, got); err != nil {
		t.Fatal(err)
	}
	_, err = s.NextBatch(e.ctx, 7, 100)
	var ce *relay.CorruptRowError
	if !errors.As(err, &ce) || ce.Bucket != 7 || ce.ID <= good[0] {
		t.Fatalf("NextBatch at the corrupt head = %v; want a *relay.CorruptRowError in bucket 7", err)
	}
	e.park(p, 7, ce.ID, relay.CorruptReasonPrefix+ce.Err.Error())
	after, err := s.NextBatch(e.ctx, 7, 100)
	if err != nil || len(after) != 1 || after[0].MessageID != m.MessageID {
		t.Fatalf("NextBatch after parking the corrupt row = %v, %v; want the later row", msgIDs(after), err)
	}
}
