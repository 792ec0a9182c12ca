package main

// The check subcommand: is the outbox's configuration consistent, as far
// as the tables show?

import (
	"context"

	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
)

// checkSampleRows is how many of the newest rows check hashes again to
// find writers with another bucket count.
const checkSampleRows = 1000

// leaseDurationTolerance absorbs the delay between a relay's heartbeat and
// its lease write.
const leaseDurationTolerance = time.Second

var checkCommand = &subcommand{
	name:     "check",
	readOnly: true,
	args:     "[-json]",
	summary:  "configuration consistency: tables, columns, indexes, buckets, writers and relays that disagree; one line per problem",
	doc: `Checks what the tables show against the configuration (-bucket-count and
the table names) and prints one line per problem:

  - a missing table, column (schema version 2 added parked_at_ms,
    parked_reason and features) or index: the relay's read index
    (bucket, parked_at_ms, id), and the primary keys of the three tables
    (the leases' and heartbeats' upserts need them);
  - rows in buckets outside -bucket-count (writers with a larger count:
    relays stop with ErrMisconfigured);
  - among the newest 1000 rows, rows whose bucket is not the one
    -bucket-count gives their key (outbox.BucketOf): writers with another
    count, which the relays cannot see; the counts that fit are named;
  - lease rows outside -bucket-count (a relay with a larger count, live if
    it holds one, or a count lowered without resetting the leases), or
    missing lease rows while relays are live (relays with a smaller count:
    a relay creates all its lease rows when it starts);
  - live relays without parking support (an older version: no row is
    parked while one runs);
  - a relay whose leases run further past its last heartbeat than
    -lease-duration (it runs with a longer -lease-duration: relays that
    disagree on it disagree on who is live).

Times are compared on the database's clock. Prints "ok: …" when there is
no problem.`,
	flags: func(fs *flag.FlagSet, c *adminConfig) {
		fs.BoolVar(&c.asJSON, "json", false, `print one JSON object {"ok": …, "problems": [{"check": …, "message": …}]}`)
		leaseDurationFlag(fs, c)
	},
	check: func(_ *flag.FlagSet, c *adminConfig) error { return firstBroken(leaseDurationRule(c)) },
	exit: `Exit status: 0 no problem; 1 problems (one line each on stdout, their
number on stderr), or a runtime failure (database unreachable, a failed
read, interrupted by SIGINT or SIGTERM: one line on stderr); 2 bad usage or
configuration (one error line naming the flag, before any connection).`,
	run: runCheck,
}

// Check names of check's problems (the "check" field with -json).
const (
	checkMissingTable     = "missing_table"
	checkMissingColumn    = "missing_column"
	checkMissingIndex     = "missing_index"
	checkRowsOutside      = "rows_outside_bucket_count"
	checkRowsMisplaced    = "rows_of_another_bucket_count"
	checkLeasesOutside    = "lease_rows_outside_bucket_count"
	checkLeasesMissing    = "lease_rows_missing"
	checkRelayParking     = "relay_without_parking"
	checkRelayLeaseLonger = "relay_lease_duration"
)

// checkProblem is one problem check found.
type checkProblem struct {
	Check   string `json:"check"`
	Message string `json:"message"`
}

// checkReport is what check found.
type checkReport struct {
	OK       bool           `json:"ok"`
	Problems []checkProblem `json:"problems"`
	checked  []string       // what was found sound, for the "ok" line
}

func (r *checkReport) add(check, format string, args ...any) {
	r.Problems = append(r.Problems, checkProblem{Check: check, Message: fmt.Sprintf(format, args...)})
}

func runCheck(ctx context.Context, e *adminEnv, c *adminConfig) int {
	o, ok := e.openOps(ctx, "check", c, false)
	if !ok {
		return exitFailure
	}
	defer o.close()
	rep, err := e.check(ctx, o)
	if err == nil {
		err = e.output(c, rep, func(w io.Writer) error { return writeCheck(w, rep) })
	}
	if err != nil {
		return e.fail(ctx, "check", err)
	}
	if !rep.OK {
		fmt.Fprintf(e.stderr, "outbox-relay check: %s\n", plural(int64(len(rep.Problems)), "problem"))
		return exitFailure
	}
	return exitOK
}

func writeCheck(w io.Writer, rep *checkReport) error {
	if rep.OK {
		_, err := fmt.Fprintf(w, "ok: %s\n", strings.Join(rep.checked, "; "))
		return err
	}
	for _, p := range rep.Problems {
		if _, err := fmt.Fprintln(w, p.Message); err != nil {
			return err
		}
	}
	return nil
}

// version2Columns are the columns schema version 2 (parking) added.
var version2Columns = map[string]bool{"parked_at_ms": true, "parked_reason": true, "features": true}

// check runs every check on o.
func (e *adminEnv) check(ctx context.Context, o *opsDB) (*checkReport, error) {
	rep := &checkReport{Problems: []checkProblem{}}
	cfg, c := o.cfg, o.c
	n := cfg.BucketCount
	tables := []struct { // with their columns in schema version 2
		name    string
		columns []string
	}{
		{cfg.MessagesTable, []string{"id", "message_id", "bucket", "topic", "record_key", "record_value", "headers", "record_partition", "created_at", "parked_at_ms", "parked_reason"}},
		{cfg.LeasesTable, []string{"bucket", "owner", "expires_at_ms"}},
		{cfg.RelaysTable, []string{"relay_id", "last_seen_ms", "stopped_at_ms", "features"}},
	}
	// sound[t] is false when t or one of its columns is missing: the checks
	// that read it are skipped.
	sound := map[string]bool{}
	missingTables, err := o.store.MissingTables(ctx)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		if slices.Contains(missingTables, qualify(cfg, t.name)) {
			rep.add(checkMissingTable, "missing table %s: start a relay once with -migrate, or apply migrations/%s.sql", qualify(cfg, t.name), c.dbDriver)
			continue
		}
		missing, err := o.store.MissingColumns(ctx, qualify(cfg, t.name), t.columns)
		if err != nil {
			return nil, err
		}
		if len(missing) > 0 {
			fix := fmt.Sprintf("apply migrations/%s.sql", c.dbDriver)
			if !slices.ContainsFunc(missing, func(col string) bool { return !version2Columns[col] }) {
				fix = fmt.Sprintf("schema version 1: apply migrations/%s/000002_parking.up.sql, or start a relay once with -migrate", c.dbDriver)
			}
			noun := "columns"
			if len(missing) == 1 {
				noun = "column"
			}
			rep.add(checkMissingColumn, "%s lacks %s %s: %s", qualify(cfg, t.name), noun, strings.Join(missing, ", "), fix)
			continue
		}
		sound[t.name] = true
	}
	if err := o.checkIndexes(ctx, rep, sound); err != nil {
		return nil, err
	}
	if len(rep.Problems) == 0 {
		rep.checked = append(rep.checked, fmt.Sprintf("%s, %s and %s have their columns and indexes",
			cfg.MessagesTableName(), cfg.LeasesTableName(), cfg.RelaysTableName()))
	}

	if sound[cfg.MessagesTable] {
		if err := o.checkRows(ctx, rep, n); err != nil {
			return nil, err
		}
	}
	if sound[cfg.LeasesTable] && sound[cfg.RelaysTable] {
		clk, err := e.clock(ctx, o)
		if err != nil {
			return nil, err
		}
		if err := o.checkLeasesAndRelays(ctx, rep, clk.now, n); err != nil {
			return nil, err
		}
	}
	rep.OK = len(rep.Problems) == 0
	return rep, nil
}

func qualify(cfg outbox.Config, table string) string {
	return strings.TrimPrefix(cfg.Schema+"."+table, ".")
}

// checkIndexes checks the indexes the relay and the store need, on the
// tables that are sound.
func (o *opsDB) checkIndexes(ctx context.Context, rep *checkReport, sound map[string]bool) error {
	cfg, driver := o.cfg, o.c.dbDriver
	type need struct {
		table   string
		columns []string
		unique  bool // a primary key or unique index on exactly these columns
		why     string
	}
	needs := []need{
		{cfg.MessagesTable, []string{"id"}, true, "the primary key: ids are the submission order"},
		{cfg.MessagesTable, []string{"bucket", "parked_at_ms", "id"}, false,
			fmt.Sprintf("the relay's read path: without it every batch and pending probe scans the table (migrations/%s.sql creates it as idx_%s_bucket_parked_id)", driver, cfg.MessagesTable)},
		{cfg.LeasesTable, []string{"bucket"}, true, "the primary key: the relays' lease seeding (INSERT … ON CONFLICT (bucket)) needs it"},
		{cfg.RelaysTable, []string{"relay_id"}, true, "the primary key: the heartbeat upsert (ON CONFLICT (relay_id)) needs it"},
	}
	indexes := map[string][]gormstore.Index{}
	for _, nd := range needs {
		if !sound[nd.table] {
			continue
		}
		if _, ok := indexes[nd.table]; !ok {
			list, err := o.store.Indexes(ctx, nd.table)
			if err != nil {
				return err
			}
			indexes[nd.table] = list
		}
		found := slices.ContainsFunc(indexes[nd.table], func(ix gormstore.Index) bool {
			cols := ix.Columns // a non-unique need is met by an index that starts with its columns
			if !nd.unique && len(cols) > len(nd.columns) {
				cols = cols[:len(nd.columns)]
			}
			return !ix.Partial && (ix.Unique || !nd.unique) && slices.Equal(cols, nd.columns)
		})
		if !found {
			kind := "index"
			if nd.unique {
				kind = "primary key or unique index"
			}
			rep.add(checkMissingIndex, "%s has no %s on (%s), %s", qualify(cfg, nd.table), kind, strings.Join(nd.columns, ", "), nd.why)
		}
	}
	return nil
}

// checkRows finds rows outside the bucket count n, and, among the newest
// rows, rows in a bucket that n does not give them.
func (o *opsDB) checkRows(ctx context.Context, rep *checkReport, n int) error {
	table := o.cfg.MessagesTableName()
	out, err := o.store.RowsOutsideBuckets(ctx)
	if err != nil {
		return err
	}
	if len(out) > 0 {
		var buckets []int
		var total int64
		for _, b := range out {
			buckets = append(buckets, b.Bucket)
			total += b.Rows
		}
		rep.add(checkRowsOutside, "%s holds %s in %s, outside -bucket-count %d: a writer uses a larger outbox.Config.BucketCount (or this command the wrong -bucket-count), and relays with %d buckets stop with ErrMisconfigured",
			table, plural(total, "row"), someBuckets(buckets), n, n)
	}

	// The newest rows, hashed again.
	rows, err := o.store.NewestRows(ctx, checkSampleRows)
	if err != nil {
		return err
	}
	var read, misplaced []gormstore.RowPlacement
	for _, r := range rows {
		if r.Key == nil && r.Partition == nil && r.IDErr != nil {
			continue // a corrupt row: its bucket cannot be computed (see outbox-relay parked)
		}
		read = append(read, r)
		if r.Bucket >= 0 && r.Bucket < n && int(outbox.BucketOf(r.Key, r.Partition, r.MessageID, n)) != r.Bucket {
			misplaced = append(misplaced, r)
		}
	}
	if len(misplaced) > 0 {
		// The counts that give every misplaced row its bucket.
		var fits []int
		for count := 1; count <= outbox.MaxBucketCount; count++ {
			if !slices.ContainsFunc(misplaced, func(r gormstore.RowPlacement) bool {
				return int(outbox.BucketOf(r.Key, r.Partition, r.MessageID, count)) != r.Bucket
			}) {
				fits = append(fits, count)
			}
		}
		what := "no single bucket count fits them all"
		switch {
		case len(fits) == 1:
			what = fmt.Sprintf("a count of %d fits each of them", fits[0])
		case len(fits) > 1 && len(fits) <= 3:
			what = fmt.Sprintf("counts %s fit each of them", orList(fits))
		case len(fits) > 3:
			what = fmt.Sprintf("counts %s, … fit each of them", orList(fits[:3]))
		}
		rep.add(checkRowsMisplaced, "%d of the newest %d rows of %s (ids %d to %d) are not in the bucket -bucket-count %d gives their key: a writer uses another outbox.Config.BucketCount (%s); relays cannot tell, and a key written with both counts is published from two buckets, out of order",
			len(misplaced), len(read), table, misplaced[len(misplaced)-1].ID, misplaced[0].ID, n, what)
	}
	switch {
	case len(out) > 0 || len(misplaced) > 0:
	case len(read) == 0:
		rep.checked = append(rep.checked, fmt.Sprintf("%s is empty", table))
	default:
		rep.checked = append(rep.checked, fmt.Sprintf("every row of %s is in one of the %d buckets, and the newest %s hash to theirs", table, n, plural(int64(len(read)), "row")))
	}
	return nil
}

// orList returns "2, 4 or 8" for two or more values.
func orList[T any](v []T) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// checkLeasesAndRelays compares the lease rows and heartbeats with the
// bucket count n and with each other, at now on the database's clock.
func (o *opsDB) checkLeasesAndRelays(ctx context.Context, rep *checkReport, now time.Time, n int) error {
	leases, err := o.store.Leases(ctx)
	if err != nil {
		return err
	}
	relays, err := o.store.Heartbeats(ctx)
	if err != nil {
		return err
	}
	nowMs, ld := now.UnixMilli(), o.c.leaseDuration
	leasesTable := o.cfg.LeasesTableName()
	byID := map[string]relayRow{}
	var live []string
	for _, r := range relays {
		byID[r.RelayID] = r
		if relayState(r, nowMs, ld) == relayLive {
			live = append(live, r.RelayID)
		}
	}
	problems := len(rep.Problems)

	// Lease rows outside the count: held ones name their owner.
	var outside []int
	heldOutside := map[string][]int{}
	present := map[int]bool{}
	for _, l := range leases {
		present[int(l.Bucket)] = true
		if l.Bucket >= 0 && int(l.Bucket) < n {
			continue
		}
		outside = append(outside, int(l.Bucket))
		if held(l, nowMs) {
			heldOutside[*l.Owner] = append(heldOutside[*l.Owner], int(l.Bucket))
		}
	}
	for _, owner := range slices.Sorted(maps.Keys(heldOutside)) {
		rep.add(checkLeasesOutside, "relay %s holds a lease on %s, outside -bucket-count %d: it runs with a larger bucket count (at least %d)",
			owner, someBuckets(heldOutside[owner]), n, slices.Max(heldOutside[owner])+1)
	}
	if len(outside) > 0 && len(heldOutside) == 0 {
		rep.add(checkLeasesOutside, "%s has rows for %s, outside -bucket-count %d: a relay ran with a larger bucket count (at least %d), or the count was lowered without resetting the leases (outbox-relay rebucket -to %d), or they were reset for a larger one and this command's -bucket-count is the old one",
			leasesTable, someBuckets(outside), n, slices.Max(outside)+1, n)
	}

	// Missing lease rows while relays are live: each relay creates every
	// lease row of its count in its first round.
	if len(live) > 0 {
		var missing []int
		for b := range n {
			if !present[b] {
				missing = append(missing, b)
			}
		}
		if len(missing) > 0 {
			rep.add(checkLeasesMissing, "%s has no row for %s although %s (%s): they run with a smaller bucket count (probably %d), since each relay creates the lease rows of its count when it starts",
				leasesTable, someBuckets(missing), pluralRelays(len(live)), strings.Join(live, ", "), missing[0])
		}
	}

	// Live relays without parking support.
	for _, id := range live {
		if byID[id].Features&outbox.RelayFeatureParking == 0 {
			rep.add(checkRelayParking, "relay %s is live without parking support (features %d): an older version; no row is parked while it runs", id, byID[id].Features)
		}
	}

	// Leases that run past their owner's heartbeat by more than ld: a relay
	// writes its heartbeat and its expiries (now + its lease duration) from
	// one reading of the database's clock.
	longest := map[string]int64{}
	for _, l := range leases {
		if !held(l, nowMs) {
			continue
		}
		r, ok := byID[*l.Owner]
		if !ok || r.StoppedAtMs != nil {
			continue
		}
		longest[r.RelayID] = max(longest[r.RelayID], l.ExpiresAtMs-r.LastSeenMs)
	}
	for _, id := range slices.Sorted(maps.Keys(longest)) {
		if d := time.Duration(longest[id]) * time.Millisecond; d > ld+leaseDurationTolerance {
			rep.add(checkRelayLeaseLonger, "relay %s holds leases that expire %s after its last heartbeat, more than -lease-duration %s: it runs with a longer -lease-duration (at least %s), and relays that disagree on it disagree on which relays are live",
				id, durText(d.Round(time.Second)), durText(ld), durText(d.Round(time.Second)))
		}
	}
	if len(rep.Problems) == problems {
		relays := "no relay is live"
		if len(live) > 0 {
			relays = fmt.Sprintf("%s, with parking support and leases within -lease-duration %s", pluralRelays(len(live)), durText(ld))
		}
		rep.checked = append(rep.checked, fmt.Sprintf("the lease rows match the %d buckets; %s", n, relays))
	}
	return nil
}

func pluralRelays(n int) string {
	if n == 1 {
		return "1 relay is live"
	}
	return strconv.Itoa(n) + " relays are live"
}
