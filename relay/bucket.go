package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox"
)

// bucket is what a Run knows of one bucket, and the steps of its life:
// fetch, settle, delete, strike and park (park.go), drop. The worker
// serving it alone touches it; retry is written under runState.mu.
type bucket struct {
	id       int
	r        *Relay
	st       *runState
	ready    bool              // it may hold pending rows: serve it
	alone    bool              // served alone next: its group's fetch or delete failed
	share    int               // rows its next batch takes in a group (see deepen); 0: an equal share
	unmarked []*outbox.Message // acknowledged rows whose MarkPublished failed: deleted before the next fetch
	strikes  *strike           // its head row's strikes
	retry    *headRetry        // its head row's backoff; nil: none
	deleting *pendingDelete    // the running delete of its latest acknowledged rows; nil: none
}

// headRetry is the backoff of a bucket whose head row or own store call failed.
type headRetry struct {
	attempts  int
	notBefore time.Time
	since     time.Time // the first of these consecutive failures
	storeErr  error     // the latest failure was this store error; nil: a publish failure
	published bool      // a publish of the head row failed (see publishFailing)
}

// errBucket marks a store error of one bucket: that bucket alone backs off.
type errBucket struct{ err error }

func (e errBucket) Error() string { return e.err.Error() }
func (e errBucket) Unwrap() error { return e.err }

func (bk *bucket) errorf(format string, args ...any) error {
	return errBucket{fmt.Errorf("relay: bucket %d: "+format, append([]any{bk.id}, args...)...)}
}

func (bk *bucket) owned() bool {
	if !bk.r.leaseValid(bk.st) {
		return false
	}
	owned, _, _ := bk.st.lease.snapshot()
	return containsSorted(owned, bk.id)
}

func (bk *bucket) forget() {
	bk.ready, bk.unmarked = false, nil
	bk.settled()
}

func (bk *bucket) settled() {
	bk.st.mu.Lock()
	bk.retry = nil
	delete(bk.st.retrying, bk.id)
	bk.st.mu.Unlock()
	bk.strikes = nil
}

// sweepable reports whether the bucket is ready, not waiting out a backoff at now.
func (bk *bucket) sweepable(now time.Time) bool {
	return bk.ready && (bk.retry == nil || !now.Before(bk.retry.notBefore))
}

// groupable reports whether the bucket may join a group (not retrying, due alone or deep).
func (bk *bucket) groupable(ordered bool) bool {
	return bk.retry == nil && !bk.alone && (ordered || bk.share < bk.r.opts.BatchSize)
}

// deepen sets the next share in a group after a batch read with limit rows, cut or not.
func (bk *bucket) deepen(limit int, cut bool) {
	bk.share = 0
	if cut {
		bk.share = min(bk.r.opts.BatchSize, 2*max(limit, 1))
	}
}

type fetched struct {
	rows    []*outbox.Message
	drained bool // nothing is left behind it, and no head row was retried
	took    time.Duration
}

// request readies the fetch, deleting again the rows whose delete failed.
func (bk *bucket) request(ctx, cleanup context.Context, limit int, maxBytes int64) (*BatchRequest, error) {
	if bk.retry != nil {
		limit = 1
	}
	excl := bk.deletingRows(ctx)
	if done := bk.unmarked; done != nil {
		if !bk.owned() {
			bk.unmarked = nil
			return nil, nil
		}
		if err := bk.r.store.MarkPublished(cleanup, done); err != nil {
			return nil, bk.errorf("mark published (again): %w", err)
		}
		bk.unmarked = nil
	}
	return &BatchRequest{Buckets: []int{bk.id}, Limit: limit, MaxBytes: maxBytes, Exclude: excl}, nil
}

// fetched makes the answer to req the bucket's batch (nil: nothing to publish), parking a corrupt head row.
func (bk *bucket) fetched(ctx context.Context, req BatchRequest, batch []*outbox.Message, err error, took time.Duration) (*fetched, error) {
	full := len(batch) >= req.Limit // the bucket may hold more rows
	bk.alone = false
	bk.deepen(req.Limit, full)
	batch = without(batch, req.Exclude)
	ce, next := (*CorruptRowError)(nil), false
	switch {
	case errors.As(err, &ce) && len(batch) == 0:
		return nil, bk.parkCorrupt(ctx, ce)
	case ce != nil:
		next = true // the corrupt row is the next head
	case err != nil:
		return nil, bk.errorf("next batch: %w", err)
	}
	if len(batch) == 0 {
		// Full, it was a store returning the left-out rows anyway: fetch again.
		bk.ready = full
		bk.settled()
		return nil, nil
	}
	batch, over := trimToBytes(batch, req.MaxBytes)
	failpoint("relay/after-fetch")
	bk.deepen(req.Limit, full || over)
	return &fetched{rows: batch, drained: bk.retry == nil && !full && !over && !next, took: took}, nil
}

// settle records a publish's outcome and queues the acknowledged rows' delete; a failure backs
// the bucket off, strikes its head row or drops it.
func (bk *bucket) settle(ctx context.Context, f *fetched, res Result, took time.Duration, del *[]*pendingDelete, alone bool) error {
	r, pub := bk.r, f.rows
	ack := min(max(res.Acknowledged, 0), len(pub))
	if ack > 0 {
		r.m.acked.Add(context.Background(), int64(ack), r.m.attrs)
	}
	failed := res.Err != nil && ack < len(pub)
	stopped := ctx.Err() != nil && errors.Is(res.Err, context.Canceled)
	if failed && !stopped {
		r.m.failures.Add(context.Background(), 1, r.m.attrs)
	}
	r.recordPublishHealth(res.Err, ack, failed, stopped, r.clock.Now().Add(-took))
	var fatal error
	if r.opts.MaxPublishDuration > 0 && took > r.opts.MaxPublishDuration {
		fatal = fmt.Errorf("relay: bucket %d: publish took %v, more than Options.MaxPublishDuration %v: %w", bk.id, took, r.opts.MaxPublishDuration, ErrMisconfigured)
	}
	if ack > 0 {
		if !bk.owned() {
			return fatal // a peer may own the rows now: mark nothing
		}
		// One delete per bucket at a time bounds what a crash republishes.
		if err := bk.settleDelete(ctx); err != nil {
			bk.unmarked = append(bk.unmarked, pub[:ack]...)
			return cmp.Or(fatal, error(errBucket{err}))
		}
		*del = append(*del, &pendingDelete{bk: bk, rows: pub[:ack]})
	}
	switch {
	case fatal != nil:
		return fatal
	case failed && ctx.Err() != nil:
		return nil
	case failed && errors.Is(res.Err, ErrFenced):
		return errBucket{res.Err} // not the row's fault: dropped, no strike, no backoff
	case failed:
		if alone {
			if parked, err := bk.strike(ctx, pub, ack, res.Err); parked || err != nil {
				return err
			}
		}
		hr, wait := bk.retryLater(nil, true)
		r.repeats.Log(ctx, r.log, r.clock.Now(), "publish", "publish failed; retrying the head row alone", res.Err, "bucket", bk.id, "acknowledged", ack, "batch", len(pub), "attempt", hr.attempts, "backoff", wait)
		return nil
	}
	bk.settled()
	r.logRecovered(ctx, bk.st)
	if f.drained {
		bk.ready = false // a hint or discovery brings it back
	}
	return nil
}

// pendingDelete is a bucket's part of a running delete, beside its next fetch and publish.
type pendingDelete struct {
	bk   *bucket
	rows []*outbox.Message
	*deleteCall
}

type deleteCall struct {
	done  chan struct{} // closed when the delete returned
	err   error
	group bool // of several buckets
}

// startDelete deletes del's rows in one call on a goroutine; one runs per bucket at most.
func (r *Relay) startDelete(ctx, cleanup context.Context, st *runState, del []*pendingDelete, logBatch func(time.Duration)) {
	call := &deleteCall{done: make(chan struct{}), group: len(del) > 1}
	rows := make([][]*outbox.Message, len(del))
	for i, d := range del {
		d.deleteCall, d.bk.deleting, rows[i] = call, d, d.rows
		st.mu.Lock()
		st.deleting[d.bk.id] = struct{}{}
		st.mu.Unlock()
	}
	r.deletes <- struct{}{}
	go func() {
		defer func() { <-r.deletes; close(call.done) }()
		failpoint("relay/during-delete")
		start := r.clock.Now()
		call.err = r.store.MarkPublished(cleanup, slices.Concat(rows...))
		if call.err == nil && r.log.Enabled(ctx, slog.LevelDebug) {
			logBatch(r.clock.Now().Sub(start))
		}
	}()
}

// deletingRows returns the rows whose delete still runs; a finished one is settled.
func (bk *bucket) deletingRows(ctx context.Context) []*outbox.Message {
	d := bk.deleting
	if d == nil {
		return nil
	}
	select {
	case <-d.done:
		_ = bk.settleDelete(ctx) // a failed one's rows are deleted again before the fetch
		return nil
	default:
		return d.rows
	}
}

// settleDelete waits for the running delete; a failed one's rows are deleted again before the next fetch.
func (bk *bucket) settleDelete(ctx context.Context) error {
	d := bk.deleting
	if d == nil {
		return nil
	}
	<-d.done
	bk.deleting = nil
	bk.st.mu.Lock()
	delete(bk.st.deleting, bk.id)
	bk.st.mu.Unlock()
	switch {
	case d.err == nil:
		return nil
	case ctx.Err() != nil:
		bk.r.log.WarnContext(ctx, "mark published failed during the stop; the next owner republishes the rows", "bucket", bk.id, "rows", len(d.rows), "error", d.err)
		return nil
	case !bk.owned():
		return nil // the next owner republishes them
	}
	bk.unmarked = append(bk.unmarked, d.rows...)
	if d.group { // whose fault is not known: each deletes its rows alone next, at once
		bk.alone, bk.ready = true, true
		return nil
	}
	return fmt.Errorf("relay: bucket %d: mark published: %w", bk.id, d.err)
}

// awaitDeletes settles every running delete once the sweep's workers returned.
func (r *Relay) awaitDeletes(ctx context.Context, st *runState) {
	st.mu.Lock()
	bs := slices.Collect(maps.Keys(st.deleting))
	st.mu.Unlock()
	for _, b := range bs {
		if err := st.b[b].settleDelete(ctx); err != nil {
			st.b[b].failed(err)
			st.b[b].ready = true
		}
	}
}

func (bk *bucket) retryLater(storeErr error, published bool) (*headRetry, time.Duration) {
	now := bk.r.clock.Now()
	bk.st.mu.Lock()
	defer bk.st.mu.Unlock()
	hr := bk.retry
	if hr == nil {
		hr = &headRetry{since: now}
		bk.retry = hr
		bk.st.retrying[bk.id] = struct{}{}
	}
	hr.attempts++
	wait := bk.r.backoff(hr.attempts)
	hr.notBefore = now.Add(wait)
	hr.storeErr = storeErr
	hr.published = hr.published || published
	return hr, wait
}

// backoff is ErrorBackoff doubling per attempt up to LeaseRenewInterval, jittered in [d/2, d].
func (r *Relay) backoff(attempt int) time.Duration {
	d := r.opts.ErrorBackoff
	for i := 1; i < attempt && d < r.opts.LeaseRenewInterval; i++ {
		d *= 2
	}
	d = min(d, r.opts.LeaseRenewInterval)
	half := d / 2
	return half + time.Duration(r.rng.Int64N(int64(d-half)+1))
}

// failed backs the bucket off after its own store error, or drops it (ErrFenced, ErrLeaseLost).
func (bk *bucket) failed(err error) {
	if cur, _, _ := bk.st.lease.snapshot(); !containsSorted(cur, bk.id) {
		return // lost meanwhile: its state is forgotten
	}
	if errors.Is(err, ErrFenced) {
		bk.drop(err, true)
		return
	}
	if errors.Is(err, ErrLeaseLost) {
		bk.drop(err, false)
		return
	}
	r := bk.r
	hr, wait := bk.retryLater(err, false)
	r.repeats.Log(context.Background(), r.log, r.clock.Now(), "bucket store", "bucket store error; backing off this bucket, the others go on", err, "bucket", bk.id, "attempt", hr.attempts, "backoff", wait, "failing_for", r.clock.Now().Sub(hr.since))
}

// drop drops the bucket from the lease set until the next round, within ErrorBackoff.
func (bk *bucket) drop(cause error, atBroker bool) {
	r, st := bk.r, bk.st
	st.lease.mu.Lock()
	i := slices.Index(st.lease.buckets, bk.id)
	if i < 0 {
		st.lease.mu.Unlock()
		return
	}
	// A new slice: snapshots of the old one stay as they were.
	buckets := slices.Delete(slices.Clone(st.lease.buckets), i, i+1)
	st.lease.buckets = buckets
	validUntil := st.lease.validUntil
	st.lease.mu.Unlock()

	bk.forget()
	st.nextRebalance = earliest(st.nextRebalance, r.clock.Now().Add(r.opts.ErrorBackoff))
	if atBroker {
		r.m.fenced.Add(context.Background(), 1, r.m.attrs)
		r.log.Warn("bucket fenced at the broker; dropped until the next acquisition round", "bucket", bk.id, "error", cause)
	} else {
		r.log.Warn("bucket's lease lost at the store; dropped until the next acquisition round", "bucket", bk.id, "error", cause)
	}
	r.noteStuck(st)
	r.publishOwnership(buckets, validUntil)
}

func without(batch, excl []*outbox.Message) []*outbox.Message {
	if len(excl) == 0 {
		return batch
	}
	ids := make(map[int64]struct{}, len(excl))
	for _, m := range excl {
		ids[m.ID] = struct{}{}
	}
	return slices.DeleteFunc(batch, func(m *outbox.Message) bool {
		_, ok := ids[m.ID]
		return ok
	})
}
