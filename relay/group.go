package relay

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox"
)

// Groups: a sweep worker serves several shallow buckets at once, when the
// publisher is a GroupPublisher, with one fetch (a MultiBucketStore's, else
// one NextBatch per bucket), one publish and one delete, so that a backlog
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

// maxGroup bounds the buckets of a group: its fetch, one statement, reads
// at most maxGroup bucket heads.
const maxGroup = 64

// groupSize is how many buckets a worker takes at once when queued buckets
// wait: an equal share of them per worker, at most maxGroup and BatchSize
// (a row each); 1 without a GroupPublisher.
func (r *Relay) groupSize(queued, workers int) int {
	if r.group == nil {
		return 1
	}
	return min(maxGroup, r.opts.BatchSize, max(1, (queued+workers-1)/workers))
}

// groupable reports whether bucket b may join a group: it is not retrying
// its head row, nor due alone (see bucketState.alone), nor deep enough for a
// whole batch.
func (r *Relay) groupable(st *runState, b int) bool {
	return st.b[b].retry == nil && !st.b[b].alone && st.b[b].share < r.opts.BatchSize
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

// serveGroup serves one batch of each bucket of group (more than one, each
// groupable): fetch, publish, settle. It runs on a sweep's worker
// goroutine, as drainOnce does; errs[i] is group[i]'s outcome.
func (r *Relay) serveGroup(ctx, cleanup context.Context, st *runState, group []int) []error {
	errs := make([]error, len(group))
	st.worked.Store(true)
	fs := r.fetchGroup(ctx, cleanup, st, group, errs)
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
	results, took := r.publishGroup(cleanup, batches)
	failpoint("relay/after-ack")
	var del groupDelete
	for j, i := range served {
		errs[i] = r.settle(ctx, cleanup, st, group[i], fs[i], results[j], took, &del)
	}
	if len(del.buckets) > 0 {
		r.startDelete(ctx, cleanup, st, del.buckets, del.rows, func(deleteTook time.Duration) {
			for j, i := range served {
				r.log.DebugContext(ctx, "batch published", "bucket", group[i], "rows", len(batches[j]), "acknowledged", results[j].Acknowledged,
					"group", len(batches), "fetch_ms", fs[i].took.Milliseconds(), "publish_ms", took.Milliseconds(), "delete_ms", deleteTook.Milliseconds())
			}
		})
	}
	return errs
}

// fraction returns total × n / of (n ≤ of) without overflowing.
func fraction(total int64, n, of int) int64 {
	return total/int64(of)*int64(n) + total%int64(of)*int64(n)/int64(of)
}

// fetchGroup reads a batch of each owned bucket of group, each bounded by
// its share of BatchSize (see shares) and as large a part of
// MaxBatchBytes, in one NextBatches call
// when the store is a MultiBucketStore; fs[i] is group[i]'s batch (nil:
// nothing to publish), and a bucket's error goes to errs[i].
func (r *Relay) fetchGroup(ctx, cleanup context.Context, st *runState, group []int, errs []error) []*fetched {
	fs := make([]*fetched, len(group))
	limits := r.shares(st, group)
	reqs := make([]BatchRequest, 0, len(group))
	var at []int // indexes into group of reqs
	excls := make([][]*outbox.Message, len(group))
	for i, b := range group {
		if !r.ownsBucket(st, b) {
			continue
		}
		maxBytes := max(1, fraction(r.opts.MaxBatchBytes, limits[i], r.opts.BatchSize))
		req, excl, err := r.fetchRequest(ctx, cleanup, st, b, limits[i], maxBytes)
		if req == nil || err != nil {
			errs[i] = err
			continue
		}
		reqs, at, excls[i] = append(reqs, *req), append(at, i), excl
	}
	if len(reqs) == 0 {
		return fs
	}
	start := r.clock.Now()
	results, err := r.nextBatches(ctx, reqs)
	took := r.clock.Now().Sub(start)
	for j, i := range at {
		if err != nil {
			// Whose fault is not known: each bucket is fetched alone next,
			// at once, and only a failing one backs off.
			st.b[group[i]].alone = true
			continue
		}
		fs[i], errs[i] = r.fetched(ctx, st, reqs[j], excls[i], results[j].Rows, results[j].Err, took)
	}
	return fs
}

// nextBatches answers reqs with the store's NextBatches, or one NextBatch
// per request when the store is no MultiBucketStore.
func (r *Relay) nextBatches(ctx context.Context, reqs []BatchRequest) ([]BatchResult, error) {
	if ms, ok := r.store.(MultiBucketStore); ok {
		results, err := ms.NextBatches(ctx, reqs)
		if err == nil && len(results) != len(reqs) {
			err = fmt.Errorf("NextBatches returned %d results for %d requests", len(results), len(reqs))
		}
		return results, err
	}
	results := make([]BatchResult, len(reqs))
	for i, req := range reqs {
		results[i].Rows, results[i].Err = r.store.NextBatch(ctx, req.Bucket, req.Limit, req.MaxBytes)
	}
	return results, nil
}

// markPublished deletes rows[i] of buckets[i], in one MarkPublishedBuckets
// call when the store is a MultiBucketStore and there are several buckets.
func (r *Relay) markPublished(ctx context.Context, buckets []int, rows [][]*outbox.Message) error {
	ms, ok := r.store.(MultiBucketStore)
	if ok && len(buckets) > 1 {
		return ms.MarkPublishedBuckets(ctx, slices.Concat(rows...))
	}
	for i, b := range buckets {
		if err := r.store.MarkPublished(ctx, b, rows[i]); err != nil {
			return err
		}
	}
	return nil
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
