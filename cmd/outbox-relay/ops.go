package main

// What status, check and rebucket share: the database they open, the
// database's clock, the outbox tables read through GORM, and times and
// bucket sets in human form.
//
// Lease expiries, heartbeats and stopped stamps are written on the
// database server's clock (gormstore reads it for every lease operation),
// so these commands compare them with the database's clock too
// (gormstore.Store.Now), never with this host's: a host whose clock is off
// still reports who owns what correctly. Row ages compare created_at,
// stamped by the writers' hosts, with the same database clock.

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/relay"
)

// opsDB is an open outbox database for status, check and rebucket.
type opsDB struct {
	db    *gorm.DB
	cfg   outbox.Config // with defaults
	c     *adminConfig
	store *gormstore.Store // for its clock
	close func()
}

// openOps opens the database of c for the command what. With tables it
// also requires the three outbox tables (check reports missing ones
// itself). A failure is reported on stderr; ok is false then.
func (e *adminEnv) openOps(ctx context.Context, what string, c *adminConfig, tables bool) (o *opsDB, ok bool) {
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	db, err := openDB(ctx, &c.dbConfig, log)
	closeDB := func() {
		if db == nil {
			return
		}
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	}
	if err != nil {
		closeDB()
		e.opsFail(ctx, what, fmt.Errorf("database unreachable (%s): %w", c.dbDriver, err))
		return nil, false
	}
	if tables {
		tctx, cancel := context.WithTimeout(ctx, cmp.Or(c.statementTimeout, gormstore.DefaultStatementTimeout))
		err = checkOutboxTables(tctx, db, &c.dbConfig)
		cancel()
		if err != nil {
			closeDB()
			e.opsFail(ctx, what, err)
			return nil, false
		}
	}
	store, err := gormstore.New(db, gormstore.Options{Config: c.outbox, StatementTimeout: c.statementTimeout})
	if err != nil { // checked by parseSubcommand; not expected
		closeDB()
		e.opsFail(ctx, what, err)
		return nil, false
	}
	return &opsDB{db: db, cfg: c.outbox.WithDefaults(), c: c, store: store, close: closeDB}, true
}

// opsFail reports a runtime failure of what on stderr and returns
// exitFailure. An interruption says so.
func (e *adminEnv) opsFail(ctx context.Context, what string, err error) int {
	if ctx.Err() != nil {
		fmt.Fprintf(e.stderr, "outbox-relay %s: interrupted (%v)\n", what, context.Cause(ctx))
		return exitFailure
	}
	fmt.Fprintf(e.stderr, "outbox-relay %s: %s\n", what, oneLine(err))
	return exitFailure
}

// dbClock is a reading of the database's clock.
type dbClock struct {
	// now is the database's time.
	now time.Time
	// hostAhead is this host's clock minus the database's, measured around
	// the reading (to within the round trip).
	hostAhead time.Duration
}

// clock reads the database's clock (gormstore.Store.Now, or e.dbNow).
func (e *adminEnv) clock(ctx context.Context, o *opsDB) (dbClock, error) {
	before := e.now()
	var now time.Time
	var err error
	if e.dbNow != nil {
		now, err = e.dbNow(ctx)
	} else {
		now, err = o.store.Now(ctx)
	}
	if err != nil {
		return dbClock{}, fmt.Errorf("read the database clock: %w", err)
	}
	after := e.now()
	mid := before.Add(after.Sub(before) / 2)
	return dbClock{now: now.UTC(), hostAhead: mid.Sub(now).Round(100 * time.Millisecond)}, nil
}

// leaseRow is a row of the leases table.
type leaseRow struct {
	Bucket      int64
	Owner       *string
	ExpiresAtMs int64
}

// held reports whether the lease is held at now (Unix ms): an owner and an
// expiry after now, as the relays count it.
func (l leaseRow) held(nowMs int64) bool { return l.Owner != nil && l.ExpiresAtMs > nowMs }

// leases reads every lease row, in bucket order (gormstore.Store.Leases).
func (o *opsDB) leases(ctx context.Context) ([]leaseRow, error) {
	ls, err := o.store.Leases(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]leaseRow, len(ls))
	for i, l := range ls {
		rows[i] = leaseRow{Bucket: int64(l.Bucket), Owner: l.Owner, ExpiresAtMs: l.ExpiresAtMs}
	}
	return rows, nil
}

// relayRow is a row of the relays (heartbeat) table.
type relayRow struct {
	RelayID     string
	LastSeenMs  int64
	StoppedAtMs *int64
	Features    int64
}

// relays reads every heartbeat row, in relay id order
// (gormstore.Store.Heartbeats).
func (o *opsDB) relays(ctx context.Context) ([]relayRow, error) {
	hs, err := o.store.Heartbeats(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]relayRow, len(hs))
	for i, h := range hs {
		rows[i] = relayRow(h)
	}
	return rows, nil
}

// Relay states, as status and check show them.
const (
	relayLive    = "live"    // a heartbeat within -lease-duration, not stopped
	relayStopped = "stopped" // stopped gracefully (its leases released)
	relaySilent  = "silent"  // no heartbeat within -lease-duration: crashed, stalled or cut off
)

// state is the relay's state at now (Unix ms) for the lease duration ld,
// as the relays count each other: live while its heartbeat is newer than
// ld and it has not stopped.
func (r relayRow) state(nowMs int64, ld time.Duration) string {
	switch {
	case r.StoppedAtMs != nil:
		return relayStopped
	case r.LastSeenMs > nowMs-ld.Milliseconds():
		return relayLive
	}
	return relaySilent
}

// bucketRows is what the messages table holds in one bucket.
type bucketRows = gormstore.BucketBacklog

// bucketRows counts the pending and parked rows of every bucket that has
// any, with each one's oldest pending row (gormstore.Store.Backlog).
func (o *opsDB) bucketRows(ctx context.Context) ([]bucketRows, error) {
	return o.store.Backlog(ctx)
}

// ms returns Unix milliseconds as a UTC time.
func ms(v int64) time.Time { return time.UnixMilli(v).UTC() }

// ago returns "12s ago" for t before now ("0s ago" for a time ahead).
func ago(now, t time.Time) string { return age(now, t) + " ago" }

// leaseText describes a lease at now: "expires in 24s", "expired 3m05s
// ago" or "free" (no owner, or no lease row).
func leaseText(l *leaseRow, now time.Time) string {
	switch {
	case l == nil || l.Owner == nil:
		return "free"
	case l.held(now.UnixMilli()):
		return "expires in " + age(ms(l.ExpiresAtMs), now)
	}
	return "expired " + ago(now, ms(l.ExpiresAtMs))
}

// durText returns d as time.Duration.String does, without zero trailing
// units: 5m, 1h30m, 90s is 1m30s.
func durText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// bucketList returns buckets (sorted, distinct) as ranges: "0-3, 5, 7-8".
func bucketList(buckets []int) string {
	buckets = slices.Compact(slices.Sorted(slices.Values(buckets)))
	var parts []string
	for i := 0; i < len(buckets); {
		j := i + 1
		for j < len(buckets) && buckets[j] == buckets[j-1]+1 {
			j++
		}
		if j-i == 1 {
			parts = append(parts, strconv.Itoa(buckets[i]))
		} else {
			parts = append(parts, strconv.Itoa(buckets[i])+"-"+strconv.Itoa(buckets[j-1]))
		}
		i = j
	}
	return strings.Join(parts, ", ")
}

// bucketsNoun returns "bucket 3" or "buckets 0-3, 5".
func bucketsNoun(buckets []int) string {
	if len(buckets) == 1 {
		return "bucket " + strconv.Itoa(buckets[0])
	}
	return "buckets " + bucketList(buckets)
}

// leaseDurationFlag declares -lease-duration for the commands that tell
// live relays from silent ones: the relay's flag (name, default and
// variable; status, check and rebucket read it from the environment too,
// so that a relay pod's OUTBOX_LEASE_DURATION applies).
func leaseDurationFlag(fs *flag.FlagSet, c *adminConfig) {
	durationVar(fs, &c.leaseDuration, "lease-duration", relay.DefaultLeaseDuration,
		"the relays' -lease-duration: a relay whose last heartbeat is older, and that has not stopped, is silent (crashed, stalled or cut off)")
}

// checkLeaseDuration checks -lease-duration.
func checkLeaseDuration(c *adminConfig) error {
	if c.leaseDuration <= 0 {
		return fmt.Errorf("-lease-duration %q: must be positive", c.leaseDuration.String())
	}
	return nil
}
