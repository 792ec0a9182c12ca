package gormstore

import (
	"context"
	"sync/atomic"
	"time"
)

// The pool's idle room
//
// A relay keeps several statements in flight on the *gorm.DB's pool: a
// fetch or publish per bucket it serves at once, the deletes beside them,
// its lease round. database/sql keeps 2 idle connections unless told
// otherwise, and closes every other one when its statement ends, so the
// next statement opens a new database session (a backend process on
// PostgreSQL, its prepared statements lost): a 100,000-row drain opened
// ~155 PostgreSQL sessions with the default against 38 with 16 idle, and
// fetches and deletes waited tens of milliseconds each. Nothing failed, so
// nothing said so; the store now watches the pool's count of connections
// closed for want of idle room (sql.DBStats.MaxIdleClosed) at each lease
// round and at most once a second from its deletes, and warns when it
// grows quickly.

const (
	// poolWatchWindow is the span over which the closes are counted.
	poolWatchWindow = 30 * time.Second
	// poolWatchCloses is how many closes within a window warn. Each is a
	// database session opened again; a pool with the idle room its relay
	// needs closes none. Four relays draining 200,000 rows over 1,024
	// buckets with database/sql's default of 2 idle closed 66-73 each in
	// 7.4 s, at about half the rate of pools keeping 16 (BENCHMARKS.md).
	poolWatchCloses = 50
	// poolWatchQuiet is the least time between two warnings.
	poolWatchQuiet = time.Hour
)

// poolWatch counts the pool's closes for want of idle room (guarded by
// Store.mu, except checked, which is atomic).
type poolWatch struct {
	since  time.Time // the window's start; zero: not started
	closed int64     // MaxIdleClosed at since
	warned time.Time // the latest warning
	// checked is the host clock's UnixNano at the latest check from the
	// hot path (watchPoolSoon).
	checked atomic.Int64
}

// watchPoolSoon is watchPool from the hot path (each delete), at most once
// a second: a relay whose drain ends between two lease rounds (10 s by
// default) is warned during the drain, when the churn costs.
func (s *Store) watchPoolSoon(ctx context.Context) {
	now := s.hostNow()
	last := s.pool.checked.Load()
	if now.UnixNano()-last < int64(time.Second) || !s.pool.checked.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	s.watchPool(ctx, now)
}

// watchPool checks the store's pool at now (the host's clock) and warns,
// at most once per poolWatchQuiet, as soon as a check (a lease round, or
// a delete through watchPoolSoon) finds that it closed at least
// poolWatchCloses connections for want of idle room since the window
// began: the first check after the closes, not the window's end (a drain's
// churn may be over by then, and a short drain then says nothing). A
// window that ends with fewer closes starts a new one.
func (s *Store) watchPool(ctx context.Context, now time.Time) {
	sqlDB, err := s.db.DB()
	if err != nil {
		return // not a *sql.DB (a transaction, a custom ConnPool)
	}
	stats := sqlDB.Stats()
	s.mu.Lock()
	w := &s.pool
	if w.since.IsZero() || stats.MaxIdleClosed < w.closed {
		w.since, w.closed = now, stats.MaxIdleClosed
		s.mu.Unlock()
		return
	}
	elapsed := now.Sub(w.since)
	n := stats.MaxIdleClosed - w.closed
	if n < poolWatchCloses {
		if elapsed >= poolWatchWindow {
			w.since, w.closed = now, stats.MaxIdleClosed
		}
		s.mu.Unlock()
		return
	}
	warn := w.warned.IsZero() || now.Sub(w.warned) >= poolWatchQuiet
	if warn {
		w.warned = now
	}
	w.since, w.closed = now, stats.MaxIdleClosed
	s.mu.Unlock()
	if warn {
		s.log.WarnContext(ctx, "gormstore: the connection pool closes connections it has no idle room for; each statement after them opens a new database session: raise the pool's SetMaxIdleConns to at least 2×MaxConcurrentBuckets+2 (docs/relays.md#scaling)",
			"closed", n, "within", elapsed.Round(time.Second), "open", stats.OpenConnections, "idle", stats.Idle, "max_open", stats.MaxOpenConnections)
	}
}
