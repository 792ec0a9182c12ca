package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
)

// inflightPublishes keeps Relay.publishSince at the start of the oldest
// Publish call in flight (one per bucket being served), for the stalled
// gauge.
type inflightPublishes struct {
	mu     sync.Mutex
	next   uint64
	starts map[uint64]time.Time
}

// begin records a publish started at start and returns its token for end.
func (p *inflightPublishes) begin(r *Relay, start time.Time) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	p.set(r, p.next, start)
	return p.next
}

// end forgets the publish of token.
func (p *inflightPublishes) end(r *Relay, token uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.set(r, token, time.Time{})
}

// set records token's start (zero: forgets it) and stores the oldest.
func (p *inflightPublishes) set(r *Relay, token uint64, start time.Time) {
	if p.starts == nil {
		p.starts = map[uint64]time.Time{}
	}
	if start.IsZero() {
		delete(p.starts, token)
	} else {
		p.starts[token] = start
	}
	var oldest int64 // UnixNano; 0: none
	for _, t := range p.starts {
		if n := t.UnixNano(); oldest == 0 || n < oldest {
			oldest = n
		}
	}
	r.publishSince.Store(oldest)
}

// groupDone is the outcome of a worker's batches in a sweep: errs[i] is
// buckets[i]'s.
type groupDone struct {
	buckets []int
	errs    []error
}

// discovered is the outcome of a discovery a sweep ran beside its batches.
type discovered struct {
	pending []int
	err     error
	began   time.Time
	all     bool // every owned bucket was probed (none was waiting, ready)
}

// sweep publishes batches of the ready buckets, round robin, up to
// r.workers buckets (or groups of shallow buckets) at once, each on a
// worker goroutine running serve: a free slot goes to the next ready
// bucket at once, and hints arriving meanwhile make their buckets ready, so
// a committed row waits for about one batch of its bucket. A discovery, when hinted or (once every bucket
// ready at the start had a batch) due, runs beside the batches on a
// goroutine of its own (discover), and the buckets it finds join the
// queue, so that tens of thousands of buckets' probes never stop the
// publishing. The sweep stops dispatching when nothing is left to
// serve, when the rebalance is due, and on a fatal error (returned once
// the workers have), a stop or an invalid lease set. A bucket is served by
// one goroutine at a time, which owns its state meanwhile and checks the
// leases before every change of its rows; the sweep drops an invalid lease
// set, and returns, only once every worker, discovery and delete has.
func (r *Relay) sweep(ctx, cleanup context.Context, st *runState, owned []int) error {
	defer r.awaitDeletes(ctx, st) // after every worker returned
	done := make(chan groupDone)
	found := make(chan discovered, 1)
	running := 0
	discovering := false
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
	ready := func(b int) { // a hint or a discovery found rows in b
		switch {
		case !r.ownsBucket(st, b): // dropped meanwhile (dropFenced): a round grants it again
		case busy[b]:
			hinted[b] = true // its worker may be clearing ready
		default:
			st.b[b].ready = true
			enqueue(b)
		}
	}
	dispatching := func() bool {
		return fatal == nil && ctx.Err() == nil && r.leaseValid(st) && r.clock.Now().Before(st.nextRebalance)
	}
	fleet := make(chan int, 1)
	checking := false // a fleet check runs
	workers := r.sweepWorkers(len(owned))
	for {
		if !discovering && dispatching() {
			discovering = r.discover(ctx, st, owned, busy, dispatched < firstPass, found)
		}
		if now := r.clock.Now(); !checking && dispatching() && !now.Before(st.nextFleetCheck) {
			checking = true
			st.nextFleetCheck = now.Add(r.opts.PollInterval)
			go func() { fleet <- r.liveRelays(ctx) }()
		}
		for running < workers && dispatching() {
			ordered := r.readsInOrder(len(queue))
			group := r.nextGroup(st, &queue, queued, busy, r.groupSize(len(queue), workers, ordered), ordered)
			if len(group) == 0 {
				break
			}
			running++
			dispatched += len(group)
			for _, b := range group {
				busy[b] = true
			}
			go func() { done <- groupDone{group, r.serve(ctx, cleanup, st, group, ordered)} }()
		}
		if running == 0 && !discovering && !checking {
			break
		}
		st.serving = running
		select {
		case d := <-done:
			running--
			st.serving = running
			for i, b := range d.buckets {
				delete(busy, b)
				var be errBucket
				switch err := d.errs[i]; {
				case errors.As(err, &be):
					if ctx.Err() == nil {
						r.bucketFailed(st, b, be.err)
					}
				case err != nil && fatal == nil:
					fatal = err
				}
				if hinted[b] {
					delete(hinted, b)
					ready(b)
				} else if st.b[b].ready {
					enqueue(b)
				}
			}
			r.noteStuck(st)
		case n := <-fleet:
			checking = false
			r.fleetChecked(st, n)
		case d := <-found:
			discovering = false
			for _, b := range r.discoveredBuckets(ctx, st, d) {
				ready(b)
			}
		case <-r.notifier.wake:
			var unknown bool
			st.hints, unknown = r.notifier.take(st.hints[:0])
			for _, b := range st.hints {
				ready(b)
			}
			if unknown {
				st.discover = true // discovered at once, beside the batches
			}
		}
	}
	for b := range hinted {
		st.b[b].ready = r.ownsBucket(st, b)
	}
	if fatal != nil {
		return fatal
	}
	r.checkLease(st)
	return nil
}

// discover starts a discovery of the owned buckets holding rows, on a
// goroutine that sends its outcome to found, when one is hinted
// (st.discover) or due (PollInterval after the previous one began) and
// the sweep is past its first pass (each bucket ready at its start had a
// batch: the walk of tens of thousands of buckets would slow the batches
// of a backlog the relay already knows), and reports whether it did. None
// runs while every owned bucket is ready or busy. It probes only the
// buckets that are not waiting, ready, for a batch (those being served and
// those not ready): a waiting bucket's next batch starts after the
// discovery, so it reads every row committed before. In a drain of
// hundreds of buckets, the heads of the waiting ones are where the
// deleted rows' index entries lie, which each probe would walk again.
func (r *Relay) discover(ctx context.Context, st *runState, owned []int, busy map[int]bool, firstPass bool, found chan<- discovered) bool {
	now := r.clock.Now()
	if !st.discover && (firstPass || now.Before(st.nextDiscovery)) {
		return false
	}
	st.discover = false
	st.nextDiscovery = now.Add(r.opts.PollInterval)
	if !slices.ContainsFunc(owned, func(b int) bool { return !busy[b] && !st.b[b].ready }) {
		return false
	}
	waiting := func(b int) bool { return !busy[b] && st.b[b].ready }
	probe := owned
	if slices.ContainsFunc(owned, waiting) {
		probe = slices.DeleteFunc(slices.Clone(owned), waiting)
	}
	all := len(probe) == len(owned)
	st.worked.Store(true)
	go func() {
		pending, err := r.store.BucketsWithPending(ctx, probe)
		found <- discovered{pending, err, now, all}
	}()
	return true
}

// discoveredBuckets records the outcome of a discovery and returns the
// buckets it found. A failed one is retried after ErrorBackoff, the buckets
// known to be ready being served meanwhile: a discovery slower than the
// store's statement timeout (a walk over a backlog's dead index entries)
// must not stop the relay.
func (r *Relay) discoveredBuckets(ctx context.Context, st *runState, d discovered) []int {
	if d.err != nil {
		if ctx.Err() == nil {
			r.repeats.Log(ctx, r.log, r.clock.Now(), "cycle", "discovery of pending buckets failed; serving the buckets known to be ready, retrying it after the backoff", d.err, "backoff", r.opts.ErrorBackoff)
			st.discoverErr = fmt.Errorf("relay: discover pending buckets: %w", d.err)
			st.nextDiscovery = r.clock.Now().Add(r.opts.ErrorBackoff)
		}
		return nil
	}
	st.discoverErr = nil
	// A discovery that takes a good part of PollInterval (tens of
	// thousands of buckets: one index probe each) would otherwise run back
	// to back; it rests discoveryRest times as long as it took, so it takes
	// at most a quarter of the relay's time.
	if end := r.clock.Now(); end.Sub(d.began)*(discoveryRest+1) > r.opts.PollInterval {
		st.nextDiscovery = end.Add(end.Sub(d.began) * discoveryRest)
	}
	r.repeats.LogRecovered(ctx, r.log, r.clock.Now(), "cycle", "store answers again")
	if len(d.pending) == 0 && d.all {
		r.backlogLooksDrained()
	}
	return d.pending
}

// sweepWorkers is how many buckets (or groups) a sweep over owned buckets
// serves at once: r.workers, and with MaxConcurrentBuckets left at its
// default no more than the relay's part of what a fleet on the default
// outbox.DefaultBucketCount buckets serves, ⌈8 × owned ÷ BucketCount⌉, so
// that the fleet's batches against the database do not multiply with the
// bucket count (four relays on 1,024 buckets: two each, as on 8 buckets).
func (r *Relay) sweepWorkers(owned int) int {
	if !r.scaled {
		return r.workers
	}
	fleet := outbox.DefaultBucketCount * owned
	return min(r.workers, max(1, (fleet+r.opts.BucketCount-1)/r.opts.BucketCount))
}

// nextGroup removes from the queue, and returns, its first bucket that is
// sweepable and not busy, and, when that bucket is groupable, the next
// such groupable ones whose shares fit in BatchSize (see shares; a bucket
// without one counts BatchSize/size; a group read in order, no share),
// up to size in all; buckets no longer ready leave the queue, and those
// skipped keep their place.
func (r *Relay) nextGroup(st *runState, queue *[]int, queued, busy map[int]bool, size int, ordered bool) []int {
	q := *queue
	var group []int
	kept := q[:0] // written behind the reading index
	equal := max(1, r.opts.BatchSize/size)
	used := 0 // rows of BatchSize the group's shares take
	i := 0
	for ; i < len(q) && len(group) < size && (ordered || used < r.opts.BatchSize); i++ {
		b := q[i]
		rows := cmp.Or(st.b[b].share, equal)
		switch {
		case !busy[b] && st.b[b].ready && r.sweepable(st, b) && (len(group) == 0 || r.groupable(st, b, ordered) && (ordered || used+rows <= r.opts.BatchSize)):
			delete(queued, b)
			group = append(group, b)
			used += rows
			if !r.groupable(st, b, ordered) {
				size = 1
			}
		case busy[b] || st.b[b].ready:
			kept = append(kept, b)
		default:
			delete(queued, b)
		}
	}
	if len(kept) == 0 {
		*queue = q[i:] // the usual case: no copy of the queue per dispatch
	} else {
		*queue = append(kept, q[i:]...)
	}
	return group
}
