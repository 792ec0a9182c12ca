package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox"
)

// A worker serves a group of buckets with one fetch, one publish and one
// delete, so that a backlog spread thinly over many buckets costs a few
// calls per group. Read by heads, each bucket has its own request sharing
// BatchSize and MaxBatchBytes; read in order (Options.SingleWriter), one
// request covers the group, in the table's own order. When a group's fetch
// or delete fails, each of its buckets is served alone next, at once: only
// the one at fault backs off.

// serve fetches, publishes and settles a batch of each bucket of group; errs[i] is group[i]'s outcome.
func (r *Relay) serve(ctx, cleanup context.Context, st *runState, group []int, ordered bool) []error {
	errs := make([]error, len(group))
	st.worked.Store(true)
	fs := r.fetch(ctx, cleanup, st, group, ordered, errs)
	var batches [][]*outbox.Message
	var served []int // indexes into group of batches
	for i, f := range fs {
		if f != nil && st.b[group[i]].owned() {
			batches, served = append(batches, f.rows), append(served, i)
		}
	}
	if len(batches) == 0 {
		return errs
	}
	results, took := r.publish(cleanup, batches)
	failpoint("relay/after-ack")
	var del []*pendingDelete // the group's acknowledged rows, for one delete
	for j, i := range served {
		errs[i] = st.b[group[i]].settle(ctx, fs[i], results[j], took, &del, len(group) == 1)
	}
	if len(del) > 0 {
		r.startDelete(ctx, cleanup, st, del, func(deleteTook time.Duration) {
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

// fetch reads a batch of each owned bucket of group in one NextBatches call (nil: nothing to publish).
func (r *Relay) fetch(ctx, cleanup context.Context, st *runState, group []int, ordered bool, errs []error) []*fetched {
	fs := make([]*fetched, len(group))
	ordered = ordered && len(group) > 1
	limits := r.shares(st, group, ordered)
	var reqs []BatchRequest
	var at []int // indexes into group of reqs
	for i, b := range group {
		if !st.b[b].owned() {
			continue
		}
		maxBytes := max(1, fraction(r.opts.MaxBatchBytes, limits[i], r.opts.BatchSize))
		req, err := st.b[b].request(ctx, cleanup, limits[i], maxBytes)
		if req == nil || err != nil {
			errs[i] = err
			continue
		}
		reqs, at = append(reqs, *req), append(at, i)
	}
	if len(reqs) == 0 {
		return fs
	}
	if ordered {
		r.fetchInOrder(ctx, st, group, reqs, at, fs, errs)
		return fs
	}
	start := r.clock.Now()
	results, err := r.nextBatches(ctx, reqs)
	took := r.clock.Now().Sub(start)
	for j, i := range at {
		bk := &st.b[group[i]]
		switch {
		case err != nil && len(group) == 1:
			errs[i] = bk.errorf("next batch: %w", err)
		case err != nil:
			bk.alone = true // whose fault is not known: each is fetched alone next, at once
		default:
			fs[i], errs[i] = bk.fetched(ctx, reqs[j], results[j].Rows, results[j].Err, took)
		}
	}
	return fs
}

// shares returns the rows each bucket of group takes: a deep one its share, the others an equal part.
func (r *Relay) shares(st *runState, group []int, ordered bool) []int {
	limits := make([]int, len(group))
	if len(group) == 1 || ordered {
		for i := range limits {
			limits[i] = r.opts.BatchSize
		}
		return limits
	}
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

// fraction returns total × n / of (n ≤ of) without overflowing.
func fraction(total int64, n, of int) int64 {
	return total/int64(of)*int64(n) + total%int64(of)*int64(n)/int64(of)
}

// fetchInOrder reads the buckets of reqs in one request, in id order, split by bucket into fs.
func (r *Relay) fetchInOrder(ctx context.Context, st *runState, group []int, reqs []BatchRequest, at []int, fs []*fetched, errs []error) {
	req := BatchRequest{Limit: r.opts.BatchSize, MaxBytes: r.opts.MaxBatchBytes}
	index := make(map[int32]int, len(reqs)) // bucket → its index in group
	for j, breq := range reqs {
		req.Buckets, req.Exclude, index[int32(breq.Buckets[0])] = append(req.Buckets, breq.Buckets[0]), append(req.Exclude, breq.Exclude...), at[j]
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
		if _, ok := index[int32(corrupt.Bucket)]; !ok {
			err = fmt.Errorf("a corrupt row of bucket %d, which was not asked for", corrupt.Bucket)
		}
	}
	for _, m := range rows {
		if _, ok := index[m.Bucket]; !ok && err == nil {
			err = fmt.Errorf("row %d of bucket %d, which was not asked for", m.ID, m.Bucket)
		}
	}
	if err != nil {
		for _, b := range req.Buckets {
			st.b[b].alone = true // whose fault is not known
		}
		return
	}
	cut := len(rows) >= req.Limit || corrupt != nil
	if kept, over := trimToBytes(rows, req.MaxBytes); over {
		cut, rows = true, kept
	}
	parts := make(map[int32][]*outbox.Message)
	for _, m := range rows {
		parts[m.Bucket] = append(parts[m.Bucket], m)
	}
	failpoint("relay/after-fetch")
	for _, b := range req.Buckets {
		i, part, bk := index[int32(b)], parts[int32(b)], &st.b[b]
		bk.alone, bk.share = false, 0
		switch {
		case corrupt != nil && corrupt.Bucket == b && len(part) == 0:
			errs[i] = bk.parkCorrupt(ctx, corrupt)
		case len(part) > 0:
			fs[i] = &fetched{rows: part, drained: !cut, took: took}
		case !cut:
			bk.ready = false // drained; a hint or discovery brings it back
			bk.settled()
		}
	}
}

func (r *Relay) nextBatches(ctx context.Context, reqs []BatchRequest) ([]BatchResult, error) {
	results, err := r.store.NextBatches(ctx, reqs)
	if err == nil && len(results) != len(reqs) {
		err = fmt.Errorf("NextBatches returned %d results for %d requests", len(results), len(reqs))
	}
	return results, err
}

// publish publishes batches on cleanup: records cannot be retracted, so a stop awaits it.
func (r *Relay) publish(cleanup context.Context, batches [][]*outbox.Message) (results []Result, took time.Duration) {
	start := r.clock.Now()
	r.inflight.track(r, start, false)
	stopWarning := context.AfterFunc(cleanup, func() {
		r.log.Warn("in-flight publish outlived the stop budget; cancelled", "stop_timeout", r.opts.StopTimeout)
	})
	results = r.callPublisher(cleanup, batches)
	stopWarning()
	r.inflight.track(r, start, true)
	took = r.clock.Now().Sub(start)
	r.m.publishDur.Record(context.Background(), took.Seconds(), r.m.attrs)
	return results, took
}

// callPublisher calls Publish, turning a panic or wrong results into every batch's error.
func (r *Relay) callPublisher(ctx context.Context, batches [][]*outbox.Message) (results []Result) {
	defer func() {
		if p := recover(); p != nil {
			results = make([]Result, len(batches))
			for i := range results {
				results[i] = Result{Err: fmt.Errorf("relay: publisher panicked: %v", p)}
			}
		}
	}()
	results = r.pub.Publish(ctx, batches)
	if len(results) != len(batches) {
		panic(fmt.Sprintf("Publish returned %d results for %d batches", len(results), len(batches)))
	}
	return results
}

// MessageSize is the bytes of a row's key, value, header names and values.
func MessageSize(m *outbox.Message) int64 {
	n := int64(len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// trimToBytes returns the longest prefix of batch within maxBytes, at least one row.
func trimToBytes(batch []*outbox.Message, maxBytes int64) (kept []*outbox.Message, over bool) {
	var total int64
	for i, m := range batch {
		total += MessageSize(m)
		if total > maxBytes {
			return batch[:max(i, 1)], true
		}
	}
	return batch, false
}
