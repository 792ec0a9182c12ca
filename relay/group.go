package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox"
)

// Groups: a sweep worker serves several shallow buckets at once, with one
// fetch (Store.NextBatches), one publish and one delete, so that a backlog
// spread thinly over many buckets costs a few calls per group instead of
// per bucket. A group's batches share BatchSize and MaxBatchBytes: a
// bucket whose latest batch took all it could (a deep one) takes twice
// that share next, up to a whole batch (served alone), and the others split
// what is left equally; a batch that drains a bucket ends its share. So
// deep buckets fill a group's batch as a whole batch would, however few
// rows each holds (1,024 buckets of 200 rows: groups of ~450 rows, where
// serving each alone published ~200), and a shallow one waits behind at
// most one group. A bucket retrying its head row is served alone. When a
// group's fetch or delete fails, each of its buckets is served alone next,
// at once: only the one at fault backs off.
//
// Groups read in order: with Options.SingleWriter (SQLite: the relay
// serves one group at a time), a group is every waiting bucket, however
// deep, up to maxOrdered, and its fetch is one request of them all:
// BatchSize rows in id order across its buckets, the table's own order,
// as a plain loop over the table reads it (each page read once, where one
// bucket's rows are spread over as many times more pages as there are
// buckets). Cut by the limit (or the bytes), the fetch tells nothing of a
// bucket's depth: every bucket of the group stays ready, and the group is
// read again; a fetch that is not cut drained them all. (On PostgreSQL
// and MariaDB, groups of thousands of buckets read so were measured at a
// third of the rate by heads: each fetch passed the rows of every other
// group and the dead entries of the rows deleted meanwhile, and the
// relay's work per fetch grew with the group's buckets.)

// maxGroup bounds the buckets of a group read by heads: its fetch, one
// statement, reads at most maxGroup bucket heads.
const maxGroup = 64

// maxOrdered bounds the buckets of a group read in order: the relay's work
// per fetch (a request per bucket) grows with them; beyond it a serialising
// store's groups are read by heads.
const maxOrdered = 1024

// readsInOrder reports whether the next group is read in order (see
// above): Options.SingleWriter is set and at most maxOrdered buckets are
// queued.
func (r *Relay) readsInOrder(queued int) bool {
	return r.serialWrites && queued <= maxOrdered
}

// groupSize is how many buckets a worker takes at once when queued buckets
// wait: an equal share of them per worker; read by heads, at most maxGroup
// and BatchSize (a row each).
func (r *Relay) groupSize(queued, workers int, ordered bool) int {
	if ordered {
		return max(1, queued)
	}
	each := max(1, (queued+workers-1)/workers)
	return min(maxGroup, r.opts.BatchSize, each)
}

// groupable reports whether bucket b may join a group: it is not retrying
// its head row, nor due alone (see bucketState.alone), nor, read by heads,
// deep enough for a whole batch.
func (r *Relay) groupable(st *runState, b int, ordered bool) bool {
	return st.b[b].retry == nil && !st.b[b].alone && (ordered || st.b[b].share < r.opts.BatchSize)
}

// deepen records bucket b's batch read with limit rows: cut (by the limit
// or the bytes), b's next share in a group is twice limit, up to BatchSize;
// else it has none (an equal share).
func (r *Relay) deepen(st *runState, b, limit int, cut bool) {
	st.b[b].share = 0
	if cut {
		st.b[b].share = min(r.opts.BatchSize, 2*max(limit, 1))
	}
}

// shares returns the rows each bucket of group takes: a deep one its share,
// the others an equal part of what the deep ones leave of BatchSize (at
// least one row).
func (r *Relay) shares(st *runState, group []int) []int {
	limits := make([]int, len(group))
	left, equal := r.opts.BatchSize, 0
	for i, b := range group {
		if limits[i] = st.b[b].share; limits[i] > 0 {
			left -= limits[i]
		} else {
			equal++
		}
	}
	for i := range limits {
		if limits[i] == 0 {
			limits[i] = max(1, left/equal)
		}
	}
	return limits
}

// serve serves one batch of each bucket of group (one, or several
// groupable ones): fetch, publish, settle. It runs on a sweep's worker
// goroutine: it touches only its buckets' state and checks the leases,
// without dropping them, before every step that changes their rows;
// errs[i] is group[i]'s outcome.
func (r *Relay) serve(ctx, cleanup context.Context, st *runState, group []int, ordered bool) []error {
	errs := make([]error, len(group))
	st.worked.Store(true)
	var fs []*fetched
	if ordered && len(group) > 1 {
		fs = r.fetchInOrder(ctx, cleanup, st, group, errs)
	} else {
		fs = r.fetchHeads(ctx, cleanup, st, group, errs)
	}
	var batches [][]*outbox.Message
	var served []int // indexes into group of batches
	for i, f := range fs {
		if f != nil && r.ownsBucket(st, group[i]) {
			batches, served = append(batches, f.rows), append(served, i)
		}
	}
	if len(batches) == 0 {
		return errs
	}
	results, took := r.publish(cleanup, batches)
	failpoint("relay/after-ack")
	var del groupDelete
	for j, i := range served {
		errs[i] = r.settle(ctx, st, group[i], fs[i], results[j], took, &del, len(group) == 1)
	}
	if len(del.buckets) > 0 {
		r.startDelete(ctx, cleanup, st, del.buckets, del.rows, func(deleteTook time.Duration) {
			for j, i := range served {
				attrs := []any{"bucket", group[i], "rows", len(batches[j]), "acknowledged", results[j].Acknowledged}
				if len(batches) > 1 {
					attrs = append(attrs, "group", len(batches))
				}
				r.log.DebugContext(ctx, "batch published", append(attrs, "fetch_ms", fs[i].took.Milliseconds(),
					"publish_ms", took.Milliseconds(), "delete_ms", deleteTook.Milliseconds())...)
			}
		})
	}
	return errs
}

// fraction returns total × n / of (n ≤ of) without overflowing.
func fraction(total int64, n, of int) int64 {
	return total/int64(of)*int64(n) + total%int64(of)*int64(n)/int64(of)
}

// fetchHeads reads a batch of each owned bucket of group in one
// NextBatches call, a request per bucket: alone, BatchSize rows and
// MaxBatchBytes; in a group, its share of them (see shares). fs[i] is
// group[i]'s batch (nil: nothing to publish), and a bucket's error goes to
// errs[i]. When a group's call fails, each bucket is fetched alone next,
// at once.
func (r *Relay) fetchHeads(ctx, cleanup context.Context, st *runState, group []int, errs []error) []*fetched {
	fs := make([]*fetched, len(group))
	limits := []int{r.opts.BatchSize}
	if len(group) > 1 {
		limits = r.shares(st, group)
	}
	reqs := make([]BatchRequest, 0, len(group))
	var at []int // indexes into group of reqs
	for i, b := range group {
		if !r.ownsBucket(st, b) {
			continue
		}
		maxBytes := r.opts.MaxBatchBytes
		if len(group) > 1 {
			maxBytes = max(1, fraction(maxBytes, limits[i], r.opts.BatchSize))
		}
		req, err := r.fetchRequest(ctx, cleanup, st, b, limits[i], maxBytes)
		if req == nil || err != nil {
			errs[i] = err
			continue
		}
		reqs, at = append(reqs, *req), append(at, i)
	}
	if len(reqs) == 0 {
		return fs
	}
	start := r.clock.Now()
	results, err := r.nextBatches(ctx, reqs)
	took := r.clock.Now().Sub(start)
	for j, i := range at {
		switch {
		case err != nil && len(group) == 1:
			errs[i] = errBucket{fmt.Errorf("relay: bucket %d: next batch: %w", group[i], err)}
		case err != nil:
			// Whose fault is not known: each bucket is fetched alone next,
			// at once, and only a failing one backs off.
			st.b[group[i]].alone = true
		default:
			fs[i], errs[i] = r.fetched(ctx, st, reqs[j], results[j].Rows, results[j].Err, took)
		}
	}
	return fs
}

// fetchInOrder reads a batch of the owned buckets of group in one request
// (see readsInOrder): up to BatchSize rows and MaxBatchBytes in id order
// across them, split by bucket; fs[i] is group[i]'s part (nil: nothing to
// publish), and a bucket's error goes to errs[i]. Cut by the limit, the
// bytes or a corrupt row, the fetch leaves every bucket ready; else each
// is drained. A corrupt row is parked when no row of its bucket comes
// before it (else it is its bucket's next head). When the call fails, or
// answers with a row of a bucket not asked for, each bucket is fetched
// alone next, at once.
func (r *Relay) fetchInOrder(ctx, cleanup context.Context, st *runState, group []int, errs []error) []*fetched {
	fs := make([]*fetched, len(group))
	req := BatchRequest{Limit: r.opts.BatchSize, MaxBytes: r.opts.MaxBatchBytes}
	at := make(map[int32]int, len(group)) // bucket → its index in group
	for i, b := range group {
		if !r.ownsBucket(st, b) {
			continue
		}
		breq, err := r.fetchRequest(ctx, cleanup, st, b, r.opts.BatchSize, r.opts.MaxBatchBytes)
		if breq == nil || err != nil {
			errs[i] = err
			continue
		}
		req.Buckets, req.Exclude, at[int32(b)] = append(req.Buckets, b), append(req.Exclude, breq.Exclude...), i
	}
	if len(req.Buckets) == 0 {
		return fs
	}
	slices.Sort(req.Buckets) // the queue's order is not theirs
	start := r.clock.Now()
	var rows []*outbox.Message
	results, err := r.nextBatches(ctx, []BatchRequest{req})
	if err == nil {
		rows, err = results[0].Rows, results[0].Err
	}
	took := r.clock.Now().Sub(start)
	var corrupt *CorruptRowError
	if errors.As(err, &corrupt) {
		err = nil
		if _, ok := at[int32(corrupt.Bucket)]; !ok {
			err = fmt.Errorf("a corrupt row of bucket %d, which was not asked for", corrupt.Bucket)
		}
	}
	parts := make(map[int32][]*outbox.Message)
	for _, m := range rows {
		if _, ok := at[m.Bucket]; !ok && err == nil {
			err = fmt.Errorf("row %d of bucket %d, which was not asked for", m.ID, m.Bucket)
		}
		parts[m.Bucket] = append(parts[m.Bucket], m)
	}
	if err != nil {
		for _, b := range req.Buckets {
			st.b[b].alone = true // whose fault is not known
		}
		return fs
	}
	cut := len(rows) >= req.Limit || corrupt != nil
	if req.MaxBytes > 0 && batchSize(rows) > req.MaxBytes {
		kept, _ := trimToBytes(rows, req.MaxBytes)
		cut, parts = true, make(map[int32][]*outbox.Message)
		for _, m := range kept {
			parts[m.Bucket] = append(parts[m.Bucket], m)
		}
	}
	failpoint("relay/after-fetch")
	for _, b := range req.Buckets {
		i, part := at[int32(b)], parts[int32(b)]
		st.b[b].alone, st.b[b].share = false, 0
		switch {
		case corrupt != nil && corrupt.Bucket == b && len(part) == 0:
			errs[i] = r.parkCorrupt(ctx, st, b, corrupt)
		case len(part) > 0:
			fs[i] = &fetched{rows: part, drained: !cut, took: took}
		case !cut:
			st.b[b].ready = false // drained; a hint or discovery brings it back
			st.settled(b)
		}
	}
	return fs
}

// nextBatches is the store's NextBatches, checked to answer every request.
func (r *Relay) nextBatches(ctx context.Context, reqs []BatchRequest) ([]BatchResult, error) {
	results, err := r.store.NextBatches(ctx, reqs)
	if err == nil && len(results) != len(reqs) {
		err = fmt.Errorf("NextBatches returned %d results for %d requests", len(results), len(reqs))
	}
	return results, err
}

// groupDelete collects a group's acknowledged rows, per bucket, for one
// delete.
type groupDelete struct {
	buckets []int
	rows    [][]*outbox.Message
}

func (d *groupDelete) add(b int, rows []*outbox.Message) {
	d.buckets, d.rows = append(d.buckets, b), append(d.rows, rows)
}
