package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// leaseSet is the relay's local view of its leases. validUntil is the
// relay-clock time read before the call that granted them, plus
// LeaseDuration (the store's lease ends later, never earlier). renewLoop
// extends it; the loop replaces it, bumping gen so that a renewal of the
// previous set changes nothing.
type leaseSet struct {
	mu         sync.Mutex
	buckets    []int
	validUntil time.Time
	lost       bool   // a renewal reported the set lost
	gen        uint64 // bumped by every setLeases
}

func (l *leaseSet) snapshot() ([]int, time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buckets, l.validUntil, l.lost
}

// valid reports whether the relay may still act on its leases at now: it
// owns buckets, no renewal reported them lost, and they have not expired.
func (l *leaseSet) valid(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets) > 0 && !l.lost && now.Before(l.validUntil)
}

// acquire runs one acquisition round. A store error wrapping
// ErrMisconfigured is fatal; others are retried after ErrorBackoff. A relay
// granted less than its fair share runs its next round soon.
func (r *Relay) acquire(ctx context.Context, st *runState) error {
	st.attempted = true
	t0 := r.clock.Now()
	l, err := r.store.AcquireBucketLeases(ctx, r.opts.RelayID, r.opts.BucketCount, r.opts.LeaseDuration)
	t1 := r.clock.Now()
	failpoint("relay/acquire")
	st.worked.Store(true)
	if err != nil {
		if errors.Is(err, ErrMisconfigured) {
			return fmt.Errorf("relay: acquire leases: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
		r.repeats.Log(ctx, r.log, r.clock.Now(), "acquire", "acquire leases failed", err)
		st.acquireErr = fmt.Errorf("relay: acquire leases: %w", err)
		st.nextRebalance = t1.Add(r.opts.ErrorBackoff)
		return nil
	}
	st.acquireErr = nil
	r.repeats.LogRecovered(ctx, r.log, r.clock.Now(), "acquire", "acquire leases succeeds again")
	r.repeats.Recovered("renew") // an acquisition renews too
	validUntil := t0.Add(r.opts.LeaseDuration)
	buckets := l.Owned
	if !t1.Before(validUntil) {
		r.log.WarnContext(ctx, "lease acquisition answered after the leases expired", "took", t1.Sub(t0))
		buckets = nil
	}
	buckets = slices.DeleteFunc(slices.Clone(buckets), func(b int) bool { return b < 0 || b >= r.opts.BucketCount })
	slices.Sort(buckets)
	r.setLeases(st, buckets, validUntil)
	st.relays, st.nextFleetCheck = l.Relays, t1.Add(r.opts.PollInterval)
	r.noteUnowned(l.Unowned, t1)
	st.nextRebalance = t0.Add(r.opts.LeaseRenewInterval)
	if len(buckets) < l.Share {
		st.nextRebalance = t1.Add(min(r.opts.PollInterval, r.opts.LeaseRenewInterval) / 4)
	}
	return nil
}

// liveRelays returns the number of live relays (Store.Fleet), -1 when the
// store fails: checked every PollInterval, so that a relay that joined,
// stopped or died makes its peers run an acquisition round at once.
func (r *Relay) liveRelays(ctx context.Context) int {
	f, err := r.store.Fleet(ctx)
	if err != nil {
		return -1
	}
	return f.Relays
}

// fleetChecked makes the next acquisition round due now when the live
// relays (n) differ in number from the latest successful round's.
func (r *Relay) fleetChecked(st *runState, n int) {
	if n >= 0 && st.relays > 0 && n != st.relays && st.acquireErr == nil {
		st.nextRebalance = r.clock.Now()
	}
}

// noteUnowned records a round's count of buckets without a live owner, and
// since when it has been nonzero.
func (r *Relay) noteUnowned(n int, now time.Time) {
	r.unowned.Store(int64(n))
	switch {
	case n == 0:
		r.unownedSince.Store(0)
	case r.unownedSince.Load() == 0:
		r.unownedSince.Store(now.UnixNano())
	}
}

// setLeases replaces the local lease set: gained buckets force a
// discovery, lost ones are forgotten.
func (r *Relay) setLeases(st *runState, buckets []int, validUntil time.Time) {
	old, _, _ := st.lease.snapshot()
	st.lease.mu.Lock()
	st.lease.buckets = buckets
	st.lease.validUntil = validUntil
	st.lease.lost = false
	st.lease.gen++
	st.lease.mu.Unlock()
	r.kickRenewer()
	for _, b := range buckets { // both sorted
		if !containsSorted(old, b) {
			st.discover = true
			st.b[b].strikes = nil
		}
	}
	for _, b := range old {
		if !containsSorted(buckets, b) {
			st.b[b].forget()
		}
	}
	r.noteStuck(st)
	if !slices.Equal(old, buckets) {
		r.log.Info("owned buckets changed", "count", len(buckets), "buckets", bucketRanges(buckets, 16))
	}
	r.publishOwnership(buckets, validUntil)
}

// publishOwnership tells the notifier, the gauges, the backlog sampler and
// the publisher the owned buckets.
func (r *Relay) publishOwnership(buckets []int, validUntil time.Time) {
	r.notifier.setOwned(buckets)
	r.pub.OwnedBuckets(buckets)
	r.ownedCount.Store(int64(len(buckets)))
	if len(buckets) > 0 && buckets[0] == 0 {
		r.zeroUntil.Store(validUntil.UnixNano())
	} else {
		r.zeroUntil.Store(0)
	}
}

// leaseValid reports whether the relay may act on its leases now; unlike
// checkLease it changes nothing, so that workers may call it.
func (r *Relay) leaseValid(st *runState) bool { return st.lease.valid(r.clock.Now()) }

// checkLease drops the lease set if it is no longer valid.
func (r *Relay) checkLease(st *runState) bool {
	now := r.clock.Now()
	if st.lease.valid(now) {
		return true
	}
	buckets, validUntil, lost := st.lease.snapshot()
	if len(buckets) == 0 {
		return false
	}
	r.m.expirations.Add(context.Background(), 1, r.m.attrs)
	r.log.Warn("leases lost", "buckets", buckets, "renewal_lost", lost, "expired_for", now.Sub(validUntil))
	r.setLeases(st, nil, time.Time{})
	st.nextRebalance = now // try to reacquire a fair share at once
	return false
}

// Phases of the loop, read by renewLoop.
const (
	phaseWorking   int32 = iota // in a cycle past its acquisition, or backing off
	phaseIdle                   // waiting in idle, whose deadline includes the rebalance
	phaseAcquiring              // in an acquisition round, which extends the leases
)

// setPhase records the loop's phase and wakes renewLoop when it changed.
func (r *Relay) setPhase(p int32) {
	if r.phase.Swap(p) != p {
		r.kickRenewer()
	}
}

// kickRenewer makes renewLoop look at the leases and the phase again.
func (r *Relay) kickRenewer() { nudge(r.kick) }

// renewLoop renews the leases on its own timer when due, so that no amount
// of work lets them lapse, except while the loop is idle or acquiring: the
// rebalance's acquisition extends them then. It marks the set lost or
// extends it; only the loop drops it.
func (r *Relay) renewLoop(ctx context.Context, st *runState) {
	var tried time.Time // start of the latest renewal attempt
	for {
		var fire <-chan time.Time
		stop := func() bool { return false }
		if due, ok := r.renewalDue(st, tried); ok {
			fire, stop = r.clock.NewTimer(due.Sub(r.clock.Now()))
		}
		fired := false
		select {
		case <-ctx.Done():
		case <-r.kick:
		case <-fire:
			fired = true
		}
		stop()
		if ctx.Err() != nil {
			return
		}
		if !fired {
			continue // look again: a kick changed the leases or the phase
		}
		if r.phase.Load() != phaseWorking { // read first: a working loop recorded its leases
			select {
			case <-ctx.Done():
				return
			case <-r.kick:
			}
			continue
		}
		now := r.clock.Now()
		if due, ok := r.renewalDue(st, tried); !ok || due.After(now) {
			continue // extended or dropped meanwhile
		}
		tried = now
		r.renew(ctx, st)
	}
}

// renewalDue returns when the leases need renewing, counted from their
// grant or the latest attempt (tried); ok is false when there is nothing to
// renew.
func (r *Relay) renewalDue(st *runState, tried time.Time) (time.Time, bool) {
	buckets, validUntil, lost := st.lease.snapshot()
	if len(buckets) == 0 || lost {
		return time.Time{}, false
	}
	base := validUntil.Add(-r.opts.LeaseDuration)
	if tried.After(base) {
		base = tried
	}
	rem := validUntil.Sub(base)
	if rem <= 0 {
		return time.Time{}, false
	}
	return base.Add(min(r.opts.LeaseRenewInterval, rem/2)), true
}

// renew extends the leases; a false or late answer marks them lost.
func (r *Relay) renew(ctx context.Context, st *runState) {
	st.lease.mu.Lock()
	buckets, validUntil, gen := st.lease.buckets, st.lease.validUntil, st.lease.gen
	st.lease.mu.Unlock()
	t0 := r.clock.Now()
	ok, err := r.store.RenewBucketLeases(ctx, r.opts.RelayID, buckets, r.opts.LeaseDuration)
	failpoint("relay/renew")
	t1 := r.clock.Now()
	st.lease.mu.Lock()
	defer st.lease.mu.Unlock()
	if st.lease.gen != gen {
		return
	}
	switch {
	case err != nil:
		if ctx.Err() == nil {
			r.repeats.Log(ctx, r.log, r.clock.Now(), "renew", "renew leases failed", err)
		}
	case !ok:
		r.log.WarnContext(ctx, "renewal reported the leases lost", "buckets", buckets)
		st.lease.lost = true
	case !t1.Before(validUntil):
		r.log.WarnContext(ctx, "renewal answered after the leases expired", "buckets", buckets, "took", t1.Sub(t0))
		st.lease.lost = true
	default:
		r.repeats.LogRecovered(ctx, r.log, r.clock.Now(), "renew", "renew leases succeeds again")
		if v := t0.Add(r.opts.LeaseDuration); v.After(st.lease.validUntil) {
			st.lease.validUntil = v
			if len(buckets) > 0 && buckets[0] == 0 {
				r.zeroUntil.Store(v.UnixNano())
			}
		}
	}
}

// bucketRanges writes ascending buckets as ranges ("0-3,8,10-12"), at most
// limit of them and then "…".
func bucketRanges(buckets []int, limit int) string {
	var b strings.Builder
	for i, n := 0, 0; i < len(buckets); n++ {
		if n == limit {
			b.WriteString(",…")
			break
		}
		j := i
		for j+1 < len(buckets) && buckets[j+1] == buckets[j]+1 {
			j++
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(buckets[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(buckets[j]))
		}
		i = j + 1
	}
	return b.String()
}
