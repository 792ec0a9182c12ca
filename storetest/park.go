package storetest

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// parkScenarios run only for a store that can park (Fleet reporting CanPark with
// no other relay alive) and, for the admin ones, implements
// relay.ParkAdmin.
var parkScenarios = []scenario{
	{"a_parked_row_is_skipped_counted_apart_and_holds_the_later_rows_of_its_key_in_its_bucket", parkedRowHolds},
	{"requeueing_a_corrupt_row_of_a_parked_key_releases_nothing_behind_its_head", requeueCorruptReleasesNothing},
	{"park_without_the_lease_changes_nothing", parkNeedsTheLease},
	{"selectors_change_exactly_the_rows_choose_previews", selectorsMatchChoose},
	{"requeue_by_key_restores_the_rows_in_id_order_and_delete_parked_never_deletes_an_unparked_row", requeueRestoresOrder},
}

// parker returns a store of e that can park, whose relay "relay-a" holds
// every bucket's lease, or skips t.
func (e *env) parker() relay.Store {
	e.t.Helper()
	s, ok := e.parkingStore()
	if !ok {
		e.t.Skip("storetest: the store cannot park (Fleet reports CanPark false with no relay alive)")
	}
	return s
}

func (e *env) admin(s relay.Store) relay.ParkAdmin {
	e.t.Helper()
	a, ok := s.(relay.ParkAdmin)
	if !ok {
		e.t.Skip("storetest: the store does not implement relay.ParkAdmin")
	}
	return a
}

// keyed inserts n messages of key in bucket and returns them as NextBatches
// reads them back (with their ids).
func (e *env) keyed(s relay.Store, bucket int, key string, n int) []*outbox.Message {
	e.t.Helper()
	before, err := e.next(s, bucket, 10000, 0)
	if err != nil {
		e.t.Fatalf("NextBatches(%d): %v", bucket, err)
	}
	for range n {
		m := e.msg(bucket, start)
		m.Key = []byte(key)
		e.insert(m)
	}
	after, err := e.next(s, bucket, 10000, 0)
	if err != nil || len(after) != len(before)+n {
		e.t.Fatalf("NextBatches(%d) after inserting %d rows = %d rows, %v; want %d", bucket, n, len(after), err, len(before)+n)
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
	got, err := e.next(s, bucket, 10000, 0)
	if err != nil {
		e.t.Fatalf("NextBatches(%d): %v", bucket, err)
	}
	return msgIDs(got)
}

// park parks row id of bucket on behalf of relay-a (see parker).
func (e *env) park(s relay.Store, bucket int, id int64, reason string) {
	e.t.Helper()
	if err := s.Park(e.ctx, "relay-a", bucket, id, reason); err != nil {
		e.t.Fatalf("Park(relay-a, %d, %d): %v", bucket, id, err)
	}
}

// parkedRowHolds: a parked row is skipped by NextBatches and
// BucketsWithPending and counted apart in PendingMetrics; it holds its key's
// later rows in its bucket (not the earlier ones, not other buckets' rows of
// the key); a corrupt parked row holds nothing; a row an earlier release
// parked as held (relay.HeldReasonPrefix) holds like any parked row.
func parkedRowHolds(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s := e.parker()
	a := msgIDs(e.keyed(s, 1, "a", 3))
	c := msgIDs(e.keyed(s, 1, "c", 2))
	only := msgIDs(e.keyed(s, 2, "c", 1))
	elsewhere := msgIDs(e.keyed(s, 3, "a", 1))
	h := msgIDs(e.keyed(s, 4, "h", 2))
	e.park(s, 1, a[1], "rejected")
	e.park(s, 1, c[0], relay.CorruptReasonPrefix+"bad headers")
	e.park(s, 2, only[0], "rejected")
	e.park(s, 4, h[0], relay.HeldReasonPrefix+"1")
	if got, err := s.BucketsWithPending(e.ctx, all(4)); err != nil || !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("BucketsWithPending(0..3) = %v, %v; want [1 3] (bucket 2 holds only a parked row)", got, err)
	}
	if got, err := s.PendingMetrics(e.ctx); err != nil || got != nil && (got.Count != 5 || got.Parked != 4) {
		t.Fatalf("PendingMetrics = %+v, %v; want Count 5 (the waiting rows are pending), Parked 4", got, err)
	}
	if got, want := e.batch(s, 1), []int64{a[0], c[1]}; !slices.Equal(got, want) {
		t.Fatalf("NextBatches(1) = %v; want %v (a's row before its parked row, and c's row behind a corrupt one)", got, want)
	}
	if got := e.batch(s, 3); !slices.Equal(got, elsewhere) {
		t.Fatalf("NextBatches(3) = %v; want %v (a parked row holds only its bucket's rows)", got, elsewhere)
	}
	if got := e.batch(s, 4); len(got) != 0 {
		t.Fatalf("NextBatches(4) = %v; want nothing (a row parked as held holds its key)", got)
	}
	adm, ok := s.(relay.ParkAdmin)
	if !ok {
		return
	}
	if n, err := adm.RequeueParked(e.ctx, relay.ParkedSelector{ID: a[1]}); err != nil || n != 1 {
		t.Fatalf("RequeueParked(ID %d) = %d, %v; want 1", a[1], n, err)
	}
	if got, want := e.batch(s, 1), []int64{a[0], a[1], a[2], c[1]}; !slices.Equal(got, want) {
		t.Fatalf("NextBatches(1) after the requeue = %v; want %v", got, want)
	}
}

// requeueCorruptReleasesNothing: key k's corrupt row, parked alone, is
// requeued by id (after a repair) while k's head is parked: the requeued
// row flows, k's rows behind the head keep waiting.
func requeueCorruptReleasesNothing(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s := e.parker()
	adm := e.admin(s)
	k := msgIDs(e.keyed(s, 2, "k", 3))
	e.park(s, 2, k[0], relay.CorruptReasonPrefix+"bad headers")
	e.park(s, 2, k[1], "rejected")
	if n, err := adm.RequeueParked(e.ctx, relay.ParkedSelector{ID: k[0]}); err != nil || n != 1 {
		t.Fatalf("RequeueParked(ID %d, corrupt) = %d, %v; want 1 (the corrupt row alone)", k[0], n, err)
	}
	later := e.msg(2, start)
	later.Key = []byte("k")
	e.insert(later)
	if got := e.batch(s, 2); !slices.Equal(got, k[:1]) {
		t.Fatalf("NextBatches(2) = %v; want only the requeued row %v (%v and the later row wait behind the parked head %d)", got, k[:1], k[2], k[1])
	}
}

// parkNeedsTheLease: Park by a relay whose lease expired (on the store's
// clock), or that a peer took over, changes nothing and reports
// relay.ErrLeaseLost.
func parkNeedsTheLease(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s := e.parker()
	k := msgIDs(e.keyed(s, 3, "k", 2))
	e.clock.Advance(LeaseDuration + time.Second)
	if err := s.Park(e.ctx, "relay-a", 3, k[0], "rejected"); !errors.Is(err, relay.ErrLeaseLost) {
		t.Fatalf("Park with an expired lease = %v; want an error wrapping relay.ErrLeaseLost", err)
	}
	b := e.relay("relay-b")
	if got := e.acquire(b); !slices.Contains(got, 3) {
		t.Fatalf("relay-b acquired %v; want bucket 3", got)
	}
	if err := s.Park(e.ctx, "relay-a", 3, k[0], "rejected"); !errors.Is(err, relay.ErrLeaseLost) {
		t.Fatalf("Park after a peer took the bucket = %v; want an error wrapping relay.ErrLeaseLost", err)
	}
	if got := e.batch(s, 3); !slices.Equal(got, k) {
		t.Fatalf("NextBatches(3) = %v; want every row %v (nothing parked)", got, k)
	}
	if err := s.Park(e.ctx, "relay-b", 3, k[0], "rejected"); err != nil {
		t.Fatalf("Park by the new owner: %v", err)
	}
}

// selectorsMatchChoose: each selection requeues or deletes exactly the rows
// relay.ParkedSelector.Choose picks from ListParked (what a preview shows).
func selectorsMatchChoose(t *testing.T, f Factory) {
	for _, del := range []bool{false, true} {
		t.Run(map[bool]string{false: "requeue", true: "delete"}[del], func(t *testing.T) {
			e := newEnv(t, f, 8)
			s := e.parker()
			adm := e.admin(s)
			k := msgIDs(e.keyed(s, 5, "k", 4))
			other := msgIDs(e.keyed(s, 6, "k", 1))
			keyless := e.msg(5, start)
			keyless.Key = nil
			e.insert(keyless)
			got, err := e.next(s, 5, 100, 0)
			if err != nil || len(got) != 5 {
				t.Fatalf("NextBatches(5) = %d rows, %v; want 5", len(got), err)
			}
			nokey := got[4].ID
			e.park(s, 5, k[0], relay.CorruptReasonPrefix+"bad headers")
			e.park(s, 5, k[1], "rejected")
			e.park(s, 5, k[2], relay.HeldReasonPrefix+strconv.FormatInt(k[1], 10))
			e.park(s, 5, nokey, "rejected")
			e.park(s, 6, other[0], "rejected")
			for _, sel := range []relay.ParkedSelector{{ID: k[2]}, {ID: k[0]}, {ID: nokey}, {Key: []byte("k")}, {All: true}} {
				e.park(s, 5, nokey, "rejected") // again after the All of the requeue run
				before, err := adm.ListParked(e.ctx, 0)
				if err != nil {
					t.Fatal(err)
				}
				want := sel.Choose(before)
				var n int64
				if del {
					n, err = adm.DeleteParked(e.ctx, sel)
				} else {
					n, err = adm.RequeueParked(e.ctx, sel)
				}
				if err != nil || n != int64(len(want)) {
					t.Fatalf("%+v: changed %d rows, %v; want the %d rows Choose previews: %v", sel, n, err, len(want), parkedIDs(want))
				}
				after, err := adm.ListParked(e.ctx, 0)
				if err != nil {
					t.Fatal(err)
				}
				if left, wantLeft := parkedIDs(after), slices.DeleteFunc(parkedIDs(before), func(id int64) bool { return slices.Contains(parkedIDs(want), id) }); !slices.Equal(left, wantLeft) {
					t.Fatalf("%+v: parked after = %v; want %v", sel, left, wantLeft)
				}
			}
		})
	}
}

func parkedIDs(rows []relay.ParkedRow) []int64 {
	out := []int64{}
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}

// requeueRestoresOrder: ListParked lists a key's parked rows in id order,
// RequeueParked by key restores them ahead of later rows, and DeleteParked
// deletes a key's parked rows, never an unparked one.
func requeueRestoresOrder(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s := e.parker()
	a := e.admin(s)
	k := msgIDs(e.keyed(s, 5, "k", 3))
	e.park(s, 5, k[0], "rejected")
	e.park(s, 5, k[1], "rejected")
	later := msgIDs(e.keyed(s, 5, "other", 2))
	rows, err := a.ListParked(e.ctx, 0)
	if err != nil || len(rows) != 2 || rows[0].ID != k[0] || rows[0].Bucket != 5 || string(rows[0].Key) != "k" || rows[0].Reason != "rejected" {
		t.Fatalf("ListParked = %+v, %v; want the 2 parked rows of key k in id order", rows, err)
	}
	if rows, err := a.ListParked(e.ctx, 1); err != nil || len(rows) != 1 {
		t.Fatalf("ListParked(limit 1) = %d rows, %v; want 1", len(rows), err)
	}
	if n, err := a.RequeueParked(e.ctx, relay.ParkedSelector{Key: []byte("k")}); err != nil || n != 2 {
		t.Fatalf("RequeueParked(key k) = %d, %v; want 2", n, err)
	}
	if got, want := e.batch(s, 5), slices.Concat(k, later); !slices.Equal(got, want) {
		t.Fatalf("NextBatches after requeue = %v; want %v (the key's rows first, in id order)", got, want)
	}
	if _, err := a.RequeueParked(e.ctx, relay.ParkedSelector{ID: 1, All: true}); err == nil {
		t.Fatal("RequeueParked(ID and All) succeeded; want a validation error")
	}

	k = msgIDs(e.keyed(s, 6, "k", 3))
	e.park(s, 6, k[0], "rejected")
	e.park(s, 6, k[1], "rejected")
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
