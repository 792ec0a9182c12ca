package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// leaseSet is the relay's local view of its leases. validUntil is the
// relay-clock time read before the acquisition or renewal call that granted
// them, plus LeaseDuration: the store may have extended them later, never
// earlier. The renewal goroutine updates it during a publish.
type leaseSet struct {
	mu         sync.Mutex
	buckets    []int
	validUntil time.Time
	lost       bool // a renewal reported the set lost
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

// remaining returns the lease time left at now.
func (l *leaseSet) remaining(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost {
		return 0
	}
	return l.validUntil.Sub(now)
}

// acquire runs one acquisition round. A store error wrapping
// ErrMisconfigured is returned (fatal); other errors are logged and retried
// after ErrorBackoff, the current leases staying valid until they expire.
func (r *Relay) acquire(ctx context.Context, st *runState) error {
	st.attempted = true
	t0 := r.clock.Now()
	buckets, err := r.store.AcquireBucketLeases(ctx, r.opts.RelayID, r.opts.BucketCount, r.opts.LeaseDuration)
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
		r.log.Warn("relay: acquire leases failed", "relay", r.opts.RelayID, "error", err)
		st.acquireErr = fmt.Errorf("relay: acquire leases: %w", err)
		st.nextRebalance = t1.Add(r.opts.ErrorBackoff)
		return nil
	}
	st.acquireErr = nil
	validUntil := t0.Add(r.opts.LeaseDuration)
	if !t1.Before(validUntil) {
		r.log.Warn("relay: lease acquisition answered after the leases expired", "relay", r.opts.RelayID, "took", t1.Sub(t0))
		buckets = nil
	}
	buckets = slices.DeleteFunc(slices.Clone(buckets), func(b int) bool { return b < 0 || b >= r.opts.BucketCount })
	slices.Sort(buckets)
	r.setLeases(st, buckets, validUntil)
	st.nextRebalance = t0.Add(r.opts.LeaseRenewInterval)
	return nil
}

// setLeases replaces the local lease set. Newly gained buckets force a
// discovery; state of buckets no longer owned is forgotten.
func (r *Relay) setLeases(st *runState, buckets []int, validUntil time.Time) {
	old, _, _ := st.lease.snapshot()
	st.lease.mu.Lock()
	st.lease.buckets = buckets
	st.lease.validUntil = validUntil
	st.lease.lost = false
	st.lease.mu.Unlock()
	for _, b := range buckets {
		if !slices.Contains(old, b) {
			st.discover = true
			st.forgetParked(b) // loaded before its first batch
		}
	}
	for _, b := range old {
		if !slices.Contains(buckets, b) {
			st.ready[b] = false
			st.clearRetry(b)
			st.unmarked[b] = nil // the next owner republishes them
			st.forgetParked(b)     // reloaded if the bucket comes back
		}
	}
	r.noteStuck(st)
	if !slices.Equal(old, buckets) {
		r.log.Info("relay: owned buckets changed", "relay", r.opts.RelayID, "buckets", buckets)
	}
	r.publishOwnership(buckets, validUntil)
}

// publishOwnership updates the state read by the notifier, the gauges and
// the backlog sampler.
func (r *Relay) publishOwnership(buckets []int, validUntil time.Time) {
	r.notifier.setOwned(buckets)
	r.ownedCount.Store(int64(len(buckets)))
	if len(buckets) > 0 && buckets[0] == 0 {
		r.zeroUntil.Store(validUntil.UnixNano())
	} else {
		r.zeroUntil.Store(0)
	}
}

// checkLease drops the lease set if it is no longer valid by the relay's
// clock, and reports whether the relay may act on it.
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
	r.log.Warn("relay: leases lost", "relay", r.opts.RelayID, "buckets", buckets, "renewal_lost", lost, "expired_for", now.Sub(validUntil))
	r.setLeases(st, nil, time.Time{})
	st.nextRebalance = now // try to reacquire a fair share at once
	return false
}

// guardPublish runs beside one Publish call until done is closed. It renews
// the leases (when the store can) at min(LeaseRenewInterval, half the
// remaining lease), and logs when the stop budget cancels the publish
// (pubCtx ends).
func (r *Relay) guardPublish(pubCtx context.Context, st *runState, done <-chan struct{}) {
	cancelled := pubCtx.Done()
	for {
		var renewT Timer
		var renewC <-chan time.Time
		if r.renewer != nil {
			if rem := st.lease.remaining(r.clock.Now()); rem > 0 && st.lease.valid(r.clock.Now()) {
				renewT = r.clock.NewTimer(min(r.opts.LeaseRenewInterval, rem/2))
				renewC = renewT.C()
			}
		}
		select {
		case <-done:
		case <-cancelled:
			cancelled = nil
			select {
			case <-done: // the publish returned first: publish cancelled pubCtx
			default:
				r.log.Warn("relay: in-flight publish outlived the stop budget; cancelled", "relay", r.opts.RelayID, "stop_timeout", r.opts.StopTimeout)
			}
		case <-renewC:
			renewC = nil
			r.renew(pubCtx, st)
		}
		if renewT != nil {
			renewT.Stop()
		}
		select {
		case <-done:
			return
		default:
		}
	}
}

// renew extends the leases during a publish. An answer that arrives after
// the previous lease expired counts as lost, like a false answer.
func (r *Relay) renew(ctx context.Context, st *runState) {
	buckets, validUntil, _ := st.lease.snapshot()
	t0 := r.clock.Now()
	ok, err := r.renewer.RenewBucketLeases(ctx, r.opts.RelayID, buckets, r.opts.LeaseDuration)
	failpoint("relay/renew")
	t1 := r.clock.Now()
	st.lease.mu.Lock()
	defer st.lease.mu.Unlock()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			r.log.Warn("relay: renew leases failed", "relay", r.opts.RelayID, "error", err)
		}
	case !ok:
		r.log.Warn("relay: renewal reported the leases lost", "relay", r.opts.RelayID, "buckets", buckets)
		st.lease.lost = true
	case !t1.Before(validUntil):
		r.log.Warn("relay: renewal answered after the leases expired", "relay", r.opts.RelayID, "buckets", buckets, "took", t1.Sub(t0))
		st.lease.lost = true
	default:
		if v := t0.Add(r.opts.LeaseDuration); v.After(st.lease.validUntil) {
			st.lease.validUntil = v
			if len(buckets) > 0 && buckets[0] == 0 {
				r.zeroUntil.Store(v.UnixNano())
			}
		}
	}
}
