package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox"
)

const (
	maxGroup      = 64   // buckets of a group read by heads: heads one statement reads
	maxOrdered    = 1024 // buckets of a group read in order; beyond, groups are read by heads
	discoveryRest = 3    // a slow discovery rests this many times its duration
)

// scheduler is one sweep's state: it hands the ready buckets, round robin,
// a group at a time, to up to workers goroutines running serve, and runs
// discovery and the fleet check beside them.
type scheduler struct {
	r                     *Relay
	st                    *runState
	ctx                   context.Context
	owned, queue          []int // queue: buckets to serve, in turn
	workers, running      int
	firstPass, dispatched int  // firstPass: buckets sweepable at the start, each served first
	discovering, checking bool // a discovery, a fleet check runs
	fatal                 error
	busy, hinted, queued  map[int]bool // hinted: while being served
	done                  chan groupDone
	found                 chan discovered
	fleet                 chan int
}

type groupDone struct {
	buckets []int
	errs    []error
}

// discovered is the outcome of a discovery run beside the batches.
type discovered struct {
	pending []int
	err     error
	began   time.Time
	all     bool // every owned bucket was probed (none was waiting, ready)
}

// sweep serves the ready buckets, and those hints and discoveries make
// ready meanwhile, until none is left, the rebalance is due, a fatal error,
// a stop or an invalid lease set; it returns once every goroutine has.
func (r *Relay) sweep(ctx, cleanup context.Context, st *runState, owned []int) error {
	defer r.awaitDeletes(ctx, st) // after every worker returned
	s := &scheduler{r: r, st: st, ctx: ctx, owned: owned, workers: r.sweepWorkers(len(owned)),
		busy: make(map[int]bool, r.workers), hinted: make(map[int]bool, r.workers),
		queue: make([]int, 0, len(owned)), queued: make(map[int]bool, len(owned)),
		done: make(chan groupDone), found: make(chan discovered, 1), fleet: make(chan int, 1)}
	for _, b := range owned {
		s.enqueue(b)
		if st.b[b].sweepable(r.clock.Now()) {
			s.firstPass++
		}
	}
	for {
		s.dispatch(cleanup)
		if s.running == 0 && !s.discovering && !s.checking {
			break
		}
		st.serving = s.running
		s.wait()
	}
	for b := range s.hinted {
		st.b[b].ready = st.b[b].owned()
	}
	if s.fatal != nil {
		return s.fatal
	}
	r.checkLease(st)
	return nil
}

func (s *scheduler) enqueue(b int) {
	if !s.queued[b] {
		s.queued[b] = true
		s.queue = append(s.queue, b)
	}
}

func (s *scheduler) readied(b int) {
	switch {
	case !s.st.b[b].owned(): // dropped meanwhile: a round grants it again
	case s.busy[b]:
		s.hinted[b] = true // its worker may be clearing ready
	default:
		s.st.b[b].ready = true
		s.enqueue(b)
	}
}

func (s *scheduler) dispatching() bool {
	return s.fatal == nil && s.ctx.Err() == nil && s.r.leaseValid(s.st) && s.r.clock.Now().Before(s.st.nextRebalance)
}

// dispatch starts a discovery and a fleet check when due, and a worker per free slot.
func (s *scheduler) dispatch(cleanup context.Context) {
	r, st, ctx := s.r, s.st, s.ctx
	if !s.discovering && s.dispatching() {
		s.discovering = r.discover(ctx, st, s.owned, s.busy, s.dispatched < s.firstPass, s.found)
	}
	if now := r.clock.Now(); !s.checking && s.dispatching() && !now.Before(st.nextFleetCheck) {
		s.checking = true
		st.nextFleetCheck = now.Add(r.opts.PollInterval)
		go func() { s.fleet <- r.liveRelays(ctx) }()
	}
	for s.running < s.workers && s.dispatching() {
		ordered := r.readsInOrder(len(s.queue))
		group := s.nextGroup(r.groupSize(len(s.queue), s.workers, ordered), ordered)
		if len(group) == 0 {
			break
		}
		s.running++
		s.dispatched += len(group)
		for _, b := range group {
			s.busy[b] = true
		}
		go func() { s.done <- groupDone{group, r.serve(ctx, cleanup, st, group, ordered)} }()
	}
}

func (s *scheduler) wait() {
	r, st := s.r, s.st
	select {
	case d := <-s.done:
		s.running--
		st.serving = s.running
		for i, b := range d.buckets {
			delete(s.busy, b)
			var be errBucket
			switch err := d.errs[i]; {
			case errors.As(err, &be):
				if s.ctx.Err() == nil {
					st.b[b].failed(be.err)
				}
			case err != nil && s.fatal == nil:
				s.fatal = err
			}
			if s.hinted[b] {
				delete(s.hinted, b)
				s.readied(b)
			} else if st.b[b].ready {
				s.enqueue(b)
			}
		}
		r.noteStuck(st)
	case n := <-s.fleet:
		s.checking = false
		r.fleetChecked(st, n)
	case d := <-s.found:
		s.discovering = false
		for _, b := range r.discoveredBuckets(s.ctx, st, d) {
			s.readied(b)
		}
	case <-r.notifier.wake:
		r.takeHints(st, s.readied)
	}
}

// discover starts a discovery of the buckets not waiting for a batch, when hinted or due.
func (r *Relay) discover(ctx context.Context, st *runState, owned []int, busy map[int]bool, firstPass bool, found chan<- discovered) bool {
	now := r.clock.Now()
	if !st.discover && (firstPass || now.Before(st.nextDiscovery)) {
		return false
	}
	st.discover = false
	st.nextDiscovery = now.Add(r.opts.PollInterval)
	probe := slices.DeleteFunc(slices.Clone(owned), func(b int) bool { return !busy[b] && st.b[b].ready })
	if !slices.ContainsFunc(probe, func(b int) bool { return !busy[b] }) {
		return false // every bucket is busy or waiting for a batch
	}
	all := len(probe) == len(owned)
	st.worked.Store(true)
	go func() {
		pending, err := r.store.BucketsWithPending(ctx, probe)
		found <- discovered{pending, err, now, all}
	}()
	return true
}

// discoveredBuckets records a discovery's outcome and returns the buckets it found.
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
	// A slow discovery takes at most a quarter of the relay's time.
	if end := r.clock.Now(); end.Sub(d.began)*(discoveryRest+1) > r.opts.PollInterval {
		st.nextDiscovery = end.Add(end.Sub(d.began) * discoveryRest)
	}
	r.repeats.LogRecovered(ctx, r.log, r.clock.Now(), "cycle", "store answers again")
	if len(d.pending) == 0 && d.all {
		r.backlogLooksDrained()
	}
	return d.pending
}

// sweepWorkers is how many groups a sweep serves at once (see Options.MaxConcurrentBuckets).
func (r *Relay) sweepWorkers(owned int) int {
	if !r.scaled {
		return r.workers
	}
	fleet := outbox.DefaultBucketCount * owned
	return min(r.workers, max(1, (fleet+r.opts.BucketCount-1)/r.opts.BucketCount))
}

func (r *Relay) readsInOrder(queued int) bool {
	return r.opts.SingleWriter && queued <= maxOrdered
}

// groupSize is an equal share of the queued buckets; read by heads, at most maxGroup and BatchSize.
func (r *Relay) groupSize(queued, workers int, ordered bool) int {
	if ordered {
		return max(1, queued)
	}
	each := max(1, (queued+workers-1)/workers)
	return min(maxGroup, r.opts.BatchSize, each)
}

// nextGroup takes the next group from the queue; skipped buckets keep their place.
func (s *scheduler) nextGroup(size int, ordered bool) []int {
	r, st, q := s.r, s.st, s.queue
	var group []int
	kept := q[:0] // written behind the reading index
	equal := max(1, r.opts.BatchSize/size)
	used := 0 // rows of BatchSize the group's shares take
	i := 0
	for ; i < len(q) && len(group) < size && (ordered || used < r.opts.BatchSize); i++ {
		b, bk := q[i], &st.b[q[i]]
		rows := cmp.Or(bk.share, equal)
		switch {
		case !s.busy[b] && bk.sweepable(r.clock.Now()) && (len(group) == 0 || bk.groupable(ordered) && (ordered || used+rows <= r.opts.BatchSize)):
			delete(s.queued, b)
			group = append(group, b)
			used += rows
			if !bk.groupable(ordered) {
				size = 1
			}
		case s.busy[b] || bk.ready:
			kept = append(kept, b)
		default:
			delete(s.queued, b)
		}
	}
	if len(kept) == 0 {
		s.queue = q[i:] // the usual case: no copy of the queue per dispatch
	} else {
		s.queue = append(kept, q[i:]...)
	}
	return group
}
