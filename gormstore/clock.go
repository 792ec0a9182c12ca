package gormstore

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// The database's clock
//
// A lease round needs one "now" that every relay agrees on: the expiry it
// writes, the expiries it compares, the heartbeat and the liveness window
// must all be read from the same clock, or a relay whose host clock runs
// ahead claims its peers' leases early (and one running behind keeps its
// own too long). The database is the one clock every relay sees, so with
// Options.Clock nil the store takes "now" from it.
//
// Design: each lease operation (acquisition round, renewal, release) reads
// the database's time once, with one SELECT of the dialect's clock
// expression (dbClockSQL), and uses that value as "now" for every statement
// of the operation, exactly as it used Options.Clock before. The alternative,
// embedding the clock expression in every statement, saves that round trip
// but changes what a statement means when it is late: a heartbeat delayed
// past the relay's own release would be stamped with the time it finally
// ran, newer than the stopped stamp, and revive the stopped relay; an
// expiry would be counted from when the UPDATE ran rather than from the
// start of the round the relay's local validity is counted from. Reading
// the time once keeps every statement, and its behaviour under delay, as it
// was (storetest's late-statement scenarios, which inject a frozen
// Options.Clock, exercise the same statements production runs), and it
// measures the host's clock offset for free (ClockOffset). The cost is one
// round trip per acquisition round (which already runs at least six
// statements), per renewal and per release: one every LeaseRenewInterval.
//
// Park stamps parked_at_ms and checks the lease, and Fleet compares
// last_seen_ms, inside their single statement with the clock expression
// itself (nowArg, agoArg): they have no round whose start the value must be
// fixed at, so parking a row costs no extra round trip.
//
// The value is Unix milliseconds from the database server's clock,
// independent of the session's time zone:
//
//   - PostgreSQL: floor(extract(epoch from clock_timestamp()) * 1000)
//     (clock_timestamp, not now(): the time the statement runs, even inside
//     a transaction).
//   - MySQL/MariaDB: TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
//     DIV 1000. UNIX_TIMESTAMP(NOW(3)) would convert a local datetime back
//     through the session time_zone, which is ambiguous for an hour at each
//     daylight saving change; UTC_TIMESTAMP involves no zone at all.
//   - SQLite: the process's own clock (julianday('now'), available in every
//     SQLite version), so there the database and host clocks are one.

// dbClockSQL returns the dialect's current-time expression in Unix
// milliseconds, parenthesised.
func dbClockSQL(kind int) string {
	switch kind {
	case kindPostgres:
		return "(floor(extract(epoch from clock_timestamp()) * 1000)::bigint)"
	case kindMySQL, kindMariaDB:
		return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
	case kindSQLite:
		return "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER))"
	default:
		// Another dialect: SQL's CURRENT_TIMESTAMP has no portable
		// conversion to epoch milliseconds. New rejects such a store unless
		// Options.Clock is set.
		return ""
	}
}

// clockSample is the latest measurement of the host clock's offset.
type clockSample struct {
	offset      time.Duration // store clock minus the host clock's midpoint
	uncertainty time.Duration // half the round trip
	ok          bool
}

// nowMs returns "now" in Unix milliseconds for one lease operation: from
// Options.Clock when set, else from the database's clock (one SELECT). Either
// way it measures the offset of that clock to the host's (Options.HostClock):
// the clock's reading minus the midpoint of the host readings taken just
// before and just after it, with half their distance (the round trip) as
// the uncertainty.
func (s *Store) nowMs(ctx context.Context) (int64, error) {
	before := s.hostNow()
	var now int64
	if s.now != nil {
		now = s.now().UnixMilli()
	} else {
		var err error
		if now, err = s.dbNow(ctx); err != nil {
			return 0, err
		}
	}
	after := s.hostNow()
	half := after.Sub(before) / 2
	if half < 0 {
		half = -half
	}
	mid := before.Add(after.Sub(before) / 2)
	s.mu.Lock()
	s.offset = clockSample{offset: time.UnixMilli(now).Sub(mid), uncertainty: half + time.Millisecond, ok: true}
	s.mu.Unlock()
	return now, nil
}

// dbNow reads the database's clock: one statement, no table read (so no
// read transaction on MySQL/MariaDB), bounded like every other.
func (s *Store) dbNow(ctx context.Context) (int64, error) {
	k, err := s.kind(ctx)
	if err != nil {
		return 0, err
	}
	var now int64
	err = s.write(ctx, s.relays, func(q *gorm.DB) error {
		return q.Raw(s.rawPrefix() + "SELECT " + dbClockSQL(k)).Row().Scan(&now)
	})
	if err != nil {
		return 0, fmt.Errorf("gormstore: read the database clock: %w", err)
	}
	return now, nil
}

// nowArg is "now" as a statement argument for a single statement: the
// value of Options.Clock in Unix milliseconds when set, else the database's
// clock expression, evaluated by the statement itself.
func (s *Store) nowArg(ctx context.Context) (any, error) {
	if s.now != nil {
		return s.now().UnixMilli(), nil
	}
	k, err := s.kind(ctx)
	if err != nil {
		return nil, err
	}
	return gorm.Expr(dbClockSQL(k)), nil
}

// agoArg is "now minus d" as a statement argument, like nowArg.
func (s *Store) agoArg(ctx context.Context, d time.Duration) (any, error) {
	if s.now != nil {
		return s.now().UnixMilli() - d.Milliseconds(), nil
	}
	k, err := s.kind(ctx)
	if err != nil {
		return nil, err
	}
	return gorm.Expr("("+dbClockSQL(k)+" - ?)", d.Milliseconds()), nil
}

// ClockOffset implements relay.Store: the offset of the
// store's clock (the database's, or Options.Clock) to the host's wall clock
// (Options.HostClock), store minus host, as measured by the latest
// acquisition round, renewal or release, and its uncertainty (half that
// operation's clock read round trip, plus the millisecond resolution). ok
// is false before the first measurement. It never queries.
func (s *Store) ClockOffset() (offset, uncertainty time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offset.offset, s.offset.uncertainty, s.offset.ok
}
