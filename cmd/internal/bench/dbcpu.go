package bench

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// clockTicks is Linux's USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat.
const clockTicks = 100

// backendCPU samples, every 200 ms, the CPU time of the PostgreSQL backends
// serving the run's database, from /proc/<pid>/stat of the pids
// pg_stat_activity lists (the server runs on this host, as
// scripts/services.sh starts it). A backend counts from the first sample or
// its birth; one that exits loses at most a sampling interval. Shared server
// processes (WAL writer, checkpointer) are left out: a lower bound,
// comparable between the contenders of one run.
type backendCPU struct {
	db     *sql.DB
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	first map[int]int64 // pid → ticks at its first sample (0 for pids born after the start)
	last  map[int]int64 // pid → ticks at its latest sample
	err   error
}

// startBackendCPU starts sampling on db, or returns nil when the database
// is not PostgreSQL or its backends' /proc entries cannot be read.
func (e *env) startBackendCPU(ctx context.Context, db *sql.DB) *backendCPU {
	if e.cfg.DB != "postgres" {
		return nil
	}
	b := &backendCPU{db: db, first: map[int]int64{}, last: map[int]int64{}, done: make(chan struct{})}
	if b.sample(ctx, true); b.err != nil || len(b.first) == 0 {
		return nil // no readable /proc entry: not this host
	}
	ctx, b.cancel = context.WithCancel(ctx)
	go func() {
		defer close(b.done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				b.sample(ctx, false)
			}
		}
	}()
	return b
}

func (b *backendCPU) pids(ctx context.Context) ([]int, error) {
	rows, err := b.db.QueryContext(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, rows.Err()
}

// sample reads the ticks of the database's backends; a backend first seen
// after the start counts from 0, its birth.
func (b *backendCPU) sample(ctx context.Context, start bool) {
	pids, err := b.pids(ctx)
	if err != nil {
		if ctx.Err() == nil {
			b.mu.Lock()
			b.err = err
			b.mu.Unlock()
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pid := range pids {
		t, err := procTicks(pid)
		if err != nil {
			continue // exited since the query
		}
		if _, ok := b.first[pid]; !ok {
			b.first[pid] = 0
			if start {
				b.first[pid] = t
			}
		}
		b.last[pid] = max(b.last[pid], t)
	}
}

// stop takes a last sample and returns the backends' CPU time since the
// start. It is nil-safe (0 and false for a nil sampler).
func (b *backendCPU) stop(ctx context.Context) (time.Duration, bool) {
	if b == nil {
		return 0, false
	}
	b.cancel()
	<-b.done
	b.sample(ctx, false)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, false
	}
	var ticks int64
	for pid, l := range b.last {
		ticks += l - b.first[pid]
	}
	return time.Duration(ticks) * time.Second / clockTicks, true
}

// procTicks returns utime + stime of pid in clock ticks.
func procTicks(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	u, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	s, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return u + s, nil
}
