package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	fp "github.com/gorm-outbox/outbox/internal/failpoint"
	"github.com/gorm-outbox/outbox/internal/logrepeat"
)

// Relay publishes the pending rows of the buckets it leases (New, Run).
type Relay struct {
	store    Store
	pub      Publisher
	workers  int  // groups served at once: MaxConcurrentBuckets, 1 with SingleWriter
	scaled   bool // MaxConcurrentBuckets left at its default (see sweepWorkers)
	opts     Options
	clock    Clock
	log      *slog.Logger
	repeats  *logrepeat.Limiter // bounds the lines of failures the relay retries
	notifier *Notifier
	// New created the notifier; Relay.Notifier handed it out; Run logged
	// that no commit can wake the relay.
	ownNotifier                bool
	notifierTaken, pollNoticed atomic.Bool
	m                          *instruments
	rng                        *rand.Rand // jitter; under runState.mu only

	running atomic.Bool
	health  atomic.Pointer[error]          // the latest cycle's error; nil: it succeeded
	authErr atomic.Pointer[error]          // the publisher cannot authenticate; nil since an acknowledgement
	pubFail atomic.Pointer[publishFailing] // every publish since pubFail.since failed; nil: none is retried

	// State read by gauges and the sampler; UnixNano times, 0: none.
	ownedCount   atomic.Int64
	zeroUntil    atomic.Int64 // validity of the bucket-0 lease
	pending      atomic.Pointer[pendingSample]
	resample     chan struct{} // wakes the backlog sampler before MetricsInterval ends
	stuckSince   atomic.Int64  // the first failure of the longest-failing head row
	clockWarned  bool          // the clock offset warning is logged, not yet re-armed; the loop only
	publishSince atomic.Int64  // the start of the oldest Publish in flight
	inflight     inflightPublishes
	deletes      chan struct{} // a token per running MarkPublished: statements in flight stay 2×workers + the lease upkeep
	phase        atomic.Int32  // the loop's phase (phaseWorking, …), read by renewLoop
	kick         chan struct{} // wakes renewLoop: the leases or the loop's phase changed
	unowned      atomic.Int64  // buckets without a live owner after the latest round; -1: no round yet
	unownedSince atomic.Int64  // the first of the latest rounds reporting unowned buckets
	onIdle       func()        // test hook: called when Run starts an idle wait
}

// New returns a relay publishing store's rows with pub. An invalid option
// or a Notifier already attached to another relay is an error naming the
// cause; a BucketCount disagreeing with the store's wraps ErrMisconfigured.
func New(store Store, pub Publisher, opts Options) (*Relay, error) {
	if store == nil {
		return nil, errors.New("relay: nil Store")
	}
	if pub == nil {
		return nil, errors.New("relay: nil Publisher")
	}
	o, err := opts.withDefaults(store)
	if err != nil {
		return nil, err
	}
	m, err := newInstruments(o.MeterProvider, o.MetricsName)
	if err != nil {
		return nil, fmt.Errorf("relay: create instruments: %w", err)
	}
	n := o.Notifier
	if n == nil {
		n = NewNotifier()
	}
	if !n.attach(o.BucketCount) {
		return nil, errors.New("relay: Options.Notifier is already attached to another relay")
	}
	if o.HintTransport != nil {
		n.sending.Store(true)
	}
	h := fnv.New64a()
	h.Write([]byte(o.RelayID))
	r := &Relay{store: store, pub: pub, opts: o, clock: o.Clock, notifier: n, ownNotifier: o.Notifier == nil, m: m,
		log:     o.Logger.With("relay", o.RelayID, "outbox", o.MetricsName), // said once, on every line
		repeats: logrepeat.New(logrepeat.Interval),
		rng:     rand.New(rand.NewPCG(h.Sum64(), 0x6f7574626f78)),
		kick:    make(chan struct{}, 1), resample: make(chan struct{}, 1)}
	// Serial writes (SQLite): one worker, a delete per bucket may queue.
	r.workers, r.deletes = 1, make(chan struct{}, o.BucketCount)
	if !o.SingleWriter {
		r.workers, r.deletes = o.MaxConcurrentBuckets, make(chan struct{}, o.MaxConcurrentBuckets)
		r.scaled = opts.MaxConcurrentBuckets == 0
	}
	for _, reason := range []string{ParkReasonUnpublishable, ParkReasonFailure, ParkReasonCorrupt, ParkReasonHeld} {
		m.countParked(reason, 0) // every series exists from the start
	}
	return r, nil
}

// ID returns the relay id used in the lease table.
func (r *Relay) ID() string { return r.opts.RelayID }

// Notifier returns the relay's notifier: Options.Notifier or the one New
// created. Pass it to outbox.Plugin so commits wake the relay.
func (r *Relay) Notifier() *Notifier {
	r.notifierTaken.Store(true)
	return r.notifier
}

// runState is one Run's state; the lease set is shared with renewLoop, b[i] with its worker.
type runState struct {
	lease                                        leaseSet
	attempted                                    bool // an acquisition was attempted: release on stop
	nextRebalance, nextDiscovery, nextFleetCheck time.Time
	relays                                       int  // live relays the latest round counted (0: none yet)
	discover                                     bool // discovery forced by new buckets or an unknown hint
	hints                                        []int
	worked                                       atomic.Bool      // the cycle called the store
	acquireErr, discoverErr                      error            // the latest ones; nil after a success
	b                                            []bucket         // BucketCount of them
	serving                                      int              // workers of a sweep running; the loop only
	mu                                           sync.Mutex       // guards bucket.retry, retrying and deleting
	retrying, deleting                           map[int]struct{} // the buckets whose retry is set, whose delete runs
}

func (r *Relay) newRunState() *runState {
	st := &runState{b: make([]bucket, r.opts.BucketCount), retrying: map[int]struct{}{}, deleting: map[int]struct{}{}}
	for i := range st.b {
		st.b[i] = bucket{id: i, r: r, st: st}
	}
	return st
}

// Run publishes until ctx is done, then stops within Options.StopTimeout:
// it awaits the in-flight publishes, deletes their acknowledged prefixes
// and releases the leases. It returns nil or a fatal error wrapping
// ErrMisconfigured, after every goroutine it started has exited. A second
// concurrent Run of a relay is an error.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run called while the relay is already running")
	}
	defer r.running.Store(false)
	r.log.InfoContext(ctx, "starting", "buckets", r.opts.BucketCount)
	if r.ownNotifier && r.opts.HintTransport == nil && !r.notifierTaken.Load() && r.pollNoticed.CompareAndSwap(false, true) {
		r.log.InfoContext(ctx, "no notifier wired, so commits are found by polling every poll_interval; for commits to wake the relay, pass one relay.NewNotifier() to outbox.Plugin and to Options.Notifier, or set Options.HintTransport (package pgnotify; the outbox-relay worker: -notify-postgres-dsn) when the writers run in other processes",
			"poll_interval", r.opts.PollInterval)
	}
	r.m.exportCounters(ctx)
	reg, err := r.registerGauges()
	if err != nil {
		err = fmt.Errorf("relay: register gauges: %w", err)
		r.log.ErrorContext(ctx, "cannot start", "error", err)
		return err
	}
	defer func() { _ = reg.Unregister() }()
	defer r.startAux(ctx)()
	if err := r.work(ctx); err != nil {
		r.log.ErrorContext(ctx, "stopped by a fatal error", "error", err)
		return err
	}
	r.log.InfoContext(ctx, "stopped")
	return nil
}

// startAux starts the backlog sampler and the hint transport; stop ends them.
func (r *Relay) startAux(ctx context.Context) (stop func()) {
	var wg, twg sync.WaitGroup
	sctx, cancelSampler := context.WithCancel(ctx)
	if r.opts.MetricsBacklog {
		wg.Go(func() { r.sampleBacklog(sctx) })
	}
	tctx, cancelTransport := context.WithCancel(ctx)
	if r.opts.HintTransport != nil {
		twg.Add(2) // sender and listener
		go r.runTransport(tctx, twg.Done)
	}
	return func() {
		cancelTransport()
		twg.Wait()
		r.pending.Store(nil)
		cancelSampler()
		wg.Wait()
	}
}

// work runs the loop and the renewal, then stops: cleanup carries the publishes and deletes.
func (r *Relay) work(ctx context.Context) error {
	stopping, beginStop := context.WithCancel(ctx)
	defer beginStop()
	cleanup, cancelCleanup := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelCleanup()
	release, cancelRelease := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRelease()
	stopped := make(chan struct{})
	var bwg, rwg sync.WaitGroup
	bwg.Go(func() { r.runStopBudget(stopping, stopped, cancelCleanup, cancelRelease) })

	r.health.Store(&errNoCycle)
	r.authErr.Store(nil)
	r.pubFail.Store(nil)
	r.unowned.Store(-1)
	r.unownedSince.Store(0)
	st := r.newRunState()
	st.nextRebalance = r.clock.Now()
	r.phase.Store(phaseWorking)
	// Renewal keeps the leases while a stop awaits the publishes.
	renewing, stopRenewing := context.WithCancel(cleanup)
	defer stopRenewing()
	rwg.Go(func() { r.renewLoop(renewing, st) })
	err := r.loop(ctx, cleanup, st)
	beginStop() // a fatal error starts the stop too
	stopRenewing()
	rwg.Wait()
	r.stop(release, st)
	close(stopped)
	bwg.Wait()
	return err
}

// runStopBudget cancels cleanup at three quarters of StopTimeout, release at its end.
func (r *Relay) runStopBudget(stopping context.Context, stopped <-chan struct{}, cancelCleanup, cancelRelease context.CancelFunc) {
	select {
	case <-stopped:
		return
	case <-stopping.Done():
	}
	deadline := r.clock.Now().Add(r.opts.StopTimeout)
	steps := []struct {
		at     time.Time
		cancel context.CancelFunc
	}{
		{deadline.Add(-r.opts.StopTimeout / 4), cancelCleanup}, // a quarter is kept for the release
		{deadline, cancelRelease},
	}
	for _, step := range steps {
		tc, stop := r.clock.NewTimer(step.at.Sub(r.clock.Now()))
		select {
		case <-stopped:
			stop()
			return
		case <-tc:
			step.cancel()
		}
	}
	<-stopped
}

func (r *Relay) stop(release context.Context, st *runState) {
	r.setLeases(st, nil, time.Time{})
	if !st.attempted {
		return
	}
	if err := r.store.ReleaseBucketLeases(release, r.opts.RelayID); err != nil {
		r.log.WarnContext(release, "release leases failed; peers take over when they expire", "error", err)
	}
}

func (r *Relay) loop(ctx, cleanup context.Context, st *runState) error {
	for ctx.Err() == nil {
		start := r.clock.Now()
		st.worked.Store(false)
		err := r.cycle(ctx, cleanup, st)
		switch {
		case err == nil && (st.acquireErr != nil || st.discoverErr != nil):
			r.recordHealth(ctx, cmp.Or(st.acquireErr, st.discoverErr)) // work goes on, unhealthy
		case err == nil:
			r.recordHealth(ctx, r.everyBucketFailing(st))
		default:
			r.recordHealth(ctx, err)
		}
		if st.worked.Load() {
			r.m.cycleDur.Record(context.Background(), r.clock.Now().Sub(start).Seconds(), r.m.attrs)
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return err
		case !r.eligible(st, r.clock.Now()):
			r.idle(ctx, st)
		}
	}
	return nil
}

func (r *Relay) cycle(ctx, cleanup context.Context, st *runState) error {
	if now := r.clock.Now(); !now.Before(st.nextFleetCheck) && now.Before(st.nextRebalance) {
		st.nextFleetCheck = now.Add(r.opts.PollInterval)
		r.fleetChecked(st, r.liveRelays(ctx))
	}
	if !r.clock.Now().Before(st.nextRebalance) {
		r.setPhase(phaseAcquiring)
		err := r.acquire(ctx, st)
		r.setPhase(phaseWorking)
		if err != nil {
			return err
		}
		r.checkClockOffset()
		if ctx.Err() != nil {
			return nil
		}
	}
	r.setPhase(phaseWorking)
	r.checkLease(st)
	owned, _, _ := st.lease.snapshot()
	r.takeHints(st, func(b int) {
		if containsSorted(owned, b) {
			st.b[b].ready = true
		}
	})
	if len(owned) == 0 {
		return nil
	}
	return r.sweep(ctx, cleanup, st, owned)
}

// takeHints hands each hinted bucket to ready; an unknown one forces a discovery.
func (r *Relay) takeHints(st *runState, ready func(b int)) {
	var unknown bool
	st.hints, unknown = r.notifier.take(st.hints[:0])
	for _, b := range st.hints {
		ready(b)
	}
	if unknown {
		st.discover = true
	}
}

// checkClockOffset warns once when the host clock is off the store's beyond the threshold.
func (r *Relay) checkClockOffset() {
	off, unc, ok := r.store.ClockOffset()
	if !ok {
		return
	}
	abs := off.Abs()
	switch {
	case !r.clockWarned && abs-unc.Abs() > ClockOffsetWarnThreshold:
		r.clockWarned = true
		r.log.Warn("this host's clock is off from the database's; leases do not depend on it (they run on the database's clock), but created_at (stamped by the writers' hosts) and the backlog ages measured from it on this host do: synchronise the host clocks (NTP)",
			"offset", off, "uncertainty", unc, "threshold", ClockOffsetWarnThreshold)
	case r.clockWarned && abs <= ClockOffsetWarnThreshold:
		r.clockWarned = false
		r.log.Info("this host's clock is back within the threshold of the database's", "offset", off, "threshold", ClockOffsetWarnThreshold)
	}
}

// logRecovered logs the end of failures once no bucket retries one.
func (r *Relay) logRecovered(ctx context.Context, st *runState) {
	var publish, store bool
	st.mu.Lock()
	for b := range st.retrying {
		publish = publish || st.b[b].retry.published
		store = store || st.b[b].retry.storeErr != nil
	}
	st.mu.Unlock()
	now := r.clock.Now()
	if !publish {
		r.repeats.LogRecovered(ctx, r.log, now, "publish", "publishing succeeds again")
	}
	if !store {
		r.repeats.LogRecovered(ctx, r.log, now, "bucket store", "bucket store succeeds again")
	}
}

// everyBucketFailing is Health's error when every owned bucket backs off from a store error.
func (r *Relay) everyBucketFailing(st *runState) error {
	owned, _, _ := st.lease.snapshot()
	if len(owned) == 0 {
		return nil
	}
	for _, b := range owned {
		if hr := st.b[b].retry; hr == nil || hr.storeErr == nil {
			return nil
		}
	}
	return fmt.Errorf("relay: the store fails for every owned bucket (%d); bucket %d: %w", len(owned), owned[0], st.b[owned[0]].retry.storeErr)
}

// noteStuck caches when the longest-failing head row first failed.
func (r *Relay) noteStuck(st *runState) {
	var oldest int64 // UnixNano; 0: none
	publishing := false
	st.mu.Lock()
	for b := range st.retrying {
		hr := st.b[b].retry
		if n := hr.since.UnixNano(); oldest == 0 || n < oldest {
			oldest = n
		}
		publishing = publishing || hr.published
	}
	st.mu.Unlock()
	if !publishing && st.serving == 0 { // a running worker may not have recorded its retry yet
		r.pubFail.Store(nil)
	}
	r.stuckSince.Store(oldest)
}

func (r *Relay) eligible(st *runState, now time.Time) bool {
	if !now.Before(st.nextRebalance) || !now.Before(st.nextFleetCheck) {
		return true
	}
	owned, _, _ := st.lease.snapshot()
	return slices.ContainsFunc(owned, func(b int) bool { return st.b[b].sweepable(now) })
}

func (r *Relay) idle(ctx context.Context, st *runState) {
	now := r.clock.Now()
	deadline := earliest(st.nextRebalance, st.nextFleetCheck)
	if owned, _, _ := st.lease.snapshot(); len(owned) > 0 {
		deadline = earliest(deadline, st.nextDiscovery)
		for _, b := range owned {
			if hr := st.b[b].retry; st.b[b].ready && hr != nil {
				deadline = earliest(deadline, hr.notBefore)
			}
		}
	}
	tc, stop := r.clock.NewTimer(deadline.Sub(now))
	defer stop()
	r.setPhase(phaseIdle) // the wait ends by the rebalance: see renewLoop
	if r.onIdle != nil {
		r.onIdle() // once the timer is set: a test may move the clock now
	}
	select {
	case <-ctx.Done():
	case <-tc:
	case <-r.notifier.wake:
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func containsSorted(s []int, v int) bool {
	_, ok := slices.BinarySearch(s, v)
	return ok
}

// failpoint marks where a crash test can stop the process (-tags outbox_failpoints).
func failpoint(name string) { fp.Inject(name) }
