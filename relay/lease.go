package relay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// leaseSet is the relay's view of its leases, valid until the relay-clock
// time read before the call that granted them plus LeaseDuration (never
// after the store's). gen tells a renewal of a replaced set.
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

func (l *leaseSet) valid(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets) > 0 && !l.lost && now.Before(l.validUntil)
}

// acquire runs an acquisition round; only ErrMisconfigured is fatal, others retry after ErrorBackoff.
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

func (r *Relay) liveRelays(ctx context.Context) int {
	f, err := r.store.Fleet(ctx)
	if err != nil {
		return -1
	}
	return f.Relays
}

// fleetChecked makes a round due now when the number of live relays changed.
func (r *Relay) fleetChecked(st *runState, n int) {
	if n >= 0 && st.relays > 0 && n != st.relays && st.acquireErr == nil {
		st.nextRebalance = r.clock.Now()
	}
}

// noteUnowned records a round's unowned buckets, and since when there are some.
func (r *Relay) noteUnowned(n int, now time.Time) {
	r.unowned.Store(int64(n))
	switch {
	case n == 0:
		r.unownedSince.Store(0)
	case r.unownedSince.Load() == 0:
		r.unownedSince.Store(now.UnixNano())
	}
}

// setLeases replaces the lease set: gained buckets force a discovery, lost ones are forgotten.
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

// publishOwnership tells the notifier, the gauges and the publisher the owned buckets.
func (r *Relay) publishOwnership(buckets []int, validUntil time.Time) {
	r.notifier.setOwned(buckets)
	r.pub.OwnedBuckets(buckets)
	r.ownedCount.Store(int64(len(buckets)))
	zero := int64(0)
	if len(buckets) > 0 && buckets[0] == 0 {
		zero = validUntil.UnixNano()
	}
	r.zeroUntil.Store(zero)
}

// leaseValid reports whether the relay may act on its leases now, changing nothing.
func (r *Relay) leaseValid(st *runState) bool { return st.lease.valid(r.clock.Now()) }

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

func (r *Relay) setPhase(p int32) {
	if r.phase.Swap(p) != p {
		r.kickRenewer()
	}
}

func (r *Relay) kickRenewer() { nudge(r.kick) }

// renewLoop renews the leases when due while the loop works (an idle or acquiring loop's round extends them).
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

// renewalDue returns when the leases need renewing; ok is false when there is nothing to renew.
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

// bucketRanges writes ascending buckets as ranges ("0-3,8"), at most limit of them.
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

// Shares divides bucketCount buckets among the active relays; held maps
// each (the caller included) to the unexpired leases it holds. Every relay
// gets ⌊N/R⌋; the N mod R others go first to relays, in byte-wise id order,
// already holding more, then to the rest in id order: incumbents keep the
// remainder and joiners do not churn ownership. Every Store must use it.
func Shares(bucketCount int, held map[string]int) map[string]int {
	out := make(map[string]int, len(held))
	if len(held) == 0 || bucketCount <= 0 {
		for id := range held {
			out[id] = 0
		}
		return out
	}
	ids := slices.Sorted(maps.Keys(held)) // byte-wise
	base := bucketCount / len(ids)
	extra := bucketCount % len(ids)
	for _, id := range ids {
		out[id] = base
	}
	for pass := 0; pass < 2 && extra > 0; pass++ {
		for _, id := range ids {
			if extra == 0 {
				break
			}
			incumbent := held[id] > base
			if (pass == 0) == incumbent && out[id] == base {
				out[id]++
				extra--
			}
		}
	}
	return out
}

// ClaimStart is where relayID starts claiming free buckets among
// bucketCount: each relay of held (as for Shares) at another point, so that
// relays starting together do not collide on the lowest ones.
func ClaimStart(bucketCount int, relayID string, held map[string]int) int {
	ids := slices.Sorted(maps.Keys(held))
	i, _ := slices.BinarySearch(ids, relayID)
	return i * bucketCount / max(len(ids), 1)
}
