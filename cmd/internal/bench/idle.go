package bench

import (
	"context"
	"fmt"
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

// stmtCounter counts the statements GORM runs, by kind.
type stmtCounter struct {
	mu     sync.Mutex
	kinds  map[string]int
	counts bool
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
	if c.counts {
		c.kinds[kind]++
	}
	c.mu.Unlock()
}

func (c *stmtCounter) start() {
	c.mu.Lock()
	c.kinds, c.counts = map[string]int{}, true
	c.mu.Unlock()
}

func (c *stmtCounter) stop() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts = false
	return c.kinds
}

// register adds the counting callback after each of gorm's statement
// callbacks.
func (c *stmtCounter) register(db *gorm.DB) error {
	cb := db.Callback()
	for _, r := range []struct {
		after string
		reg   func(string, func(*gorm.DB)) error
	}{
		{"gorm:create", cb.Create().After("gorm:create").Register},
		{"gorm:query", cb.Query().After("gorm:query").Register},
		{"gorm:update", cb.Update().After("gorm:update").Register},
		{"gorm:delete", cb.Delete().After("gorm:delete").Register},
		{"gorm:row", cb.Row().After("gorm:row").Register},
		{"gorm:raw", cb.Raw().After("gorm:raw").Register},
	} {
		if err := r.reg("bench:count", c.record); err != nil {
			return fmt.Errorf("register counter after %s: %w", r.after, err)
		}
	}
	return nil
}

func runIdle(ctx context.Context, e *env) ([]IdleResult, error) {
	var out []IdleResult
	for _, n := range e.cfg.IdleFleets {
		r, err := e.idle(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (e *env) idle(ctx context.Context, n int) (IdleResult, error) {
	e.cfg.Logger.Info("bench: idle", "relays", n, "window", e.cfg.IdleWindow)
	admin, err := e.open(nil)
	if err != nil {
		return IdleResult{}, err
	}
	defer closeDB(admin)
	if err := e.reset(admin); err != nil {
		return IdleResult{}, err
	}
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
	c.start()
	start := time.Now()
	sleep(ctx, e.cfg.IdleWindow)
	window := time.Since(start)
	kinds := c.stop()
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

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
