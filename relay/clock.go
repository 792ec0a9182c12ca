package relay

import "time"

// Clock is the relay's source of time and timers (relaytest.ManualClock in
// tests).
type Clock interface {
	// Now returns the current time. The relay compares only times it read
	// from the same Clock, so the system clock's monotonic reading is used.
	Now() time.Time
	// NewTimer starts a one-shot timer, like time.NewTimer; stop is like
	// time.Timer.Stop.
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
