package main

// What the subcommands share: the store they open, the database's clock,
// and times and bucket sets in human form. Lease expiries and heartbeats
// are written on the database's clock, so status, check and rebucket
// compare them with it (gormstore.Store.Now), never with this host's.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/relay"
)

// opsDB is an open outbox database for status, check and rebucket.
type opsDB struct {
	cfg   outbox.Config // with defaults
	c     *adminConfig
	store *gormstore.Store
	close func()
}

// openStore opens the database of c and a store on it; with tables, it
// requires the three outbox tables. Its errors are runtime failures.
func openStore(ctx context.Context, c *dbConfig, log *slog.Logger, tables bool) (*gormstore.Store, func(), error) {
	db, err := openDB(ctx, c, log)
	if err != nil {
		return nil, nil, fmt.Errorf("database unreachable (%s): %w", c.dbDriver, err)
	}
	if tables {
		err = checkOutboxTables(ctx, db, c)
	}
	var store *gormstore.Store
	if err == nil {
		store, err = gormstore.New(db, gormstore.Options{Config: c.outbox, StatementTimeout: c.statementTimeout})
	}
	if err != nil {
		closeDB(db)
		return nil, nil, err
	}
	return store, func() { closeDB(db) }, nil
}

// openStoreAdmin is adminEnv.open for the process: the store on the
// database of c, its tables required.
func openStoreAdmin(ctx context.Context, c *dbConfig, log *slog.Logger) (relay.ParkAdmin, func(), error) {
	store, closeFn, err := openStore(ctx, c, log, true)
	return store, closeFn, err
}

// logger is the subcommands' logger: warnings and errors on stderr.
func (e *adminEnv) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// openOps opens the database of c for the command what, reporting a
// failure on stderr (ok false). With tables it requires the outbox tables.
func (e *adminEnv) openOps(ctx context.Context, what string, c *adminConfig, tables bool) (o *opsDB, ok bool) {
	store, closeFn, err := openStore(ctx, &c.dbConfig, e.logger(), tables)
	if err != nil {
		e.fail(ctx, what, err)
		return nil, false
	}
	return &opsDB{cfg: c.outbox.WithDefaults(), c: c, store: store, close: closeFn}, true
}

// fail reports a runtime failure of what (the command and its selector) on
// stderr and returns exitFailure. An interruption says so: the outcome of a
// statement cut short is unknown.
func (e *adminEnv) fail(ctx context.Context, what string, err error) int {
	switch {
	case ctx.Err() == nil:
		fmt.Fprintf(e.stderr, "outbox-relay %s: %s\n", what, oneLine(err))
	case slices.Contains([]string{"parked", "requeue", "discard"}, strings.Fields(what)[0]):
		fmt.Fprintf(e.stderr, "outbox-relay %s: interrupted (%v); run outbox-relay parked to see what is parked now\n", what, context.Cause(ctx))
	default:
		fmt.Fprintf(e.stderr, "outbox-relay %s: interrupted (%v)\n", what, context.Cause(ctx))
	}
	return exitFailure
}

// output writes rep as indented JSON with -json, else with text.
func (e *adminEnv) output(c *adminConfig, rep any, text func(io.Writer) error) error {
	if !c.asJSON {
		return text(e.stdout)
	}
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// dbClock is a reading of the database's clock: now, and this host's clock
// minus the database's, measured around the reading.
type dbClock struct {
	now       time.Time
	hostAhead time.Duration
}

// clock reads the database's clock (gormstore.Store.Now, or e.dbNow).
func (e *adminEnv) clock(ctx context.Context, o *opsDB) (dbClock, error) {
	before := e.now()
	dbNow := e.dbNow
	if dbNow == nil {
		dbNow = o.store.Now
	}
	now, err := dbNow(ctx)
	if err != nil {
		return dbClock{}, fmt.Errorf("read the database clock: %w", err)
	}
	mid := before.Add(e.now().Sub(before) / 2)
	return dbClock{now: now.UTC(), hostAhead: mid.Sub(now).Round(100 * time.Millisecond)}, nil
}

// leaseRow, relayRow and bucketRows are the rows the subcommands read.
type (
	leaseRow   = outbox.BucketLease
	relayRow   = outbox.RelayHeartbeat
	bucketRows = gormstore.BucketBacklog
)

// held reports whether l is held at nowMs, as the relays count it.
func held(l leaseRow, nowMs int64) bool { return l.Owner != nil && l.ExpiresAtMs > nowMs }

// Relay states, as status and check show them.
const (
	relayLive    = "live"    // a heartbeat within -lease-duration, not stopped
	relayStopped = "stopped" // stopped gracefully (its leases released)
	relaySilent  = "silent"  // no heartbeat within -lease-duration: crashed, stalled or cut off
)

// relayState is r's state at nowMs for the lease duration ld, as the relays
// count each other.
func relayState(r relayRow, nowMs int64, ld time.Duration) string {
	switch {
	case r.StoppedAtMs != nil:
		return relayStopped
	case r.LastSeenMs > nowMs-ld.Milliseconds():
		return relayLive
	}
	return relaySilent
}

func ms(v int64) time.Time { return time.UnixMilli(v).UTC() }

// ago returns "12s ago" for t before now ("0s ago" for a time ahead).
func ago(now, t time.Time) string { return age(now, t) + " ago" }

// leaseText describes a lease at now: "expires in 24s", "expired 3m05s
// ago" or "free" (no owner, or no lease row).
func leaseText(l *leaseRow, now time.Time) string {
	switch {
	case l == nil || l.Owner == nil:
		return "free"
	case held(*l, now.UnixMilli()):
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
		j := i // buckets[i:j+1] is one range
		for j+1 < len(buckets) && buckets[j+1] == buckets[j]+1 {
			j++
		}
		part := strconv.Itoa(buckets[i])
		if j > i {
			part += "-" + strconv.Itoa(buckets[j])
		}
		parts = append(parts, part)
		i = j + 1
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

// someBuckets is bucketsNoun with at most maxProblemBuckets ranges:
// "buckets 0-3, 5, … (40 buckets)".
func someBuckets(buckets []int) string {
	s := bucketsNoun(buckets)
	if parts := strings.Split(s, ", "); len(parts) > maxProblemBuckets {
		s = strings.Join(parts[:maxProblemBuckets], ", ") + fmt.Sprintf(", … (%d buckets)", len(buckets))
	}
	return s
}

// leaseDurationFlag declares the relays' -lease-duration (status, check and
// rebucket read it from the environment too, as a relay pod's).
func leaseDurationFlag(fs *flag.FlagSet, c *adminConfig) {
	durationVar(fs, &c.leaseDuration, "lease-duration", relay.DefaultLeaseDuration,
		"the relays' -lease-duration: a relay whose last heartbeat is older, and that has not stopped, is silent (crashed, stalled or cut off)")
}

// leaseDurationRule refuses a -lease-duration that is not positive.
func leaseDurationRule(c *adminConfig) rule {
	return rule{c.leaseDuration <= 0, fmt.Sprintf("-lease-duration %q: must be positive", c.leaseDuration.String())}
}
