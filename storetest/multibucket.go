package storetest

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// multiScenarios check NextBatches with several requests or buckets, and
// MarkPublished of several buckets.
var multiScenarios = []struct {
	name string
	run  func(t *testing.T, f Factory)
}{
	{"next_batches_answer_each_request_as_it_is_answered_alone", nextBatchesMatchAlone},
	{"next_batches_of_more_buckets_than_one_statement_reads", nextBatchesOfManyBuckets},
	{"a_corrupt_row_in_one_bucket_leaves_the_others_alone", nextBatchesCorruptRow},
	{"next_batches_leave_out_the_rows_being_deleted", nextBatchesExclude},
	{"mark_published_of_several_buckets_deletes_exactly_the_given_rows_never_a_parked_one", markPublishedBuckets},
	{"a_request_of_several_buckets_is_their_batches_merged_in_id_order_and_cut", nextInOrderMatchesAlone},
	{"a_request_of_several_buckets_stops_at_a_corrupt_row_with_its_error", nextInOrderCorruptRow},
	{"a_request_reads_hundreds_of_buckets_with_holes", nextInOrderOfManyBuckets},
}

// multiStore returns a store of e. With park, its relay "relay-a" holds
// every bucket's lease when the store can park; canPark reports whether it
// can.
func (e *env) multiStore(park bool) (s relay.Store, canPark bool) {
	e.t.Helper()
	r := e.relay("relay-a")
	if !park {
		return r.s, false
	}
	f, err := r.s.Fleet(e.ctx)
	if err != nil {
		e.t.Fatalf("Fleet: %v", err)
	}
	if got := e.acquire(r); f.CanPark && len(got) != e.n {
		e.t.Fatalf("AcquireBucketLeases(relay-a) = %v; want all %d buckets", got, e.n)
	}
	return r.s, f.CanPark
}

// rng returns a random source seeded from EnvSeed or the time, logging the
// seed.
func (e *env) rng() *rand.Rand {
	e.t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(EnvSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			e.t.Fatalf("storetest: %s=%q: %v", EnvSeed, v, err)
		}
		seed = s
	}
	e.t.Logf("seed %d (set %s to replay)", seed, EnvSeed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// checkAsAlone fails t unless got answers each of reqs (of one bucket) as
// a call of that request alone answers it now, and as modelled on the
// bucket's whole batch (see expect).
func (e *env) checkAsAlone(s relay.Store, reqs []relay.BatchRequest, got []relay.BatchResult) {
	e.t.Helper()
	if len(got) != len(reqs) {
		e.t.Fatalf("NextBatches(%d requests) = %d results; want %d", len(reqs), len(got), len(reqs))
	}
	for i, r := range reqs {
		alone, aloneErr := e.answer(s, r)
		var ce *relay.CorruptRowError
		if aloneErr != nil && !errors.As(aloneErr, &ce) {
			e.t.Fatalf("NextBatches(%s): %v", fmtReqs(reqs[i:i+1]), aloneErr)
		}
		want, wantErr := e.expect(s, r)
		for _, w := range []relay.BatchResult{{Rows: alone, Err: aloneErr}, {Rows: want, Err: wantErr}} {
			var gotCorrupt, wantCorrupt *relay.CorruptRowError
			if got[i].Err != nil && !errors.As(got[i].Err, &gotCorrupt) {
				e.t.Fatalf("NextBatches result %d (bucket %d) error %v; want nil or a *relay.CorruptRowError", i, r.Buckets[0], got[i].Err)
			}
			errors.As(w.Err, &wantCorrupt)
			if (gotCorrupt == nil) != (wantCorrupt == nil) || gotCorrupt != nil && (gotCorrupt.ID != wantCorrupt.ID || gotCorrupt.Bucket != wantCorrupt.Bucket) || !sameRows(got[i].Rows, w.Rows) {
				e.t.Fatalf("NextBatches result %d (%s) = %v, %v; want %v, %v, as alone and as the bucket's batch cut",
					i, fmtReqs(reqs[i:i+1]), msgIDs(got[i].Rows), got[i].Err, msgIDs(w.Rows), w.Err)
			}
		}
	}
}

// expect returns the answer to r (of one bucket) modelled on the bucket's
// whole batch: without the rows of r.Exclude, then r's limit and byte
// bound; a corrupt row that ends the whole batch ends the answer, with its
// error, when the bounds do not end it first.
func (e *env) expect(s relay.Store, r relay.BatchRequest) (want []*outbox.Message, err error) {
	e.t.Helper()
	all, err := e.next(s, r.Buckets[0], 100000, 0)
	var ce *relay.CorruptRowError
	if err != nil && !errors.As(err, &ce) {
		e.t.Fatalf("NextBatches(%d): %v", r.Buckets[0], err)
	}
	gone := make(map[int64]bool, len(r.Exclude))
	for _, m := range r.Exclude {
		gone[m.ID] = true
	}
	var total int64
	for _, m := range all {
		if len(want) >= r.Limit || r.MaxBytes > 0 && total > r.MaxBytes {
			return want, nil
		}
		if !gone[m.ID] {
			want = append(want, m)
			total += relay.MessageSize(m)
		}
	}
	if len(want) >= r.Limit || r.MaxBytes > 0 && total > r.MaxBytes {
		return want, nil
	}
	return want, err
}

// sameRows reports whether a and b hold the same messages, in order.
func sameRows(a, b []*outbox.Message) bool {
	return slices.EqualFunc(a, b, func(x, y *outbox.Message) bool {
		return x.ID == y.ID && x.MessageID == y.MessageID && x.Bucket == y.Bucket && x.Topic == y.Topic &&
			bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value) && (x.Value == nil) == (y.Value == nil)
	})
}

func fmtReqs(reqs []relay.BatchRequest) string {
	var b strings.Builder
	for _, r := range reqs {
		buckets := fmt.Sprint(r.Buckets)
		if n := len(r.Buckets); n > 20 {
			buckets = fmt.Sprintf("%d buckets %d..%d", n, r.Buckets[0], r.Buckets[n-1])
		}
		fmt.Fprintf(&b, " %s/%d/%d", buckets, r.Limit, r.MaxBytes)
		if len(r.Exclude) > 0 {
			fmt.Fprintf(&b, "-%v", msgIDs(r.Exclude))
		}
	}
	return b.String()
}

// nextBatchesMatchAlone: over rounds of random requests of one bucket each
// (buckets in any order, empty ones included; limits from 0; byte bounds or
// none; rows left out, the head's or any of the bucket's, or none), on rows
// of a few keys and values of random sizes, some parked (rejected, corrupt,
// held) when the store can park, and a corrupt row when the harness can
// write one, NextBatches answers each request as it answers it alone; each
// round then deletes a random prefix of each batch (MarkPublished).
func nextBatchesMatchAlone(t *testing.T, f Factory) {
	const n = 12
	e := newEnv(t, f, n)
	s, canPark := e.multiStore(true)
	rng := e.rng()
	keys := []string{"a", "b", "c", ""}
	row := func() *outbox.Message {
		m := e.msg(rng.IntN(n-1), start) // bucket n-1 stays empty
		if k := keys[rng.IntN(len(keys))]; k != "" {
			m.Key = []byte(k)
		} else {
			m.Key = nil
		}
		m.Value = bytes.Repeat([]byte{'v'}, 1+rng.IntN(200))
		return m
	}
	var rows []*outbox.Message
	for range 80 {
		rows = append(rows, row())
	}
	e.insert(rows...)
	if e.h.InsertCorrupt != nil {
		if err := e.h.InsertCorrupt(e.ctx, rng.IntN(n-1)); err != nil {
			t.Fatalf("Harness.InsertCorrupt: %v", err)
		}
	}
	rows = rows[:0]
	for range 80 {
		rows = append(rows, row())
	}
	e.insert(rows...)
	if canPark {
		e.parkSome(s, rng, n, e.batchBeforeCorrupt)
	}
	for round := range 16 {
		buckets := rng.Perm(n)[:1+rng.IntN(n)]
		reqs := make([]relay.BatchRequest, len(buckets))
		for i, b := range buckets {
			reqs[i] = relay.BatchRequest{Buckets: []int{b}, Limit: rng.IntN(8)}
			if rng.IntN(4) == 0 {
				reqs[i].Limit = 100
			}
			if rng.IntN(2) == 0 {
				reqs[i].MaxBytes = 1 + rng.Int64N(600)
			}
			if rng.IntN(2) == 0 { // a batch being deleted: a prefix, or any of the rows
				prev, _ := e.next(s, b, 1+rng.IntN(6), 0)
				if rng.IntN(3) == 0 {
					prev = slices.DeleteFunc(prev, func(*outbox.Message) bool { return rng.IntN(2) == 0 })
				}
				reqs[i].Exclude = prev
			}
		}
		got, err := s.NextBatches(e.ctx, reqs)
		if err != nil {
			t.Fatalf("round %d: NextBatches(%s): %v", round, fmtReqs(reqs), err)
		}
		e.checkAsAlone(s, reqs, got)
		var done []*outbox.Message
		for i, r := range got {
			var ce *relay.CorruptRowError
			if errors.As(r.Err, &ce) && canPark && len(r.Rows) == 0 {
				e.park(s, reqs[i].Buckets[0], ce.ID, relay.CorruptReasonPrefix+ce.Err.Error())
			}
			done = append(done, r.Rows[:rng.IntN(len(r.Rows)+1)]...)
		}
		if err := s.MarkPublished(e.ctx, done); err != nil {
			t.Fatalf("round %d: MarkPublished(%v): %v", round, msgIDs(done), err)
		}
	}
}

// batchBeforeCorrupt returns the ids of bucket's batch: the rows before a
// corrupt one, none at a corrupt head.
func (e *env) batchBeforeCorrupt(s relay.Store, bucket int) []int64 {
	e.t.Helper()
	got, err := e.next(s, bucket, 10000, 0)
	var ce *relay.CorruptRowError
	if err != nil && !errors.As(err, &ce) {
		e.t.Fatalf("NextBatches(%d): %v", bucket, err)
	}
	return msgIDs(got)
}

// nextBatchesOfManyBuckets: one call for 600 buckets, more than a store
// reads in one statement, answers each as it is answered alone.
func nextBatchesOfManyBuckets(t *testing.T, f Factory) {
	const n = 600
	e := newEnv(t, f, n)
	s, _ := e.multiStore(false)
	var rows []*outbox.Message
	for b := range n {
		for range 1 + b%3 {
			rows = append(rows, e.msg(b, start))
		}
	}
	for c := range slices.Chunk(rows, 100) {
		e.insert(c...)
	}
	reqs := make([]relay.BatchRequest, 0, n)
	for b := n - 1; b >= 0; b-- {
		reqs = append(reqs, relay.BatchRequest{Buckets: []int{b}, Limit: 1 + b%2})
	}
	got, err := s.NextBatches(e.ctx, reqs)
	if err != nil {
		t.Fatalf("NextBatches(%d buckets): %v", n, err)
	}
	e.checkAsAlone(s, reqs, got)
	for i, r := range got {
		if b := reqs[i].Buckets[0]; len(r.Rows) != min(1+b%2, 1+b%3) {
			t.Fatalf("NextBatches result %d (bucket %d) = %d rows; want %d", i, b, len(r.Rows), min(1+b%2, 1+b%3))
		}
	}
}

// nextBatchesCorruptRow: a corrupt head row in one bucket is that
// bucket's *relay.CorruptRowError, with no rows; a corrupt row behind good
// ones in another bucket ends its batch with its error; the other buckets'
// batches are whole.
func nextBatchesCorruptRow(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	if e.h.InsertCorrupt == nil {
		t.Skip("storetest: Harness.InsertCorrupt is nil")
	}
	s, _ := e.multiStore(false)
	one := []*outbox.Message{e.msg(1, start), e.msg(1, start)}
	three := e.msg(3, start)
	e.insert(one[0], three, one[1])
	for _, b := range []int{2, 3} {
		if err := e.h.InsertCorrupt(e.ctx, b); err != nil {
			t.Fatalf("Harness.InsertCorrupt(%d): %v", b, err)
		}
	}
	e.insert(e.msg(2, start), e.msg(3, start), e.msg(1, start))
	reqs := []relay.BatchRequest{{Buckets: []int{3}, Limit: 10}, {Buckets: []int{2}, Limit: 10}, {Buckets: []int{1}, Limit: 10}, {Buckets: []int{4}, Limit: 10}}
	got, err := s.NextBatches(e.ctx, reqs)
	if err != nil {
		t.Fatalf("NextBatches: %v", err)
	}
	e.checkAsAlone(s, reqs, got)
	var ce *relay.CorruptRowError
	if !errors.As(got[1].Err, &ce) || ce.Bucket != 2 || len(got[1].Rows) != 0 {
		t.Fatalf("NextBatches bucket 2 = %v, %v; want a *relay.CorruptRowError in bucket 2, no rows", msgIDs(got[1].Rows), got[1].Err)
	}
	if r := got[0]; !errors.As(r.Err, &ce) || ce.Bucket != 3 || len(r.Rows) != 1 || r.Rows[0].MessageID != three.MessageID {
		t.Fatalf("NextBatches bucket 3 = %v, %v; want the row before the corrupt one, with its *relay.CorruptRowError", msgIDs(r.Rows), r.Err)
	}
	if r := got[2]; r.Err != nil || len(r.Rows) != 3 {
		t.Fatalf("NextBatches bucket 1 = %v, %v; want its 3 rows", msgIDs(r.Rows), r.Err)
	}
	if r := got[3]; r.Err != nil || len(r.Rows) != 0 {
		t.Fatalf("NextBatches empty bucket 4 = %v, %v; want nothing", msgIDs(r.Rows), r.Err)
	}
}

// markPublishedBuckets: one MarkPublished deleting 2,100 rows' worth of prefixes
// over four buckets (in no particular order) deletes exactly those rows;
// a row parked after it was read, when the store can park, is not deleted.
func markPublishedBuckets(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s, canPark := e.multiStore(true)
	var rows []*outbox.Message
	for i := range 2100 {
		rows = append(rows, e.msg(1+i%4, start))
	}
	for c := range slices.Chunk(rows, 100) {
		e.insert(c...)
	}
	batch := map[int][]*outbox.Message{}
	for b := 1; b <= 4; b++ {
		got, err := e.next(s, b, 10000, 0)
		if err != nil || len(got) != 525 {
			t.Fatalf("NextBatches(%d) = %d rows, %v; want 525", b, len(got), err)
		}
		batch[b] = got
	}
	var parked int64
	if canPark {
		parked = batch[2][1].ID
		e.park(s, 2, parked, "rejected")
	}
	done := slices.Concat(batch[3], batch[1][:300], batch[2][:400])
	done = append(done, batch[4][:200]...)
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(done), func(i, j int) { done[i], done[j] = done[j], done[i] })
	for range 2 { // the second call finds the rows gone
		if err := s.MarkPublished(e.ctx, done); err != nil {
			t.Fatalf("MarkPublished(%d rows): %v", len(done), err)
		}
	}
	for b, want := range map[int][]int64{1: msgIDs(batch[1][300:]), 2: msgIDs(batch[2][400:]), 3: {}, 4: msgIDs(batch[4][200:])} {
		if got := e.batch(s, b); !slices.Equal(got, want) {
			t.Fatalf("bucket %d after MarkPublished = %d rows %v; want %d rows %v", b, len(got), got, len(want), want)
		}
	}
	if !canPark {
		return
	}
	adm, ok := s.(relay.ParkAdmin)
	if !ok {
		return
	}
	if n, err := adm.RequeueParked(e.ctx, relay.ParkedSelector{ID: parked}); err != nil || n != 1 {
		t.Fatalf("RequeueParked(ID %d) = %d, %v; want 1 (MarkPublished must not delete a parked row)", parked, n, err)
	}
	if got := e.batch(s, 2); len(got) == 0 || got[0] != parked {
		t.Fatalf("bucket 2 after the requeue = %v; want the parked row %d first", got, parked)
	}
}

// nextBatchesExclude: a relay fetching a bucket's next batch while the
// previous one is deleted asks for it to be left out: the answer starts
// after it, its limit and byte bound counting only the rows returned, alone
// (one request) or in a group; a row before them that is not listed (one
// committed late) is returned.
func nextBatchesExclude(t *testing.T, f Factory) {
	e := newEnv(t, f, 4)
	s, _ := e.multiStore(false)
	var one, two []*outbox.Message
	for range 8 {
		one, two = append(one, e.msg(1, start)), append(two, e.msg(2, start))
	}
	e.insert(one...)
	e.insert(two...)
	var err error
	one, err = e.next(s, 1, 100, 0)
	if err != nil || len(one) != 8 {
		t.Fatalf("NextBatches(1) = %v, %v; want 8 rows", msgIDs(one), err)
	}
	two, err = e.next(s, 2, 100, 0)
	if err != nil || len(two) != 8 {
		t.Fatalf("NextBatches(2) = %v, %v; want 8 rows", msgIDs(two), err)
	}
	prev1, prev2 := one[:5], two[:3]
	alone := []relay.BatchRequest{{Buckets: []int{1}, Limit: 2, Exclude: prev1}}
	got, err := s.NextBatches(e.ctx, alone)
	if err != nil {
		t.Fatalf("NextBatches(%s): %v", fmtReqs(alone), err)
	}
	if ids, want := msgIDs(got[0].Rows), msgIDs(one[5:7]); !slices.Equal(ids, want) || got[0].Err != nil {
		t.Fatalf("NextBatches(%s) = %v, %v; want %v: the two rows after those left out", fmtReqs(alone), ids, got[0].Err, want)
	}
	group := []relay.BatchRequest{{Buckets: []int{2}, Limit: 100, Exclude: prev2[1:]}, {Buckets: []int{1}, Limit: 100, MaxBytes: 1, Exclude: prev1}, {Buckets: []int{3}, Limit: 5}}
	got, err = s.NextBatches(e.ctx, group)
	if err != nil {
		t.Fatalf("NextBatches(%s): %v", fmtReqs(group), err)
	}
	e.checkAsAlone(s, group, got)
	if ids, want := msgIDs(got[0].Rows), msgIDs(append([]*outbox.Message{two[0]}, two[3:]...)); !slices.Equal(ids, want) {
		t.Fatalf("NextBatches bucket 2 = %v; want %v: all but the rows left out", ids, want)
	}
	if ids, want := msgIDs(got[1].Rows), msgIDs(one[5:6]); !slices.Equal(ids, want) {
		t.Fatalf("NextBatches bucket 1 (1 byte) = %v; want %v: the first row after those left out, its size counted alone", ids, want)
	}
}

// expectInOrder returns the answer to req, of several buckets, as requests
// of one bucket model it: each requested bucket's batch (a large limit,
// without the rows of req.Exclude of that bucket), merged in id order, cut
// at req.Limit and after the row crossing req.MaxBytes. The rows must hold
// no corrupt row.
func (e *env) expectInOrder(s relay.Store, req relay.BatchRequest) []*outbox.Message {
	e.t.Helper()
	excl := map[int][]*outbox.Message{}
	for _, m := range req.Exclude {
		excl[int(m.Bucket)] = append(excl[int(m.Bucket)], m)
	}
	reqs := make([]relay.BatchRequest, len(req.Buckets))
	for i, b := range req.Buckets {
		reqs[i] = relay.BatchRequest{Buckets: []int{b}, Limit: 100000, Exclude: excl[b]}
	}
	res, err := s.NextBatches(e.ctx, reqs)
	if err != nil {
		e.t.Fatalf("NextBatches(%d buckets): %v", len(reqs), err)
	}
	var all []*outbox.Message
	for i, r := range res {
		if r.Err != nil {
			e.t.Fatalf("NextBatches bucket %d: %v", reqs[i].Buckets[0], r.Err)
		}
		all = append(all, r.Rows...)
	}
	slices.SortFunc(all, func(a, b *outbox.Message) int { return cmp.Compare(a.ID, b.ID) })
	var want []*outbox.Message
	var total int64
	for _, m := range all {
		if len(want) >= req.Limit || req.MaxBytes > 0 && total > req.MaxBytes {
			break
		}
		want = append(want, m)
		total += relay.MessageSize(m)
	}
	return want
}

// checkInOrder fails t unless got, the answer to req, is expectInOrder's:
// ids ascending, rows of req.Buckets only.
func (e *env) checkInOrder(s relay.Store, req relay.BatchRequest, got []*outbox.Message, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("NextBatches(%s): %v", fmtReqs([]relay.BatchRequest{req}), err)
	}
	want := e.expectInOrder(s, req)
	if !sameRows(got, want) {
		e.t.Fatalf("NextBatches(%s) = %v; want %v: each bucket's batch merged in id order, cut", fmtReqs([]relay.BatchRequest{req}), msgIDs(got), msgIDs(want))
	}
	for i, m := range got {
		if i > 0 && m.ID <= got[i-1].ID {
			e.t.Fatalf("NextBatches(%s) = %v: row %d after row %d", fmtReqs([]relay.BatchRequest{req}), msgIDs(got), m.ID, got[i-1].ID)
		}
		if _, ok := slices.BinarySearch(req.Buckets, int(m.Bucket)); !ok {
			e.t.Fatalf("NextBatches(%s) returned row %d of bucket %d, not asked for", fmtReqs([]relay.BatchRequest{req}), m.ID, m.Bucket)
		}
	}
}

// nextInOrderMatchesAlone: over rounds of random requests of several
// buckets (a random subset of 12, empty ones included; limits from 1; byte
// bounds or none; rows left out, of requested buckets and others, or
// none), on rows of a few keys and values of random sizes, some parked
// (rejected, corrupt, held) when the store can park, the answer is each
// requested bucket's batch (without the rows left out) merged in id order
// and cut at the limit and the byte bound; each round then deletes a
// random prefix of the answer (MarkPublished), as the relay does.
func nextInOrderMatchesAlone(t *testing.T, f Factory) {
	const n = 12
	e := newEnv(t, f, n)
	s, canPark := e.multiStore(true)
	rng := e.rng()
	keys := []string{"a", "b", "c", ""}
	var rows []*outbox.Message
	for range 160 {
		m := e.msg(rng.IntN(n-1), start) // bucket n-1 stays empty
		if k := keys[rng.IntN(len(keys))]; k != "" {
			m.Key = []byte(k)
		} else {
			m.Key = nil
		}
		m.Value = bytes.Repeat([]byte{'v'}, 1+rng.IntN(200))
		rows = append(rows, m)
	}
	for c := range slices.Chunk(rows, 40) {
		e.insert(c...)
	}
	if canPark {
		e.parkSome(s, rng, n, e.batch)
	}
	for round := range 20 {
		var req relay.BatchRequest
		for b := range n {
			if rng.IntN(3) != 0 {
				req.Buckets = append(req.Buckets, b)
			}
		}
		if len(req.Buckets) == 0 {
			req.Buckets = []int{rng.IntN(n)}
		}
		req.Limit = 1 + rng.IntN(30)
		if rng.IntN(4) == 0 {
			req.Limit = 1000
		}
		if rng.IntN(2) == 0 {
			req.MaxBytes = 1 + rng.Int64N(3000)
		}
		if rng.IntN(2) == 0 { // batches being deleted: heads, or any of their rows
			for b := range n {
				if rng.IntN(3) != 0 {
					continue
				}
				prev, _ := e.next(s, b, 1+rng.IntN(6), 0)
				if rng.IntN(3) == 0 {
					prev = slices.DeleteFunc(prev, func(*outbox.Message) bool { return rng.IntN(2) == 0 })
				}
				req.Exclude = append(req.Exclude, prev...)
			}
		}
		got, err := e.answer(s, req)
		e.checkInOrder(s, req, got, err)
		if done := got[:rng.IntN(len(got)+1)]; len(done) > 0 {
			if err := s.MarkPublished(e.ctx, done); err != nil {
				t.Fatalf("round %d: MarkPublished(%v): %v", round, msgIDs(done), err)
			}
		}
	}
	if got, err := e.answer(s, relay.BatchRequest{Buckets: all(n), Limit: 0}); err != nil || len(got) != 0 {
		t.Fatalf("NextBatches(limit 0) = %v, %v; want nothing", msgIDs(got), err)
	}
}

// nextInOrderCorruptRow: rows of three buckets in turn, a row that cannot
// be decoded in bucket 2 behind one of its rows, then more rows of the
// three: a request of the three returns the rows before the corrupt one,
// in id order, with a *relay.CorruptRowError naming it (bucket 2, its id
// between theirs and the later rows'); with a limit that ends before it,
// the rows and no error; with the rows before it left out, the error alone;
// without bucket 2, every row of the other two.
func nextInOrderCorruptRow(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	if e.h.InsertCorrupt == nil {
		t.Skip("storetest: Harness.InsertCorrupt is nil")
	}
	s, _ := e.multiStore(false)
	e.insert(e.msg(1, start), e.msg(2, start), e.msg(3, start), e.msg(1, start))
	if err := e.h.InsertCorrupt(e.ctx, 2); err != nil {
		t.Fatalf("Harness.InsertCorrupt(2): %v", err)
	}
	e.insert(e.msg(3, start), e.msg(2, start), e.msg(1, start))
	others, err := e.answer(s, relay.BatchRequest{Buckets: []int{1, 3}, Limit: 100})
	if err != nil || len(others) != 5 {
		t.Fatalf("NextBatches(buckets 1, 3) = %v, %v; want their 5 rows", msgIDs(others), err)
	}
	req := relay.BatchRequest{Buckets: []int{1, 2, 3}, Limit: 100}
	got, err := e.answer(s, req)
	var ce *relay.CorruptRowError
	if !errors.As(err, &ce) {
		t.Fatalf("NextBatches(%s) = %v, %v; want the 4 rows before the corrupt one with a *relay.CorruptRowError", fmtReqs([]relay.BatchRequest{req}), msgIDs(got), err)
	}
	if len(got) != 4 || got[1].Bucket != 2 || !slices.IsSorted(msgIDs(got)) {
		t.Fatalf("NextBatches(%s) = %v (error %v); want the 4 rows before the corrupt one, in id order", fmtReqs([]relay.BatchRequest{req}), msgIDs(got), err)
	}
	if ce.Bucket != 2 || ce.ID <= got[3].ID || ce.ID >= others[3].ID {
		t.Fatalf("NextBatches(%s) error names row %d of bucket %d; want the corrupt row of bucket 2, after row %d and before row %d",
			fmtReqs([]relay.BatchRequest{req}), ce.ID, ce.Bucket, got[3].ID, others[3].ID)
	}
	req.Limit = 4
	if short, err := e.answer(s, req); err != nil || !slices.Equal(msgIDs(short), msgIDs(got)) {
		t.Fatalf("NextBatches(%s) = %v, %v; want %v and no error: the limit ends it before the corrupt row", fmtReqs([]relay.BatchRequest{req}), msgIDs(short), err, msgIDs(got))
	}
	req = relay.BatchRequest{Buckets: []int{1, 2, 3}, Limit: 100, Exclude: got}
	head, err := e.answer(s, req)
	var again *relay.CorruptRowError
	if !errors.As(err, &again) || again.ID != ce.ID || len(head) != 0 {
		t.Fatalf("NextBatches(%s) = %v, %v; want only the *relay.CorruptRowError of row %d", fmtReqs([]relay.BatchRequest{req}), msgIDs(head), err, ce.ID)
	}
}

// nextInOrderOfManyBuckets: with one or two rows in each of 300 buckets,
// inserted in a random order, one request of the buckets less
// some holes (every seventh, a run of twenty), for a few of them (more
// holes than buckets) and for all, returns the rows of exactly those
// buckets in id order, whole or cut at a limit.
func nextInOrderOfManyBuckets(t *testing.T, f Factory) {
	const n = 300
	e := newEnv(t, f, n)
	s, _ := e.multiStore(false)
	var rows []*outbox.Message
	for b := range n {
		for range 1 + b%2 {
			rows = append(rows, e.msg(b, start))
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	for c := range slices.Chunk(rows, 100) {
		e.insert(c...)
	}
	var holed, sparse []int
	for b := range n {
		if b%7 != 3 && (b < 100 || b >= 120) {
			holed = append(holed, b)
		}
		if b%25 == 4 {
			sparse = append(sparse, b)
		}
	}
	for _, req := range []relay.BatchRequest{
		{Buckets: holed, Limit: 1000},
		{Buckets: holed, Limit: 50},
		{Buckets: holed[10:200], Limit: 1000, MaxBytes: 2000},
		{Buckets: sparse, Limit: 1000},
		{Buckets: all(n), Limit: 1000},
	} {
		got, err := e.answer(s, req)
		e.checkInOrder(s, req, got, err)
		if req.Limit == 1000 && req.MaxBytes == 0 {
			var want int
			for _, b := range req.Buckets {
				want += 1 + b%2
			}
			if len(got) != want {
				t.Fatalf("NextBatches(%s) = %d rows; want all %d of its buckets", fmtReqs([]relay.BatchRequest{req}), len(got), want)
			}
		}
	}
}

// parkSome parks about one in six of the rows rows(s, b) lists in each of
// buckets 0..n-1, each with a reason drawn from a plain one, a corrupt
// row's and a held row's.
func (e *env) parkSome(s relay.Store, rng *rand.Rand, n int, rows func(relay.Store, int) []int64) {
	e.t.Helper()
	reasons := []string{"rejected", relay.CorruptReasonPrefix + "bad headers", relay.HeldReasonPrefix + "1"}
	for b := range n {
		for _, id := range rows(s, b) {
			if rng.IntN(6) == 0 {
				e.park(s, b, id, reasons[rng.IntN(len(reasons))])
			}
		}
	}
}
