package kafkapub_test

import (
	"testing"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// The steps of the end-to-end tests through a relay and a database (as in
// relay's own end-to-end tests).

// forEachDBAndBroker runs f as subtests named <database>_<broker>: every
// database with the in-process broker and, on PostgreSQL, also with the
// real broker when the environment names one.
func forEachDBAndBroker(t *testing.T, f func(t *testing.T, db testenv.Opener, b testenv.Broker)) {
	t.Helper()
	type pairing struct {
		db     testenv.Opener
		broker func(t *testing.T) (testenv.Broker, bool)
	}
	fake := func(t *testing.T) (testenv.Broker, bool) { return testenv.NewFake(t), true }
	real := func(t *testing.T) (testenv.Broker, bool) { return testenv.RealBroker(t) }
	var pairings []pairing
	for _, o := range testenv.Databases(t) {
		pairings = append(pairings, pairing{o, fake})
		if o.Name == testenv.Postgres {
			pairings = append(pairings, pairing{o, real})
		}
	}
	for _, p := range pairings {
		b, ok := p.broker(t)
		if !ok {
			continue
		}
		t.Run(p.db.Name+"_"+b.Name, func(t *testing.T) { f(t, p.db, b) })
	}
}
