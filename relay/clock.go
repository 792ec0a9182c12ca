package relay

import "time"

// Clock is the relay's source of time and timers. Options.Clock defaults to
// the system clock; tests pass relaytest.ManualClock to control lease expiry,
// polling and backoff without sleeping.
type Clock interface {
	// Now returns the current time. The relay compares only times it read
	// from the same Clock, so the system clock's monotonic reading is used.
	Now() time.Time
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock, like *time.Timer.
type Timer interface {
	// C delivers the time once the timer fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped it.
	Stop() bool
}

// SystemClock is the Clock of package time.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer.
func (SystemClock) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

type sysTimer struct{ t *time.Timer }

func (s sysTimer) C() <-chan time.Time { return s.t.C }
func (s sysTimer) Stop() bool          { return s.t.Stop() }

var _ Clock = SystemClock{}
