package relay

import "context"

// logFailure logs a failure of op that the relay retries: at WARN the
// first time, and for the same error text at most once a minute with the
// number of repeats in between ("repeated"), at DEBUG otherwise; a new
// error text logs at WARN at once (see internal/logrepeat). An outage of
// an hour thus leaves about sixty lines per operation, not one per
// attempt. args are the line's attributes; the error comes last.
func (r *Relay) logFailure(ctx context.Context, op, msg string, err error, args ...any) {
	level, repeated := r.repeats.Failure(op, err, r.clock.Now())
	if repeated > 0 {
		args = append(args, "repeated", repeated)
	}
	r.log.Log(ctx, level, msg, append(args, "error", err)...)
}

// logRecovered ends op's failures, if it was failing: one INFO line with
// msg, the failures counted and how long op failed; the next failure logs
// at WARN at once.
func (r *Relay) logRecovered(ctx context.Context, op, msg string) {
	if n, since := r.repeats.Recovered(op); n > 0 {
		r.log.InfoContext(ctx, msg, "failures", n, "failing_for", r.clock.Now().Sub(since))
	}
}
