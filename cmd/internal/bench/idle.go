package bench

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// IdleResult is the statement rate of an idle relay fleet on an empty
// table, counted with GORM callbacks on the relays' connections.
type IdleResult struct {
	Relays        int     `json:"relays"`
	WindowSeconds float64 `json:"window_seconds"`
	Statements    int     `json:"statements"`
	// PerSec is the fleet's statements per second.
	PerSec float64 `json:"per_sec"`
	// PendingPerRelaySec is the pending-row discovery queries per second
	// and relay (target: at most 1 with the default 1s poll interval).
	PendingPerRelaySec float64 `json:"pending_per_relay_sec"`
	// UpkeepPerRelaySec is every other statement (heartbeat, leases) per
	// second and relay.
	UpkeepPerRelaySec float64 `json:"upkeep_per_relay_sec"`
	// ByKind counts statements by kind over the window.
	ByKind map[string]int `json:"by_kind"`
}

// stmtCounter counts the statements GORM runs, by kind, while kinds is not
// nil.
type stmtCounter struct {
	mu    sync.Mutex
	kinds map[string]int
}

func (c *stmtCounter) record(db *gorm.DB) {
	sql := db.Statement.SQL.String()
	if sql == "" {
		return
	}
	kind := "other"
	switch {
	case strings.Contains(sql, "EXISTS (SELECT 1 FROM") && strings.Contains(sql, outbox.DefaultMessagesTable):
		kind = "pending discovery"
	case strings.Contains(sql, outbox.DefaultRelaysTable) && strings.HasPrefix(sql, "INSERT"):
		kind = "heartbeat"
	case strings.Contains(sql, outbox.DefaultRelaysTable):
		kind = "relays read/prune"
	case strings.Contains(sql, outbox.DefaultLeasesTable):
		kind = "lease read/write"
	case strings.Contains(sql, outbox.DefaultMessagesTable):
		kind = "messages probe"
	}
	c.mu.Lock()
	if c.kinds != nil {
		c.kinds[kind]++
	}
	c.mu.Unlock()
}

// swap sets the counts to kinds and returns the previous ones.
func (c *stmtCounter) swap(kinds map[string]int) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.kinds
	c.kinds = kinds
	return old
}

// register adds the counting callback after each of gorm's statement
// callbacks.
func (c *stmtCounter) register(db *gorm.DB) error {
	cb := db.Callback()
	return errors.Join(
		cb.Create().After("gorm:create").Register("bench:count", c.record),
		cb.Query().After("gorm:query").Register("bench:count", c.record),
		cb.Update().After("gorm:update").Register("bench:count", c.record),
		cb.Delete().After("gorm:delete").Register("bench:count", c.record),
		cb.Row().After("gorm:row").Register("bench:count", c.record),
		cb.Raw().After("gorm:raw").Register("bench:count", c.record))
}

func (e *env) idle(ctx context.Context, n int) (IdleResult, error) {
	e.cfg.Logger.Info("bench: idle", "relays", n, "window", e.cfg.IdleWindow)
	admin, _, done, err := e.scenario(ctx, "")
	if err != nil {
		return IdleResult{}, err
	}
	defer done()
	c := &stmtCounter{}
	f, err := e.startFleet(ctx, n, func() (*gorm.DB, error) {
		db, err := e.open(nil)
		if err == nil {
			if err = c.register(db); err != nil {
				closeDB(db)
			}
		}
		return db, err
	}, relay.Options{}, nil)
	if err != nil {
		return IdleResult{}, err
	}
	defer f.stop()
	if err := e.waitBalanced(ctx, admin, n); err != nil {
		return IdleResult{}, err
	}
	c.swap(map[string]int{})
	start := time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(e.cfg.IdleWindow):
	}
	window := time.Since(start)
	kinds := c.swap(nil)
	if err := f.stop(); err != nil {
		return IdleResult{}, err
	}
	if ctx.Err() != nil {
		return IdleResult{}, ctx.Err()
	}
	total := 0
	for _, v := range kinds {
		total += v
	}
	secs := window.Seconds()
	pending := kinds["pending discovery"]
	return IdleResult{Relays: n, WindowSeconds: secs, Statements: total, PerSec: float64(total) / secs,
		PendingPerRelaySec: float64(pending) / secs / float64(n),
		UpkeepPerRelaySec:  float64(total-pending) / secs / float64(n), ByKind: kinds}, nil
}
