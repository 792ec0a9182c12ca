package main

// The status subcommand: the backlog, leases and relays of an outbox, per
// bucket, and whether it is healthy.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gorm-outbox/outbox"
)

// defaultStatusMaxAge is the default -max-age of status: docs/operating.md's
// OutboxBacklogOld alert threshold.
const defaultStatusMaxAge = 5 * time.Minute

// statusAllBucketsUpTo is the largest bucket count whose buckets status
// lists in full by default.
const statusAllBucketsUpTo = 64

// maxProblemBuckets bounds the buckets a problem line names one by one.
const maxProblemBuckets = 10

var statusCommand = &subcommand{
	name:     "status",
	readOnly: true,
	args:     "[-json] [-max-age D] [-all-buckets]",
	summary:  "backlog, lease owner and expiry per bucket, relays, totals; exit 1 unless healthy",
	doc: `Shows, per bucket, the pending rows, the age of the oldest one, the parked
rows, and the lease: its owner and "expires in 24s", "expired 3m05s ago" or
"free"; then every relay of the heartbeat table (live, silent or stopped,
when it was last seen, the buckets it holds); then the totals, and the
problems, if any. Lease expiries and heartbeats are compared with the
database's clock, on which the relays write them (never this host's); row
ages compare created_at, stamped by the writers, with the same clock. A
relay is live while its last heartbeat is newer than -lease-duration and it
has not stopped. With more than 64 buckets only the buckets with rows or
without a live owner are listed, unless -all-buckets. The counts come from
one aggregate over the messages table (a scan of its index: about 0.2 s per
million rows on PostgreSQL).

Healthy means: every bucket has a live owner (a lease whose expiry is
ahead), no pending row is older than -max-age, and no row or lease row lies
in a bucket outside -bucket-count. Parked rows are listed, not counted as unhealthy
(see outbox-relay parked).`,
	flags: func(fs *flag.FlagSet, c *adminConfig) {
		fs.BoolVar(&c.asJSON, "json", false, "print one JSON object (every bucket, relay and problem) instead of the tables")
		durationVar(fs, &c.maxAge, "max-age", defaultStatusMaxAge, "unhealthy when a bucket's oldest pending row is older than this (0: no age check)")
		fs.BoolVar(&c.allBuckets, "all-buckets", false, fmt.Sprintf("list every bucket (default: every bucket up to %d buckets, else those with rows or without a live owner)", statusAllBucketsUpTo))
		leaseDurationFlag(fs, c)
	},
	check: func(_ *flag.FlagSet, c *adminConfig) error {
		return firstBroken(rule{c.maxAge < 0, fmt.Sprintf("-max-age %q: must not be negative (0: no age check)", c.maxAge.String())},
			leaseDurationRule(c))
	},
	exit: `Exit status: 0 healthy; 1 unhealthy (the problems are listed last, and
in "problems" with -json), or a runtime failure (database unreachable, outbox
tables missing, interrupted by SIGINT or SIGTERM: one line on stderr,
nothing on stdout); 2 bad usage or configuration (one error line naming the
flag, before any connection).`,
	run: runStatus,
}

// statusReport is what status shows; with -json it is printed as is.
type statusReport struct {
	MessagesTable string    `json:"messages_table"`
	BucketCount   int       `json:"bucket_count"`
	DatabaseTime  time.Time `json:"database_time"`
	// HostAheadSeconds is this host's clock minus the database's.
	HostAheadSeconds     float64 `json:"host_ahead_seconds"`
	LeaseDurationSeconds float64 `json:"lease_duration_seconds"`
	MaxAgeSeconds        float64 `json:"max_age_seconds"`
	Healthy              bool    `json:"healthy"`
	// Problems is empty when Healthy; one sentence each.
	Problems []string       `json:"problems"`
	Totals   statusTotals   `json:"totals"`
	Buckets  []bucketStatus `json:"buckets"`
	// Outside lists the buckets outside [0, BucketCount) that hold rows or
	// have a lease row.
	Outside []bucketStatus `json:"outside_buckets"`
	Relays  []relayStatus  `json:"relays"`
}

type statusTotals struct {
	Pending int64 `json:"pending"`
	Parked  int64 `json:"parked"`
	// OldestAgeSeconds and OldestBucket are the oldest pending row's, null
	// when nothing is pending.
	OldestAgeSeconds *int64 `json:"oldest_age_seconds"`
	OldestBucket     *int   `json:"oldest_bucket"`
	BucketsOwned     int    `json:"buckets_owned"`
	RelaysLive       int    `json:"relays_live"`
	RelaysSilent     int    `json:"relays_silent"`
	RelaysStopped    int    `json:"relays_stopped"`

	oldest time.Time
}

type bucketStatus struct {
	Bucket           int        `json:"bucket"`
	Pending          int64      `json:"pending"`
	OldestCreatedAt  *time.Time `json:"oldest_created_at"`
	OldestAgeSeconds *int64     `json:"oldest_age_seconds"`
	Parked           int64      `json:"parked"`
	// Lease is "held" (an owner, expiry ahead), "expired" (an owner,
	// expiry past) or "free" (no owner, or no lease row yet).
	Lease string `json:"lease"`
	// Owner is the lease's owner, null when free.
	Owner          *string    `json:"owner"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	// LeaseExpiresInSeconds is negative for an expired lease.
	LeaseExpiresInSeconds *int64 `json:"lease_expires_in_seconds"`

	lease *leaseRow
}

// relayStatus is one relay of the heartbeat table, or a lease owner
// without a heartbeat row (state "unknown").
type relayStatus struct {
	ID string `json:"id"`
	// State is live, silent, stopped, or unknown (no heartbeat row).
	State              string     `json:"state"`
	LastSeenAt         *time.Time `json:"last_seen_at"`
	LastSeenSecondsAgo *int64     `json:"last_seen_seconds_ago"`
	StoppedAt          *time.Time `json:"stopped_at"`
	// Buckets are those it holds a lease on (expiry ahead).
	Buckets []int `json:"buckets"`
	// Parking is whether its heartbeat announces parking support.
	Parking bool `json:"parking"`
}

// buildStatus assembles the report from the tables as read at clk.
func buildStatus(cfg outbox.Config, clk dbClock, ld, maxAge time.Duration, rows []bucketRows, leases []leaseRow, relays []relayRow) *statusReport {
	now := clk.now
	nowMs := now.UnixMilli()
	n := cfg.BucketCount
	rep := &statusReport{
		MessagesTable: cfg.MessagesTableName(), BucketCount: n, DatabaseTime: now,
		HostAheadSeconds: clk.hostAhead.Seconds(), LeaseDurationSeconds: ld.Seconds(), MaxAgeSeconds: maxAge.Seconds(),
		Problems: []string{}, Buckets: make([]bucketStatus, n), Outside: []bucketStatus{}, Relays: []relayStatus{},
	}
	for i := range rep.Buckets {
		rep.Buckets[i] = bucketStatus{Bucket: i, Lease: "free"}
	}
	secondsPtr := func(d time.Duration) *int64 { s := int64(d / time.Second); return &s }
	timePtr := func(t time.Time) *time.Time { return &t }
	outside := map[int]*bucketStatus{}
	bucket := func(i int) *bucketStatus {
		if i >= 0 && i < n {
			return &rep.Buckets[i]
		}
		if outside[i] == nil {
			outside[i] = &bucketStatus{Bucket: i, Lease: "free"}
		}
		return outside[i]
	}
	for _, r := range rows {
		b := bucket(r.Bucket)
		b.Pending, b.Parked = r.Pending, r.Parked
		if r.Pending > 0 && !r.Oldest.IsZero() {
			b.OldestCreatedAt = timePtr(r.Oldest)
			b.OldestAgeSeconds = secondsPtr(max(now.Sub(r.Oldest), 0))
		}
	}
	owned := map[string][]int{}
	var leasesOutside []int
	var holdersOutside []string
	for i := range leases {
		l := &leases[i]
		inside := l.Bucket >= 0 && int(l.Bucket) < n
		if !inside {
			// A relay with another bucket count, or a wrong -bucket-count
			// here: listed with the rows outside, and a problem.
			leasesOutside = append(leasesOutside, int(l.Bucket))
		}
		b := bucket(int(l.Bucket))
		b.lease = l
		if l.Owner == nil {
			continue
		}
		b.Owner = l.Owner
		b.LeaseExpiresAt = timePtr(ms(l.ExpiresAtMs))
		b.LeaseExpiresInSeconds = secondsPtr(ms(l.ExpiresAtMs).Sub(now))
		if !held(*l, nowMs) {
			b.Lease = "expired"
			continue
		}
		b.Lease = "held"
		owned[*l.Owner] = append(owned[*l.Owner], int(l.Bucket))
		if inside {
			rep.Totals.BucketsOwned++
		} else if !slices.Contains(holdersOutside, *l.Owner) {
			holdersOutside = append(holdersOutside, *l.Owner)
		}
	}
	for _, i := range slices.Sorted(maps.Keys(outside)) {
		rep.Outside = append(rep.Outside, *outside[i])
	}

	// Relays, and lease owners without a heartbeat row.
	seen := map[string]bool{}
	for _, r := range relays {
		seen[r.RelayID] = true
		rs := relayStatus{
			ID: r.RelayID, State: relayState(r, nowMs, ld), LastSeenAt: timePtr(ms(r.LastSeenMs)),
			LastSeenSecondsAgo: secondsPtr(max(now.Sub(ms(r.LastSeenMs)), 0)),
			Buckets:            append([]int{}, owned[r.RelayID]...), Parking: r.Features&outbox.RelayFeatureParking != 0,
		}
		if r.StoppedAtMs != nil {
			rs.StoppedAt = timePtr(ms(*r.StoppedAtMs))
		}
		rep.Relays = append(rep.Relays, rs)
	}
	for _, b := range rep.Buckets {
		if b.Lease == "held" && !seen[*b.Owner] {
			seen[*b.Owner] = true
			rep.Relays = append(rep.Relays, relayStatus{ID: *b.Owner, State: "unknown", Buckets: owned[*b.Owner]})
		}
	}
	states := map[string]int{}
	for _, r := range rep.Relays {
		states[r.State]++
	}
	rep.Totals.RelaysLive, rep.Totals.RelaysSilent, rep.Totals.RelaysStopped = states[relayLive], states[relaySilent], states[relayStopped]

	// Totals and problems.
	var unowned, aged []int
	oldestAged, oldestAgedBucket := time.Duration(0), 0
	for _, b := range rep.Buckets {
		rep.Totals.Pending += b.Pending
		rep.Totals.Parked += b.Parked
		if b.Lease != "held" {
			unowned = append(unowned, b.Bucket)
		}
		if b.OldestCreatedAt == nil {
			continue
		}
		if t := &rep.Totals; t.oldest.IsZero() || b.OldestCreatedAt.Before(t.oldest) {
			t.oldest, t.OldestBucket, t.OldestAgeSeconds = *b.OldestCreatedAt, &b.Bucket, b.OldestAgeSeconds
		}
		if a := now.Sub(*b.OldestCreatedAt); maxAge > 0 && a > maxAge {
			aged = append(aged, b.Bucket)
			if a > oldestAged {
				oldestAged, oldestAgedBucket = a, b.Bucket
			}
		}
	}
	var buckets []int
	var rowsOutside int64
	for _, b := range rep.Outside {
		if b.Pending+b.Parked > 0 {
			buckets = append(buckets, b.Bucket)
			rowsOutside += b.Pending + b.Parked
		}
	}
	if len(leasesOutside) > 0 {
		held := ""
		if len(holdersOutside) > 0 {
			held = ", held by " + strings.Join(holdersOutside, ", ")
		}
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s has lease rows for %s, outside -bucket-count %d%s: a relay runs with another bucket count, or this command's -bucket-count is not the fleet's (see outbox-relay check)",
			cfg.LeasesTableName(), someBuckets(leasesOutside), n, held))
	}
	if rowsOutside > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s holds %s in %s, outside -bucket-count %d: writers and relays disagree, and relays stop with ErrMisconfigured (see outbox-relay check)",
			rep.MessagesTable, plural(rowsOutside, "row"), bucketsNoun(buckets), n))
	}
	if len(unowned) > 0 {
		why := "lease free or expired"
		if rep.Totals.RelaysLive == 0 {
			why = "no relay is live"
		}
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: no live owner (%s)", someBuckets(unowned), why))
	}
	if len(aged) > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: pending rows older than -max-age %s (oldest %s, bucket %d)",
			someBuckets(aged), durText(maxAge), age(now, now.Add(-oldestAged)), oldestAgedBucket))
	}
	rep.Healthy = len(rep.Problems) == 0
	return rep
}

func runStatus(ctx context.Context, e *adminEnv, c *adminConfig) int {
	o, ok := e.openOps(ctx, "status", c, true)
	if !ok {
		return exitFailure
	}
	defer o.close()
	var rows []bucketRows
	var leases []leaseRow
	var relays []relayRow
	clk, err := e.clock(ctx, o)
	if err == nil {
		rows, err = o.store.Backlog(ctx)
	}
	if err == nil {
		leases, err = o.store.Leases(ctx)
	}
	if err == nil {
		relays, err = o.store.Heartbeats(ctx)
	}
	if err != nil {
		return e.fail(ctx, "status", err)
	}
	rep := buildStatus(o.cfg, clk, c.leaseDuration, c.maxAge, rows, leases, relays)
	if err := e.output(c, rep, func(w io.Writer) error {
		return writeStatus(w, rep, clk, c.allBuckets || o.cfg.BucketCount <= statusAllBucketsUpTo)
	}); err != nil {
		return e.fail(ctx, "status", err)
	}
	if !rep.Healthy {
		return exitFailure
	}
	return exitOK
}

// writeStatus writes the report as tables; all lists every bucket, else
// only those with rows or without a live owner.
func writeStatus(w io.Writer, rep *statusReport, clk dbClock, all bool) error {
	now := rep.DatabaseTime
	fmt.Fprintf(w, "%s: %s, at %s on the database's clock\n", rep.MessagesTable, plural(int64(rep.BucketCount), "bucket"), now.Format("2006-01-02 15:04:05 UTC"))
	if d := clk.hostAhead; d >= time.Second || d <= -time.Second {
		dir := "ahead of"
		if d < 0 {
			dir, d = "behind", -d
		}
		fmt.Fprintf(w, "(this host's clock is %s %s it; every time below is on the database's)\n", durText(d), dir)
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "BUCKET\tPENDING\tOLDEST\tPARKED\tOWNER\tLEASE\n")
	hidden := 0
	line := func(b bucketStatus, lease string) {
		oldest, owner := "-", "-"
		if b.OldestCreatedAt != nil {
			oldest = age(now, *b.OldestCreatedAt)
		}
		if b.Owner != nil {
			owner = *b.Owner
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t%s\n", b.Bucket, b.Pending, oldest, b.Parked, owner, lease)
	}
	for _, b := range rep.Buckets {
		if !all && b.Pending == 0 && b.Parked == 0 && b.Lease == "held" {
			hidden++
			continue
		}
		line(b, leaseText(b.lease, now))
	}
	for _, b := range rep.Outside {
		line(b, fmt.Sprintf("outside -bucket-count %d", rep.BucketCount))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if hidden > 0 {
		fmt.Fprintf(w, "(%s not listed: no rows, owned; -all-buckets lists them)\n", plural(int64(hidden), "other bucket"))
	}

	fmt.Fprintln(w)
	if len(rep.Relays) == 0 {
		fmt.Fprintf(w, "no relay has a heartbeat row\n")
	} else {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "RELAY\tSTATE\tLAST SEEN\tBUCKETS\n")
		for _, r := range rep.Relays {
			seen, state, buckets := "-", r.State, "-"
			if r.LastSeenAt != nil {
				seen = ago(now, *r.LastSeenAt)
			}
			if r.StoppedAt != nil {
				state = "stopped " + ago(now, *r.StoppedAt)
			}
			if r.State == "unknown" {
				state = "unknown (no heartbeat row)"
			}
			if len(r.Buckets) > 0 {
				buckets = fmt.Sprintf("%s (%d)", bucketList(r.Buckets), len(r.Buckets))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, state, seen, buckets)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	t := rep.Totals
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%d pending", t.Pending)
	if t.OldestAgeSeconds != nil {
		fmt.Fprintf(w, " (oldest %s, bucket %d)", age(now, t.oldest), *t.OldestBucket)
	}
	fmt.Fprintf(w, ", %d parked; %d of %d buckets owned; relays: %d live, %d silent, %d stopped\n",
		t.Parked, t.BucketsOwned, rep.BucketCount, t.RelaysLive, t.RelaysSilent, t.RelaysStopped)
	if rep.Healthy {
		check := "no pending row older than -max-age " + durText(time.Duration(rep.MaxAgeSeconds*float64(time.Second)))
		if rep.MaxAgeSeconds == 0 {
			check = "no age check (-max-age 0)"
		}
		_, err := fmt.Fprintf(w, "healthy: every bucket has a live owner, %s\n", check)
		return err
	}
	for _, p := range rep.Problems {
		if _, err := fmt.Fprintf(w, "UNHEALTHY: %s\n", p); err != nil {
			return err
		}
	}
	return nil
}
