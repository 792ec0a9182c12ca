// Package relaytest has test doubles for the relay: a manual clock
// (ManualClock), an in-memory Store and ParkAdmin
// (MemStore), and a scriptable publisher (Publisher).
package relaytest

import (
	"context"
	"slices"
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
	timers  []*manualTimer // pending, in deadline order
	changed signal         // timers changed
}

type manualTimer struct {
	at time.Time
	ch chan time.Time
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start}
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
	t := &manualTimer{at: c.now.Add(d), ch: make(chan time.Time, 1)}
	stop := func() bool { return c.stop(t) }
	if d <= 0 {
		t.ch <- c.now
		return t.ch, stop
	}
	c.timers = append(c.timers, t)
	slices.SortStableFunc(c.timers, func(a, b *manualTimer) int { return a.at.Compare(b.at) })
	c.changed.broadcast()
	return t.ch, stop
}

func (c *ManualClock) stop(t *manualTimer) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.timers, t)
	if i < 0 {
		return false
	}
	c.timers = slices.Delete(c.timers, i, i+1)
	c.changed.broadcast()
	return true
}

// Advance moves the clock forward by d, firing due timers.
func (c *ManualClock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// Set moves the clock to t (never backwards), firing due timers.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	n := 0
	for ; n < len(c.timers) && !c.timers[n].at.After(c.now); n++ {
		c.timers[n].ch <- c.now
	}
	c.timers = slices.Delete(c.timers, 0, n)
	c.changed.broadcast()
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
	return c.timers[0].at, true
}

// WaitForWaiters blocks until at least n timers are pending or ctx is done,
// and reports whether the count was reached. Tests use it to know that the
// code under test is parked on the clock before advancing it.
func (c *ManualClock) WaitForWaiters(ctx context.Context, n int) bool {
	return c.changed.wait(ctx, &c.mu, func() bool { return len(c.timers) >= n })
}

// signal wakes the goroutines waiting for a change of state that a mutex
// guards; its zero value is ready.
type signal struct{ ch chan struct{} }

// broadcast wakes every waiter; the mutex is held.
func (s *signal) broadcast() {
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// wait blocks until done, called with mu held, is true or ctx ends, and
// reports whether done became true.
func (s *signal) wait(ctx context.Context, mu *sync.Mutex, done func() bool) bool {
	for {
		mu.Lock()
		if done() {
			mu.Unlock()
			return true
		}
		if s.ch == nil {
			s.ch = make(chan struct{})
		}
		ch := s.ch
		mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

var _ relay.Clock = (*ManualClock)(nil)
