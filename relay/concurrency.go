package relay

import (
	"context"
	"errors"
	"sync"
	"time"
)

// inflightPublishes tracks the start times of the Publish calls in flight
// (several when buckets are served concurrently) and keeps
// Relay.publishSince at the oldest one, for the stalled gauge.
type inflightPublishes struct {
	mu     sync.Mutex
	next   uint64
	starts map[uint64]time.Time
}

// begin records a publish started at start and returns its token for end.
func (p *inflightPublishes) begin(r *Relay, start time.Time) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.starts == nil {
		p.starts = map[uint64]time.Time{}
	}
	p.next++
	p.starts[p.next] = start
	p.publishOldestLocked(r)
	return p.next
}

// end forgets the publish of token.
func (p *inflightPublishes) end(r *Relay, token uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.starts, token)
	p.publishOldestLocked(r)
}

func (p *inflightPublishes) publishOldestLocked(r *Relay) {
	var oldest time.Time
	for _, t := range p.starts {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	if oldest.IsZero() {
		r.publishSince.Store(0)
	} else {
		r.publishSince.Store(oldest.UnixNano())
	}
}

// bucketDone is the outcome of one bucket's batch in a concurrent sweep.
type bucketDone struct {
	bucket int
	err    error
}

// sweepConcurrent serves the ready buckets like the sequential sweep, up
// to r.workers at once, each on its own goroutine running drainOnce, but
// without waiting for the slowest of them: a worker's slot goes to the next
// ready bucket as soon as it is free, and the hints that arrive meanwhile
// make their buckets ready at once, so a committed row waits for about one
// batch of its bucket, not for a whole sweep. Buckets are served round
// robin: one that is still ready after its batch queues behind the others.
// The sweep stops dispatching, and returns once its workers have, when
// nothing is left to serve, when the rebalance is due, when a discovery is
// due once every bucket servable at the sweep's start had a batch (the loop
// runs them between sweeps), and on a fatal error, a stop or an invalid
// lease set. The invariants:
//
//   - A bucket is served by at most one goroutine at a time, so at most one
//     of its batches is in flight and its rows go out in order.
//   - That goroutine owns the bucket's state while it runs (see runState);
//     this goroutine (the loop's) handles its outcome (bucketFailed) and
//     the hints for it only after it returned.
//   - Workers check the leases before every change of their rows and never
//     drop them; an invalid lease set stops the dispatch of further
//     buckets, and is dropped here once every worker has returned.
//   - The sweep returns only after every worker has returned: no publish or
//     store call outlives it, so a stop awaits every in-flight publish.
//
// A fatal error (not a bucket's store error) stops the dispatch; it is
// returned once the running workers have returned.
func (r *Relay) sweepConcurrent(ctx, cleanup context.Context, st *runState, owned []int) error {
	defer r.awaitDeletes(ctx, st) // after every worker returned
	done := make(chan bucketDone)
	running := 0
	var fatal error
	busy := make(map[int]bool, r.workers)   // buckets being served
	hinted := make(map[int]bool, r.workers) // hinted while being served
	queue := make([]int, 0, len(owned))     // buckets to serve, in turn
	queued := make(map[int]bool, len(owned))
	enqueue := func(b int) {
		if !queued[b] {
			queued[b] = true
			queue = append(queue, b)
		}
	}
	firstPass := 0 // buckets servable at the start: each gets a batch first
	for _, b := range owned {
		enqueue(b)
		if r.sweepable(st, b) {
			firstPass++
		}
	}
	dispatched := 0
	dispatching := func() bool {
		if fatal != nil || ctx.Err() != nil || !r.leaseValid(st) || st.discover {
			return false
		}
		now := r.clock.Now()
		if !now.Before(st.nextRebalance) {
			return false
		}
		if now.Before(st.nextDiscovery) || dispatched < firstPass {
			// A due discovery waits until every bucket servable at the
			// start had its batch, as in the sequential sweep: a discovery
			// slower than PollInterval (tens of thousands of buckets) is
			// due again as soon as it ends, and must not end every sweep
			// before its first dispatch.
			return true
		}
		for _, b := range owned {
			if !busy[b] && !st.b[b].ready { // a busy bucket's is its worker's
				return false // discovery is due: the loop runs it
			}
		}
		return true
	}
	for {
		for running < r.workers && dispatching() {
			b, ok := r.nextServable(st, &queue, queued, busy)
			if !ok {
				break
			}
			running++
			dispatched++
			busy[b] = true
			go func() {
				done <- bucketDone{b, r.drainOnce(ctx, cleanup, st, b)}
			}()
		}
		if running == 0 {
			break
		}
		st.serving = running
		select {
		case d := <-done:
			running--
			st.serving = running
			delete(busy, d.bucket)
			var be errBucket
			switch {
			case errors.As(d.err, &be):
				if ctx.Err() == nil {
					r.bucketFailed(st, d.bucket, be.err)
				}
			case d.err != nil && fatal == nil:
				fatal = d.err
			}
			if hinted[d.bucket] {
				delete(hinted, d.bucket)
				st.b[d.bucket].ready = true
			}
			if st.b[d.bucket].ready {
				enqueue(d.bucket)
			}
			r.noteStuck(st)
		case <-r.notifier.wake:
			var unknown bool
			st.hints, unknown = r.notifier.take(st.hints[:0])
			for _, b := range st.hints {
				switch {
				case b >= len(st.b) || !containsSorted(owned, b):
				case busy[b]:
					hinted[b] = true // its worker may be clearing ready
				default:
					st.b[b].ready = true
					enqueue(b)
				}
			}
			if unknown {
				st.discover = true // the loop discovers, after this sweep
			}
		}
	}
	for b := range hinted {
		st.b[b].ready = true
	}
	if fatal != nil {
		return fatal
	}
	r.checkLease(st)
	return nil
}

// nextServable removes from the queue, and returns, its first bucket that
// is sweepable and not busy; buckets no longer ready leave the queue, and
// those waiting out a backoff keep their place.
func (r *Relay) nextServable(st *runState, queue *[]int, queued, busy map[int]bool) (int, bool) {
	q := *queue
	for i, b := range q {
		if busy[b] || !st.b[b].ready || !r.sweepable(st, b) {
			continue // dropped below unless it waits
		}
		if i == 0 { // the usual case: no copy of the queue per dispatch
			delete(queued, b)
			*queue = q[1:]
			return b, true
		}
		// Keep the skipped ones that still wait, in order.
		kept := q[:0]
		for _, c := range q[:i] {
			if busy[c] || st.b[c].ready {
				kept = append(kept, c)
			} else {
				delete(queued, c)
			}
		}
		delete(queued, b)
		*queue = append(kept, q[i+1:]...)
		return b, true
	}
	return 0, false
}
