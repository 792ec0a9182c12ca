package relay

import (
	"context"
	"errors"
)

// errNoCycle is Health's answer between the start of Run and the end of its
// first cycle.
var errNoCycle = errors.New("relay: no cycle completed yet")

// errNotRunning is Health's answer while Run is not running.
var errNotRunning = errors.New("relay: not running")

// Health reports whether the relay is healthy: nil while Run is running and
// its latest cycle (lease acquisition, discovery and one sweep) succeeded;
// otherwise an error saying why (not running, no cycle completed yet, the
// latest cycle's store or fatal error, or a failed lease acquisition that
// no later acquisition has repaired). A publish failure is not a
// cycle failure: the failing row is retried with backoff and counted by
// the publish.failures metric. Health is safe to call from any goroutine,
// e.g. an HTTP health check.
func (r *Relay) Health() error {
	if !r.running.Load() {
		return errNotRunning
	}
	if p := r.health.Load(); p != nil {
		return *p
	}
	return nil
}

// recordHealth remembers the outcome of a cycle for Health. A cycle cut
// short by ctx is not recorded.
func (r *Relay) recordHealth(ctx context.Context, err error) {
	switch {
	case ctx.Err() != nil:
	case err != nil:
		r.health.Store(&err)
	default:
		r.health.Store(nil)
	}
}
