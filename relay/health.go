package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// Health's answers before Run's first cycle ended, and while Run is not running.
var (
	errNoCycle    = errors.New("relay: no cycle completed yet")
	errNotRunning = errors.New("relay: not running")
)

// Health returns nil while Run runs and its latest cycle succeeded, else
// why not: not running, no cycle yet, a fatal error, a failed acquisition
// or discovery, every owned bucket failing in the store, buckets without a
// live owner for longer than LeaseDuration, or, until a publish is
// acknowledged, ErrPublisherAuth or every publish failing for longer than
// Options.PublishFailureWindow. It is safe for concurrent use.
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
	if ns := r.unownedSince.Load(); ns != 0 {
		if d := r.clock.Now().Sub(time.Unix(0, ns)); d > r.opts.LeaseDuration {
			return fmt.Errorf("relay: %d buckets have had no live owner for %v, longer than Options.LeaseDuration %v (outbox-relay status names them and the live relays)", r.unowned.Load(), d.Round(time.Second), r.opts.LeaseDuration)
		}
	}
	if p := r.pubFail.Load(); p != nil {
		if d := r.clock.Now().Sub(p.since); d > r.opts.PublishFailureWindow {
			return fmt.Errorf("relay: every publish has failed for %v, longer than Options.PublishFailureWindow %v (rows are kept and retried): %w", d.Round(time.Second), r.opts.PublishFailureWindow, p.last)
		}
	}
	return nil
}

type publishFailing struct {
	since time.Time
	last  error
}

// recordPublishHealth remembers an auth failure and a run of failed publishes until an acknowledgement.
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

func (r *Relay) recordHealth(ctx context.Context, err error) {
	switch {
	case ctx.Err() != nil:
	case err != nil:
		r.health.Store(&err)
	default:
		r.health.Store(nil)
	}
}
