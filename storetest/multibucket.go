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
// MarkPublished.
var multiScenarios = []scenario{
	{"next_batches_answer_random_requests_of_one_or_several_buckets", nextBatchesRandom},
	{"next_batches_of_more_buckets_than_one_statement_reads", nextBatchesOfManyBuckets},
	{"a_corrupt_row_ends_the_batch_with_its_error", nextBatchesCorruptRow},
	{"next_batches_leave_out_the_rows_being_deleted", nextBatchesExclude},
	{"mark_published_deletes_exactly_the_given_rows_never_a_parked_one", markPublished},
}

// parkingStore returns the store of relay "relay-a", which holds every
// bucket's lease when the store can park, and whether it can.
func (e *env) parkingStore() (relay.Store, bool) {
	e.t.Helper()
	r := e.relay("relay-a")
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

// corrupt returns err as a *relay.CorruptRowError, nil for nil, and fails
// t on any other error.
func (e *env) corrupt(err error, what string) *relay.CorruptRowError {
	e.t.Helper()
	var ce *relay.CorruptRowError
	if err != nil && !errors.As(err, &ce) {
		e.t.Fatalf("%s: error %v; want nil or a *relay.CorruptRowError", what, err)
	}
	return ce
}

// checkAnswer fails t unless rows and err, the answer to req, are want and
// wantErr: the same rows, and no error or the same corrupt row's.
func (e *env) checkAnswer(req relay.BatchRequest, rows []*outbox.Message, err error, want []*outbox.Message, wantErr error, why string) {
	e.t.Helper()
	what := "NextBatches(" + fmtReqs([]relay.BatchRequest{req}) + ")"
	got, exp := e.corrupt(err, what), e.corrupt(wantErr, what)
	if (got == nil) != (exp == nil) || got != nil && (got.ID != exp.ID || got.Bucket != exp.Bucket) || !sameRows(rows, want) {
		e.t.Fatalf("%s = %v, %v; want %v, %v: %s", what, msgIDs(rows), err, msgIDs(want), wantErr, why)
	}
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
		e.checkAnswer(r, got[i].Rows, got[i].Err, alone, aloneErr, "as alone")
		want, wantErr := e.expect(s, r)
		e.checkAnswer(r, got[i].Rows, got[i].Err, want, wantErr, "the bucket's batch cut")
	}
}

// expect returns the answer to r (of one bucket) modelled on the bucket's
// whole batch: without the rows of r.Exclude, then cut (see cut).
func (e *env) expect(s relay.Store, r relay.BatchRequest) ([]*outbox.Message, error) {
	e.t.Helper()
	all, err := e.next(s, r.Buckets[0], 100000, 0)
	e.corrupt(err, fmt.Sprintf("NextBatches(%d)", r.Buckets[0]))
	all = slices.DeleteFunc(all, func(m *outbox.Message) bool {
		return slices.ContainsFunc(r.Exclude, func(x *outbox.Message) bool { return x.ID == m.ID })
	})
	return cut(all, r.Limit, r.MaxBytes, err)
}

// cut returns rows up to limit and through the row crossing maxBytes (0: no
// bound), with err, a corrupt row ending rows, when the bounds do not end
// them first.
func cut(rows []*outbox.Message, limit int, maxBytes int64, err error) ([]*outbox.Message, error) {
	var total int64
	for i, m := range rows {
		if i >= limit || maxBytes > 0 && total > maxBytes {
			return rows[:i], nil
		}
		total += relay.MessageSize(m)
	}
	if len(rows) >= limit || maxBytes > 0 && total > maxBytes {
		return rows, nil
	}
	return rows, err
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

// checkInOrder fails t unless rows and err, the answer to req of several
// buckets, are each requested bucket's batch (without the rows of
// req.Exclude; each checked alone by checkAsAlone) merged in id order, ended
// by the first corrupt row among them, then cut (see cut).
func (e *env) checkInOrder(s relay.Store, req relay.BatchRequest, rows []*outbox.Message, err error) {
	e.t.Helper()
	excl := map[int][]*outbox.Message{}
	for _, m := range req.Exclude {
		excl[int(m.Bucket)] = append(excl[int(m.Bucket)], m)
	}
	reqs := make([]relay.BatchRequest, len(req.Buckets))
	for i, b := range req.Buckets {
		reqs[i] = relay.BatchRequest{Buckets: []int{b}, Limit: 100000, Exclude: excl[b]}
	}
	res, resErr := s.NextBatches(e.ctx, reqs)
	if resErr != nil {
		e.t.Fatalf("NextBatches(%d buckets): %v", len(reqs), resErr)
	}
	var all []*outbox.Message
	var first *relay.CorruptRowError
	for i, r := range res {
		for _, m := range r.Rows {
			if int(m.Bucket) != reqs[i].Buckets[0] {
				e.t.Fatalf("NextBatches(bucket %d) returned row %d of bucket %d", reqs[i].Buckets[0], m.ID, m.Bucket)
			}
		}
		all = append(all, r.Rows...)
		if ce := e.corrupt(r.Err, fmt.Sprintf("NextBatches(%d)", reqs[i].Buckets[0])); ce != nil && (first == nil || ce.ID < first.ID) {
			first = ce
		}
	}
	slices.SortFunc(all, func(a, b *outbox.Message) int { return cmp.Compare(a.ID, b.ID) })
	var wantErr error
	if first != nil {
		all = slices.DeleteFunc(all, func(m *outbox.Message) bool { return m.ID > first.ID })
		wantErr = first
	}
	want, wantErr := cut(all, req.Limit, req.MaxBytes, wantErr)
	e.checkAnswer(req, rows, err, want, wantErr, "each bucket's batch merged in id order, cut")
}

// nextBatchesRandom: on rows of a few keys and values of random sizes in
// all buckets but one, some parked (rejected, corrupt, held) when the store
// can park, and a corrupt row when the harness can write one, each round
// asks for random requests of one bucket each (buckets in any order; limits
// from 0) and for one random request of several buckets, with byte bounds
// or none and rows left out (a batch being deleted: its head, or any of its
// rows) or none: NextBatches answers each request of one bucket as alone,
// and the request of several as checkInOrder models it; the round then
// deletes a random prefix of each answer (MarkPublished), as the relay does.
func nextBatchesRandom(t *testing.T, f Factory) {
	const n = 12
	e := newEnv(t, f, n)
	s, canPark := e.parkingStore()
	rng := e.rng()
	keys := []string{"a", "b", "c", ""}
	insert := func() {
		rows := make([]*outbox.Message, 80)
		for i := range rows {
			rows[i] = e.msg(rng.IntN(n-1), start) // bucket n-1 stays empty
			if k := keys[rng.IntN(len(keys))]; k != "" {
				rows[i].Key = []byte(k)
			} else {
				rows[i].Key = nil
			}
			rows[i].Value = bytes.Repeat([]byte{'v'}, 1+rng.IntN(200))
		}
		e.insert(rows...)
	}
	insert()
	if e.h.InsertCorrupt != nil {
		if err := e.h.InsertCorrupt(e.ctx, rng.IntN(n-1)); err != nil {
			t.Fatalf("Harness.InsertCorrupt: %v", err)
		}
	}
	insert()
	if canPark {
		e.parkSome(s, rng, n, e.batchBeforeCorrupt)
	}
	bound := func(r *relay.BatchRequest, limit int, maxBytes int64) {
		r.Limit = limit
		if rng.IntN(4) == 0 {
			r.Limit = 1000
		}
		if rng.IntN(2) == 0 {
			r.MaxBytes = 1 + rng.Int64N(maxBytes)
		}
	}
	deleting := func(b int) []*outbox.Message {
		prev, _ := e.next(s, b, 1+rng.IntN(6), 0)
		if rng.IntN(3) == 0 {
			prev = slices.DeleteFunc(prev, func(*outbox.Message) bool { return rng.IntN(2) == 0 })
		}
		return prev
	}
	publish := func(round int, res ...relay.BatchResult) {
		var done []*outbox.Message
		for _, r := range res {
			if ce := e.corrupt(r.Err, "NextBatches"); ce != nil && canPark && len(r.Rows) == 0 {
				e.park(s, ce.Bucket, ce.ID, relay.CorruptReasonPrefix+ce.Err.Error())
			}
			done = append(done, r.Rows[:rng.IntN(len(r.Rows)+1)]...)
		}
		if err := s.MarkPublished(e.ctx, done); err != nil {
			t.Fatalf("round %d: MarkPublished(%v): %v", round, msgIDs(done), err)
		}
	}
	for round := range 20 {
		buckets := rng.Perm(n)[:1+rng.IntN(n)]
		reqs := make([]relay.BatchRequest, len(buckets))
		for i, b := range buckets {
			reqs[i].Buckets = []int{b}
			bound(&reqs[i], rng.IntN(8), 600)
			if rng.IntN(2) == 0 {
				reqs[i].Exclude = deleting(b)
			}
		}
		got, err := s.NextBatches(e.ctx, reqs)
		if err != nil {
			t.Fatalf("round %d: NextBatches(%s): %v", round, fmtReqs(reqs), err)
		}
		e.checkAsAlone(s, reqs, got)
		publish(round, got...)

		var req relay.BatchRequest
		for b := range n {
			if rng.IntN(3) != 0 {
				req.Buckets = append(req.Buckets, b)
			}
		}
		if len(req.Buckets) == 0 {
			req.Buckets = []int{rng.IntN(n)}
		}
		bound(&req, 1+rng.IntN(30), 3000)
		for b := range n {
			if rng.IntN(6) == 0 { // of requested buckets and others
				req.Exclude = append(req.Exclude, deleting(b)...)
			}
		}
		rows, err := e.answer(s, req)
		e.checkInOrder(s, req, rows, err)
		publish(round, relay.BatchResult{Rows: rows, Err: err})
	}
	if got, err := e.answer(s, relay.BatchRequest{Buckets: all(n), Limit: 0}); err != nil || len(got) != 0 {
		t.Fatalf("NextBatches(limit 0) = %v, %v; want nothing", msgIDs(got), err)
	}
}

// batchBeforeCorrupt returns the ids of bucket's batch: the rows before a
// corrupt one, none at a corrupt head.
func (e *env) batchBeforeCorrupt(s relay.Store, bucket int) []int64 {
	e.t.Helper()
	got, err := e.next(s, bucket, 10000, 0)
	e.corrupt(err, fmt.Sprintf("NextBatches(%d)", bucket))
	return msgIDs(got)
}

// nextBatchesOfManyBuckets: with one to three rows in each of 600 buckets
// (more than a store reads in one statement), inserted in a random order,
// one call of a request per bucket answers each as it is answered alone;
// one request of the buckets less some holes (every seventh, a run of
// twenty), of a few of them (more holes than buckets) or of all returns the
// rows of exactly those buckets in id order, whole or cut.
func nextBatchesOfManyBuckets(t *testing.T, f Factory) {
	const n = 600
	e := newEnv(t, f, n)
	s := e.relay("relay-a").s
	rowsOf := func(b int) int { return 1 + b%3 }
	var rows []*outbox.Message
	for b := range n {
		for range rowsOf(b) {
			rows = append(rows, e.msg(b, start))
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
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
		if b := reqs[i].Buckets[0]; len(r.Rows) != min(1+b%2, rowsOf(b)) {
			t.Fatalf("NextBatches result %d (bucket %d) = %d rows; want %d", i, b, len(r.Rows), min(1+b%2, rowsOf(b)))
		}
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
		{Buckets: holed, Limit: 10000},
		{Buckets: holed, Limit: 50},
		{Buckets: holed[10:200], Limit: 10000, MaxBytes: 2000},
		{Buckets: sparse, Limit: 10000},
		{Buckets: all(n), Limit: 10000},
	} {
		got, err := e.answer(s, req)
		e.checkInOrder(s, req, got, err)
		if req.Limit == 10000 && req.MaxBytes == 0 {
			var want int
			for _, b := range req.Buckets {
				want += rowsOf(b)
			}
			if len(got) != want {
				t.Fatalf("NextBatches(%s) = %d rows; want all %d of its buckets", fmtReqs([]relay.BatchRequest{req}), len(got), want)
			}
		}
	}
}

// nextBatchesCorruptRow: rows of buckets 1 to 3 in turn, a row that cannot
// be decoded in bucket 2 behind one of its rows and one at the head of
// bucket 4, then more rows of the three. Requests of one bucket: bucket 2's
// batch is its row before the corrupt one with its *relay.CorruptRowError,
// bucket 4's the error alone, the other buckets' whole. A request of buckets
// 1 to 3 returns the rows before the corrupt one in id order with its error;
// with a limit that ends before it, the rows and no error; with those rows
// left out, the error alone; without bucket 2, every row of the other two.
// A store that parks, once bucket 2's row before it is published and the
// corrupt row parked, returns the bucket's later row.
func nextBatchesCorruptRow(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	if e.h.InsertCorrupt == nil {
		t.Skip("storetest: Harness.InsertCorrupt is nil")
	}
	s, canPark := e.parkingStore()
	e.insert(e.msg(1, start), e.msg(2, start), e.msg(3, start), e.msg(1, start))
	for _, b := range []int{2, 4} {
		if err := e.h.InsertCorrupt(e.ctx, b); err != nil {
			t.Fatalf("Harness.InsertCorrupt(%d): %v", b, err)
		}
	}
	later := e.msg(2, start)
	e.insert(e.msg(3, start), later, e.msg(1, start))
	reqs := []relay.BatchRequest{{Buckets: []int{3}, Limit: 10}, {Buckets: []int{2}, Limit: 10}, {Buckets: []int{1}, Limit: 10}, {Buckets: []int{4}, Limit: 10}, {Buckets: []int{5}, Limit: 10}}
	res, err := s.NextBatches(e.ctx, reqs)
	if err != nil {
		t.Fatalf("NextBatches: %v", err)
	}
	e.checkAsAlone(s, reqs, res)
	for i, want := range []struct{ rows, corrupt int }{{2, 0}, {1, 2}, {3, 0}, {0, 4}, {0, 0}} {
		r, b := res[i], reqs[i].Buckets[0]
		if ce := e.corrupt(r.Err, "NextBatches"); len(r.Rows) != want.rows || (ce == nil) != (want.corrupt == 0) || ce != nil && ce.Bucket != b {
			t.Fatalf("NextBatches bucket %d = %v, %v; want %d rows and a *relay.CorruptRowError of it: %v", b, msgIDs(r.Rows), r.Err, want.rows, want.corrupt != 0)
		}
	}

	others, err := e.answer(s, relay.BatchRequest{Buckets: []int{1, 3}, Limit: 100})
	if err != nil || len(others) != 5 {
		t.Fatalf("NextBatches(buckets 1, 3) = %v, %v; want their 5 rows", msgIDs(others), err)
	}
	req := relay.BatchRequest{Buckets: []int{1, 2, 3}, Limit: 100}
	got, err := e.answer(s, req)
	ce := e.corrupt(err, "NextBatches(buckets 1, 2, 3)")
	if ce == nil || len(got) != 4 || got[1].Bucket != 2 || !slices.IsSorted(msgIDs(got)) {
		t.Fatalf("NextBatches(%s) = %v, %v; want the 4 rows before the corrupt one, in id order, with a *relay.CorruptRowError", fmtReqs([]relay.BatchRequest{req}), msgIDs(got), err)
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
	if again := e.corrupt(err, "NextBatches"); again == nil || again.ID != ce.ID || len(head) != 0 {
		t.Fatalf("NextBatches(%s) = %v, %v; want only the *relay.CorruptRowError of row %d", fmtReqs([]relay.BatchRequest{req}), msgIDs(head), err, ce.ID)
	}

	if !canPark {
		return
	}
	if err := s.MarkPublished(e.ctx, res[1].Rows); err != nil {
		t.Fatal(err)
	}
	if head, err := e.next(s, 2, 100, 0); len(head) != 0 || e.corrupt(err, "NextBatches(2)") == nil {
		t.Fatalf("NextBatches(2) at the corrupt head = %v, %v; want a *relay.CorruptRowError alone", msgIDs(head), err)
	}
	e.park(s, 2, ce.ID, relay.CorruptReasonPrefix+ce.Err.Error())
	if after, err := e.next(s, 2, 100, 0); err != nil || len(after) != 1 || after[0].MessageID != later.MessageID {
		t.Fatalf("NextBatches(2) after parking the corrupt row = %v, %v; want the later row", msgIDs(after), err)
	}
}

// markPublished: one MarkPublished of 2,100 rows' worth of prefixes over
// four buckets (in no particular order) deletes exactly those rows, not a
// fifth bucket's; again (the rows gone) or of nothing it succeeds; a row
// parked after it was read, when the store can park, is not deleted.
func markPublished(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s, canPark := e.parkingStore()
	var rows []*outbox.Message
	for i := range 2100 {
		rows = append(rows, e.msg(1+i%4, start))
	}
	rows = append(rows, e.msg(5, start), e.msg(5, start))
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
	five := e.batch(s, 5)
	if len(five) != 2 {
		t.Fatalf("NextBatches(5) = %v; want 2 rows", five)
	}
	var parked int64
	if canPark {
		parked = batch[2][1].ID
		e.park(s, 2, parked, "rejected")
	}
	done := slices.Concat(batch[3], batch[1][:300], batch[2][:400], batch[4][:200])
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(done), func(i, j int) { done[i], done[j] = done[j], done[i] })
	for _, d := range [][]*outbox.Message{done, done, nil} { // the second call finds the rows gone
		if err := s.MarkPublished(e.ctx, d); err != nil {
			t.Fatalf("MarkPublished(%d rows): %v", len(d), err)
		}
	}
	for b, want := range map[int][]int64{1: msgIDs(batch[1][300:]), 2: msgIDs(batch[2][400:]), 3: {}, 4: msgIDs(batch[4][200:]), 5: five} {
		if got := e.batch(s, b); !slices.Equal(got, want) {
			t.Fatalf("bucket %d after MarkPublished = %d rows %v; want %d rows %v", b, len(got), got, len(want), want)
		}
	}
	adm, ok := s.(relay.ParkAdmin)
	if !canPark || !ok {
		return
	}
	if n, err := adm.RequeueParked(e.ctx, relay.ParkedSelector{ID: parked}); err != nil || n != 1 {
		t.Fatalf("RequeueParked(ID %d) = %d, %v; want 1 (MarkPublished must not delete a parked row)", parked, n, err)
	}
	if got := e.batch(s, 2); len(got) == 0 || got[0] != parked {
		t.Fatalf("bucket 2 after the requeue = %v; want the parked row %d first", got, parked)
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

// nextBatchesExclude: a relay fetching a bucket's next batch while the
// previous one is deleted asks for it to be left out: the answer starts
// after it, its limit and byte bound counting only the rows returned, alone
// (one request) or in a group; a row before them that is not listed (one
// committed late) is returned.
func nextBatchesExclude(t *testing.T, f Factory) {
	e := newEnv(t, f, 4)
	s := e.relay("relay-a").s
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
