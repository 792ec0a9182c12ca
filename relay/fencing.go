package relay

import (
	"context"
	"errors"
	"slices"
)

// ErrFenced is wrapped by the error of a Publish that cannot publish its
// bucket's rows under the relay's current lease and never will (kafkapub's
// fenced mode: fenced by a newer owner, transaction aborted, not
// initialised, or a bucket the relay never reported owning). The relay
// drops that bucket, with no strike for the row, and takes it back at its
// next acquisition round, ErrorBackoff later, if the store still grants it.
var ErrFenced = errors.New("fenced")

// errFencedBucket is what settle returns, inside an errBucket, when the
// publisher reported ErrFenced: the loop drops the bucket (dropFenced).
type errFencedBucket struct{ err error }

func (e *errFencedBucket) Error() string { return e.err.Error() }
func (e *errFencedBucket) Unwrap() error { return e.err }

// ownsBucket reports whether the relay may act on bucket b at the relay's
// clock's now: its lease set is valid (see leaseValid) and holds b.
func (r *Relay) ownsBucket(st *runState, b int) bool {
	if !r.leaseValid(st) {
		return false
	}
	owned, _, _ := st.lease.snapshot()
	return containsSorted(owned, b)
}

// dropFenced drops bucket b from the lease set after its publisher reported
// ErrFenced (cause; atBroker), or the store ErrLeaseLost, as if a round had
// not granted it; the next acquisition round comes within ErrorBackoff. The
// other buckets' leases are unchanged. The loop's goroutine only.
func (r *Relay) dropFenced(st *runState, b int, cause error, atBroker bool) {
	st.lease.mu.Lock()
	i := slices.Index(st.lease.buckets, b)
	if i < 0 {
		st.lease.mu.Unlock()
		return
	}
	// A new slice: snapshots of the old one stay as they were.
	buckets := slices.Delete(slices.Clone(st.lease.buckets), i, i+1)
	st.lease.buckets = buckets
	validUntil := st.lease.validUntil
	st.lease.mu.Unlock()

	st.forget(b)
	now := r.clock.Now()
	st.nextRebalance = earliest(st.nextRebalance, now.Add(r.opts.ErrorBackoff))
	if atBroker {
		r.m.fenced.Add(context.Background(), 1, r.m.attrs)
		r.log.Warn("bucket fenced at the broker; dropped until the next acquisition round", "bucket", b, "error", cause)
	} else {
		r.log.Warn("bucket's lease lost at the store; dropped until the next acquisition round", "bucket", b, "error", cause)
	}
	r.noteStuck(st)
	r.publishOwnership(buckets, validUntil)
}
