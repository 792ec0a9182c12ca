package relay

import "time"

// Clock is the relay's source of time and timers. Options.Clock defaults to
// the system clock; tests pass relaytest.ManualClock to control lease expiry,
// polling and backoff without sleeping.
type Clock interface {
	// Now returns the current time. The relay compares only times it read
	// from the same Clock, so the system clock's monotonic reading is used.
	Now() time.Time
	// NewTimer starts a one-shot timer, like time.NewTimer: c delivers the
	// time once it fires after d; stop prevents it from firing and reports
	// whether it did (like time.Timer.Stop).
	NewTimer(d time.Duration) (c <-chan time.Time, stop func() bool)
}

// SystemClock is the Clock of package time.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer starts a time.Timer.
func (SystemClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}
