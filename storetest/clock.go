package storetest

import (
	"testing"
	"time"
)

// clockOffsetMargin absorbs what a store may add to the measurement besides
// its own uncertainty: the kit's reads of the host clock around the call,
// and a clock of millisecond resolution.
const clockOffsetMargin = 50 * time.Millisecond

// clockOffsetIsReportedAfterAnAcquisition: a store with a clock of its own
// reports, after an acquisition round, the offset of its clock (the now
// NewStore was given, months from the host's) to the host's wall clock,
// store minus host, within its uncertainty; a later round measures it again.
func clockOffsetIsReportedAfterAnAcquisition(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	a := e.relay("relay-a")
	e.acquire(a)
	if _, _, ok := a.s.ClockOffset(); !ok {
		t.Skip("storetest: the store reports no clock offset (its leases run on the relay hosts' clocks)")
	}
	check := func(what string) {
		t.Helper()
		before := time.Now()
		e.acquire(a)
		after := time.Now()
		off, unc, ok := a.s.ClockOffset()
		if !ok {
			t.Fatalf("%s: ClockOffset reports no offset after an acquisition round", what)
		}
		if unc < 0 {
			t.Fatalf("%s: ClockOffset uncertainty %v; want it not negative", what, unc)
		}
		// The store read the host clock within [before, after].
		lo := e.clock.Now().Sub(after) - unc - clockOffsetMargin
		hi := e.clock.Now().Sub(before) + unc + clockOffsetMargin
		if off < lo || off > hi {
			t.Fatalf("%s: ClockOffset = %v ± %v; want the store's clock (%v) minus the host's (%v), in [%v, %v]",
				what, off, unc, e.clock.Now(), before, lo, hi)
		}
	}
	check("first round")
	e.clock.Advance(time.Hour) // the store's clock jumps; the next round measures it
	check("a round an hour later on the store's clock")
}
