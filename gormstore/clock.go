package gormstore

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// The database's clock
//
// Relays must agree on "now" for their leases, and the database is the one
// clock they all see. Each lease operation reads it once (nowMs) and uses
// that value for all its statements: a late statement then means what it
// meant when the operation started (a delayed heartbeat cannot revive a
// relay that stopped meanwhile), and the read measures the host's clock
// offset. Park and Fleet evaluate the expression inside their one
// statement (nowArg, agoArg).

// dbClockSQL is the dialect's current time in Unix milliseconds whatever
// the session's time zone: PostgreSQL's clock_timestamp (now() is fixed
// within a transaction), MySQL's UTC_TIMESTAMP (NOW() is ambiguous at
// daylight saving changes); "" for a dialect without a known expression.
func dbClockSQL(kind int) string {
	switch kind {
	case kindPostgres:
		return "(floor(extract(epoch from clock_timestamp()) * 1000)::bigint)"
	case kindMySQL, kindMariaDB:
		return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
	case kindSQLite:
		return "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER))"
	default:
		return ""
	}
}

// clockSample is the latest measurement of the host clock's offset.
type clockSample struct {
	offset      time.Duration // store clock minus the host clock's midpoint
	uncertainty time.Duration // half the round trip
	ok          bool
}

// nowMs returns "now" in Unix milliseconds for one lease operation, from
// Options.Clock or the database's clock, and records that clock's offset
// to the midpoint of the host readings around it, half their distance
// being the uncertainty.
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
	half := s.hostNow().Sub(before) / 2
	s.mu.Lock()
	s.offset = clockSample{offset: time.UnixMilli(now).Sub(before.Add(half)), uncertainty: max(half, -half) + time.Millisecond, ok: true}
	s.mu.Unlock()
	return now, nil
}

// dbNow reads the database's clock: one statement, no table read.
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

// nowArg is "now" as an argument of a single statement: Options.Clock's
// time when set, else the database's clock expression.
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

// ClockOffset implements relay.Store: the store's clock minus the host's
// (Options.HostClock) as the latest lease operation measured it, and its
// uncertainty; ok is false before the first measurement. It never queries.
func (s *Store) ClockOffset() (offset, uncertainty time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offset.offset, s.offset.uncertainty, s.offset.ok
}
