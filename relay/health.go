package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// ErrPublisherAuth is wrapped by a publish error when the broker rejected
// the publisher's credentials, so that every row fails the same way and no
// retry of a row can cure it (kafkapub wraps it for a failed SASL
// authentication, a SASL mechanism the broker does not enable and an
// illegal SASL state; a custom Publisher wraps it for the same effect).
// Health reports such a failure, wrapping the publish error, until a
// publish is acknowledged again; the rows are kept and retried as usual. A
// broker certificate that does not verify (crypto/tls, crypto/x509 errors)
// counts too, without the sentinel.
var ErrPublisherAuth = errors.New("the broker rejected the publisher's credentials")

// errNoCycle is Health's answer between the start of Run and the end of its
// first cycle.
var errNoCycle = errors.New("relay: no cycle completed yet")

// errNotRunning is Health's answer while Run is not running.
var errNotRunning = errors.New("relay: not running")

// Health reports whether the relay is healthy: nil while Run is running and
// its latest cycle (lease acquisition, discovery and one sweep) succeeded;
// otherwise an error saying why (not running, no cycle completed yet, the
// latest cycle's store or fatal error, or a failed lease acquisition that
// no later acquisition has repaired, or a publisher that cannot
// authenticate to Kafka). A publish failure is not a cycle failure: the
// failing row is retried with backoff and counted by the publish.failures
// metric; parking a row (see Options.ParkPolicy) does not make the relay
// unhealthy either. Nor is a store error confined to one bucket (its
// NextBatch or MarkPublished failed, e.g. on a row a store that cannot park
// cannot decode): Health stays
// about the relay itself, so that bucket backs off alone, logged at WARN
// once per backoff step with its number, while the other buckets go on and
// the relay stays healthy. A store failing the relay as a whole still
// shows: a failed lease acquisition or discovery is a cycle failure, and so
// is the state where every owned bucket is backing off from its own store
// error (Health then wraps one of them). The exception is a failure to authenticate, which no retry of a
// row can cure (SASL authentication failed, a SASL mechanism the broker
// does not enable, a broker certificate that does not verify): Health
// reports it, wrapping the publish error, until a publish is acknowledged
// again; the rows are kept and retried as usual. The other exception is a
// publisher that has failed every call for longer than
// Options.PublishFailureWindow (default 5m), whatever the error: Health
// reports it, wrapping the latest publish error, until a publish is
// acknowledged again (or no failed publish is being retried any more).
// Health is safe to call from any goroutine, e.g. an HTTP health check.
func (r *Relay) Health() error {
	if !r.running.Load() {
		return errNotRunning
	}
	if p := r.health.Load(); p != nil {
		return *p
	}
	if p := r.authErr.Load(); p != nil {
		return *p
	}
	if p := r.pubFail.Load(); p != nil {
		if d := r.clock.Now().Sub(p.since); d > r.opts.PublishFailureWindow {
			return fmt.Errorf("relay: every publish has failed for %v, longer than Options.PublishFailureWindow %v (rows are kept and retried): %w", d.Round(time.Second), r.opts.PublishFailureWindow, p.last)
		}
	}
	return nil
}

// publishFailing is an unbroken run of failed publishes: since the start of
// the first one, the latest one's error.
type publishFailing struct {
	since time.Time
	last  error
}

// recordPublishHealth remembers an authentication failure of a publish,
// and when an unbroken run of failed publishes began (the start of its
// first call), for Health and MetricPublishStalled; it forgets both once a
// publish is acknowledged. A publish cancelled by a stop (stopped) does not
// count.
func (r *Relay) recordPublishHealth(err error, ack int, failed, stopped bool, start time.Time) {
	switch {
	case ack > 0 || !failed:
		r.authErr.Store(nil)
		r.pubFail.Store(nil)
		return
	case stopped:
		return
	case authFailure(err):
		e := fmt.Errorf("relay: the publisher cannot authenticate to Kafka (check the credentials and TLS settings; rows are kept and retried): %w", err)
		r.authErr.Store(&e)
	}
	since := start
	if p := r.pubFail.Load(); p != nil {
		since = p.since
	}
	r.pubFail.Store(&publishFailing{since: since, last: err})
}

// authFailure reports whether a publish error says that the publisher
// cannot authenticate to the cluster, so that every row fails the same way.
func authFailure(err error) bool {
	if errors.Is(err, ErrPublisherAuth) {
		return true
	}
	var verify *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &verify) || errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid)
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
