package relay

// SetIdleHook makes r call f whenever Run starts an idle wait
// (after its timer is set), so tests know when to move a manual clock.
func SetIdleHook(r *Relay, f func()) { r.onIdle = f }

// WakePending reports whether n holds an unconsumed wake-up signal.
func WakePending(n *Notifier) bool { return len(n.wake) > 0 }

// Workers returns the number of buckets r serves at once while it owns
// owned buckets.
func Workers(r *Relay, owned int) int { return r.sweepWorkers(owned) }

// BucketRanges exposes bucketRanges to the tests.
func BucketRanges(buckets []int, limit int) string { return bucketRanges(buckets, limit) }
