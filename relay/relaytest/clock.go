// Package relaytest has test doubles for the relay: a manual clock
// (ManualClock), an in-memory Store and ParkAdmin
// (MemStore), and a scriptable publisher (Publisher).
package relaytest

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox/relay"
)

// ManualClock is a relay.Clock whose time moves only when the test calls
// Advance or Set. Timers fire, in deadline order, when the time reaches them.
// It is safe for concurrent use.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*manualTimer
	changed chan struct{} // closed and replaced whenever timers change
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer firing when the clock reaches Now()+d; d <= 0
// fires at once.
func (c *ManualClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
		return t.ch, t.Stop
	}
	c.timers = append(c.timers, t)
	c.notifyLocked()
	return t.ch, t.Stop
}

// Advance moves the clock forward by d, firing due timers.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	t := c.now.Add(d)
	c.mu.Unlock()
	c.Set(t)
}

// Set moves the clock to t (never backwards), firing due timers.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	sort.Slice(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if !tm.at.After(c.now) {
			tm.ch <- c.now
			continue
		}
		kept = append(kept, tm)
	}
	c.timers = kept
	c.notifyLocked()
}

// Waiters returns the number of timers that have not fired or been stopped.
func (c *ManualClock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// NextDeadline returns the earliest pending timer deadline, if any.
func (c *ManualClock) NextDeadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return time.Time{}, false
	}
	min := c.timers[0].at
	for _, t := range c.timers[1:] {
		if t.at.Before(min) {
			min = t.at
		}
	}
	return min, true
}

// WaitForWaiters blocks until at least n timers are pending or ctx is done,
// and reports whether the count was reached. Tests use it to know that the
// code under test is parked on the clock before advancing it.
func (c *ManualClock) WaitForWaiters(ctx context.Context, n int) bool {
	for {
		c.mu.Lock()
		if len(c.timers) >= n {
			c.mu.Unlock()
			return true
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

func (c *ManualClock) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

type manualTimer struct {
	c  *ManualClock
	at time.Time
	ch chan time.Time
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			t.c.notifyLocked()
			return true
		}
	}
	return false
}

var _ relay.Clock = (*ManualClock)(nil)
