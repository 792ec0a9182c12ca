package relay

import (
	"context"
	"errors"
	"slices"
)

// ErrFenced is wrapped by the error of a Publish that cannot publish its
// bucket's rows under the relay's current lease and never will: the
// publisher holds no valid producer for the bucket. kafkapub.Publisher's
// transactional mode (kafkapub.Config.Transactions) returns it when the bucket's
// transactional producer was fenced by a newer owner's (PRODUCER_FENCED,
// INVALID_PRODUCER_EPOCH), when the coordinator aborted its transaction
// (transaction timeout, INVALID_TXN_STATE), when it could not be
// initialised, and for a bucket the relay never reported owning (see
// BucketOwnershipObserver). The rows of such a publish are not acknowledged
// (apart from a prefix committed earlier in the same call), so none is
// deleted.
//
// The relay treats it as the loss of that bucket's lease: it drops the
// bucket locally (no further fetch, publish or delete for it, and no park
// strike for the row), keeps its other buckets, and takes the bucket back at
// its next acquisition round, ErrorBackoff later, if the store still grants
// it (the publisher then initialises a new producer); a peer that took the
// bucket over keeps it. A custom Publisher may wrap it for the same effect.
var ErrFenced = errors.New("fenced")

// BucketOwnershipObserver is an optional Publisher capability: a publisher
// that needs to know which buckets its relay owns (kafkapub.Publisher: its
// transactional mode initialises one producer per owned bucket when the
// bucket is acquired, which fences the previous owner's).
//
// The relay calls OwnedBuckets with the buckets it owns, in ascending
// order, after every acquisition round (an unchanged set included), and
// whenever it drops buckets: all of them when its leases expire or when it
// stops (an empty set), one when a publish of it failed with ErrFenced. It
// calls it from its loop goroutine, never concurrently with itself nor with
// a Publish of a bucket that leaves the set, but possibly concurrently with
// Publish calls of other buckets. OwnedBuckets must not block: work such as
// network round trips runs in the background, and a Publish of a bucket
// whose preparation has not finished waits for it within its own context.
// The buckets slice is the relay's: do not modify or keep it.
type BucketOwnershipObserver interface {
	OwnedBuckets(buckets []int)
}

// errFencedBucket is what drainOnce returns, inside an errBucket, when the
// publisher reported ErrFenced for the bucket: the loop then drops the
// bucket (see bucketFailed and dropFenced).
type errFencedBucket struct{ err error }

func (e *errFencedBucket) Error() string { return e.err.Error() }
func (e *errFencedBucket) Unwrap() error { return e.err }

// observeOwnership tells the publisher, when it is a
// BucketOwnershipObserver, which buckets the relay owns.
func (r *Relay) observeOwnership(buckets []int) {
	if r.owners != nil {
		r.owners.OwnedBuckets(buckets)
	}
}

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
// ErrFenced (cause; atBroker), or the store ErrLeaseLost: the bucket's state is forgotten as if a round had not
// granted it, the publisher and the notifier are told, and the next
// acquisition round comes within ErrorBackoff (it takes the bucket back if
// the store still grants it to this relay). The other buckets' leases, their
// validity and a renewal's verdict on them are unchanged. The loop's
// goroutine only (the bucket's worker has returned).
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

	st.b[b].ready = false
	st.clearRetry(b)
	st.b[b].strikes = nil
	st.b[b].unmarked = nil // the next owner republishes them
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
