package gormstore

import (
	"context"
	"time"
)

// Now returns the time on the store's clock: the database server's (one
// SELECT, bounded by Options.StatementTimeout), or Options.Clock's time when set.
// It is the clock every lease expiry, heartbeat, stopped stamp and
// parked_at_ms of the store is written and compared with, so a tool that
// reads those columns (outbox-relay status, say) compares them with Now,
// not with its host's clock. It does not change what ClockOffset reports.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.now != nil {
		return s.now(), nil
	}
	ms, err := s.dbNow(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(ms).UTC(), nil
}
