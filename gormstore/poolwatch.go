package gormstore

import (
	"context"
	"sync/atomic"
	"time"
)

// The pool's idle room
//
// A relay keeps several statements in flight on the pool, and database/sql
// keeps 2 idle connections unless told otherwise: it closes every other
// one when its statement ends, and the next statement opens a new database
// session. Nothing fails, so the store watches sql.DBStats.MaxIdleClosed
// and warns when it grows quickly.

const (
	// poolWatchWindow is the span over which the closes are counted.
	poolWatchWindow = 30 * time.Second
	// poolWatchCloses is how many closes within a window warn; a pool with
	// the idle room its relay needs closes none.
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

// watchPoolSoon is watchPool from the hot path, at most once a second: a
// drain that ends between two lease rounds is warned during the drain.
func (s *Store) watchPoolSoon(ctx context.Context) {
	now := s.hostNow()
	last := s.pool.checked.Load()
	if now.UnixNano()-last < int64(time.Second) || !s.pool.checked.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	s.watchPool(ctx, now)
}

// watchPool warns, at most once per poolWatchQuiet, at the first check
// that finds poolWatchCloses closes for want of idle room since the window
// began; a window that ends with fewer starts a new one.
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
