package main

// The rebucket subcommand: the bucket-count change of docs/relays.md ("Changing
// the bucket count safely") with its safety checks.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
)

var rebucketCommand = &subcommand{
	name:    "rebucket",
	args:    "-to N [-rehash] [-force] -confirm",
	summary: "change the bucket count: check that it is safe, reset the lease rows (move the rows with -rehash)",
	doc: `Steps 2 to 4 of the bucket-count change (docs/relays.md, Scaling), with their safety checks:
it refuses while a relay holds a lease or is live (a heartbeat within
-lease-duration, not stopped), and while the messages table holds rows
(pending or parked); then, in one transaction, it deletes every lease row
and creates the -to free ones (buckets 0 to N-1), and prints what it
changed. Then deploy every writer (outbox.Config.BucketCount) and relay
(-bucket-count) with the new count. Stop the writers first (step 1): the
tables cannot show whether they are stopped.

-rehash moves the rows still in the table to the buckets the new count gives
them (outbox.BucketOf, as the writers' plugin computes it; parked rows stay
parked), in the same transaction, instead of waiting for the relays to drain
them: each key's rows stay in id order in one bucket. A row without a key or
partition whose message id is not a UUID cannot be placed: it is refused.

-force proceeds although the tables show a live relay or a held lease: only
for relays you know are gone (their heartbeats and leases run out within
-lease-duration: waiting is safer). A relay that still runs with the old
count publishes and claims with it. -rehash with rows to move is refused
while a relay may be publishing them, even with -force.

Without -confirm it changes nothing: it runs the checks and shows what it
would do.`,
	flags: func(fs *flag.FlagSet, c *adminConfig) {
		intVar(fs, &c.to, "to", 0, fmt.Sprintf("the new bucket count, 1 to %d (required)", outbox.MaxBucketCount))
		fs.BoolVar(&c.rehash, "rehash", false, "move the rows in the table to their buckets under the new count instead of refusing")
		fs.BoolVar(&c.force, "force", false, "proceed although a relay is live or holds a lease (only for relays you know are gone)")
		fs.BoolVar(&c.confirm, "confirm", false, "really change the tables (without it, run the checks and show what would change, and exit 2)")
		fs.BoolVar(&c.asJSON, "json", false, "print one JSON object: the checks, what changed (or would), and the counts")
		leaseDurationFlag(fs, c)
	},
	check: func(fs *flag.FlagSet, c *adminConfig) error {
		given := false
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "to" })
		return firstBroken(rule{!given, "-to is required: the new bucket count"},
			rule{c.to < 1 || c.to > outbox.MaxBucketCount, fmt.Sprintf("-to %d: must be between 1 and %d", c.to, outbox.MaxBucketCount)},
			leaseDurationRule(c))
	},
	exit: `Exit status: 0 done (the tables changed, as printed); 2 without -confirm
(the checks passed: nothing changed), or bad usage or configuration (one
error line naming the flag, before any connection); 1 refused (a check
failed: the reasons are printed, nothing changed) or a runtime failure
(database unreachable, a failed statement: the transaction is rolled back
and nothing changed; interrupted by SIGINT or SIGTERM).`,
	run: runRebucket,
}

// rebucketCheck is one safety check of rebucket.
type rebucketCheck struct {
	Check   string `json:"check"` // leases, relays or rows
	OK      bool   `json:"ok"`
	Message string `json:"message"`
}

// rebucketReport is what rebucket checked and did; with -json it is
// printed as is.
type rebucketReport struct {
	MessagesTable string          `json:"messages_table"`
	From          int             `json:"from"` // -bucket-count
	To            int             `json:"to"`
	DatabaseTime  time.Time       `json:"database_time"`
	Checks        []rebucketCheck `json:"checks"`
	// Unchanged is true when the lease rows already are buckets 0 to To-1
	// and -rehash was not asked for: there is nothing to change, and nothing
	// was checked or changed.
	Unchanged bool `json:"unchanged"`
	Refused   bool `json:"refused"`
	Confirmed bool `json:"confirmed"`
	Done      bool `json:"done"`
	// LeaseRowsDeleted and LeaseBucketsDeleted are the lease rows deleted
	// (or that would be); LeaseRowsCreated the free rows created.
	LeaseRowsDeleted    int   `json:"lease_rows_deleted"`
	LeaseBucketsDeleted []int `json:"lease_buckets_deleted"`
	LeaseRowsCreated    int   `json:"lease_rows_created"`
	// Rows is the rows in the messages table; RowsMoved those -rehash moved
	// to another bucket.
	Rows      int64 `json:"rows"`
	RowsMoved int64 `json:"rows_moved"`
}

// errRefused is returned by the transaction when a check failed inside it.
var errRefused = errors.New("refused")

// rebucketState is what the safety checks look at.
type rebucketState struct {
	held    map[string][]int // owner → buckets of its unexpired leases
	live    []string         // relays with a heartbeat within ld, not stopped
	buckets []int            // every lease row's bucket
	pending int64
	parked  int64
}

// summarize is what the safety checks look at in st, at nowMs.
func summarize(o *opsDB, st *gormstore.RebucketState, nowMs int64) *rebucketState {
	sum := &rebucketState{held: map[string][]int{}, pending: st.Pending, parked: st.Parked}
	for _, l := range st.Leases {
		sum.buckets = append(sum.buckets, int(l.Bucket))
		if held(l, nowMs) {
			sum.held[*l.Owner] = append(sum.held[*l.Owner], int(l.Bucket))
		}
	}
	for _, h := range st.Heartbeats {
		if relayState(h, nowMs, o.c.leaseDuration) == relayLive {
			sum.live = append(sum.live, h.RelayID)
		}
	}
	return sum
}

// checks runs the safety checks on st for c; refused is true when one
// failed.
func (st *rebucketState) checks(o *opsDB, c *adminConfig) (checks []rebucketCheck, refused bool) {
	add := func(check string, ok bool, format string, args ...any) {
		checks = append(checks, rebucketCheck{Check: check, OK: ok, Message: fmt.Sprintf(format, args...)})
		refused = refused || !ok
	}
	forced := func(check, msg string) { // a live relay or a held lease
		if c.force {
			add(check, true, "%s; -force: proceeding", msg)
		} else {
			add(check, false, "%s: stop every relay first (step 3), or pass -force if you know they are gone", msg)
		}
	}
	live := len(st.held) > 0 || len(st.live) > 0
	rows := st.pending + st.parked
	switch {
	case len(st.buckets) == 0:
		add("leases", true, "no relay holds a lease (no lease rows)")
	case len(st.held) == 0:
		add("leases", true, "no relay holds a lease (%s: free or expired)", plural(int64(len(st.buckets)), "lease row"))
	default:
		var holders []string
		for _, owner := range slices.Sorted(maps.Keys(st.held)) {
			holders = append(holders, fmt.Sprintf("%s holds %s", owner, someBuckets(st.held[owner])))
		}
		forced("leases", strings.Join(holders, "; "))
	}
	if len(st.live) == 0 {
		add("relays", true, "no relay is live (none has a heartbeat within -lease-duration %s)", durText(c.leaseDuration))
	} else {
		forced("relays", fmt.Sprintf("%s (%s)", pluralRelays(len(st.live)), strings.Join(st.live, ", ")))
	}
	table := o.cfg.MessagesTableName()
	held := fmt.Sprintf("%s holds %s (%d pending, %d parked)", table, plural(rows, "row"), st.pending, st.parked)
	switch {
	case rows == 0:
		add("rows", true, "%s is empty", table)
	case !c.rehash:
		add("rows", false, "%s: let the relays drain it (step 2; requeue or discard the parked ones), or pass -rehash to move them to their buckets under %d", held, c.to)
	case live:
		add("rows", false, "%s, which -rehash would move while a relay may be publishing them: stop every relay first", held)
	default:
		add("rows", true, "%s: -rehash moves them to their buckets under %d", held, c.to)
	}
	return checks, refused
}

func runRebucket(ctx context.Context, e *adminEnv, c *adminConfig) int {
	what := fmt.Sprintf("rebucket -to %d", c.to)
	o, ok := e.openOps(ctx, what, c, true)
	if !ok {
		return exitFailure
	}
	defer o.close()
	clk, err := e.clock(ctx, o)
	var state *gormstore.RebucketState
	if err == nil {
		state, err = o.store.RebucketState(ctx)
	}
	if err != nil {
		return e.fail(ctx, what, err)
	}
	nowMs := clk.now.UnixMilli()
	rep := &rebucketReport{MessagesTable: o.cfg.MessagesTableName(), From: o.cfg.BucketCount, To: c.to, DatabaseTime: clk.now,
		Confirmed: c.confirm, LeaseBucketsDeleted: []int{}}
	st := summarize(o, state, nowMs)
	if !c.rehash && slices.Equal(st.buckets, seq(c.to)) {
		rep.Unchanged, rep.Checks = true, []rebucketCheck{}
		return e.printRebucket(ctx, what, c, rep)
	}
	rep.Checks, rep.Refused = st.checks(o, c)
	rep.Rows = st.pending + st.parked
	rep.LeaseRowsDeleted, rep.LeaseRowsCreated = len(st.buckets), c.to
	rep.LeaseBucketsDeleted = append(rep.LeaseBucketsDeleted, st.buckets...)

	if !rep.Refused && c.confirm {
		err = o.rebucket(ctx, c, nowMs, rep)
		if errors.Is(err, errRefused) {
			rep.Done = false // the checks, run again in the transaction, failed
		} else if err != nil {
			return e.fail(ctx, what, fmt.Errorf("%w (rolled back: nothing changed)", err))
		}
	}
	return e.printRebucket(ctx, what, c, rep)
}

// printRebucket prints rep and returns rebucket's exit code.
func (e *adminEnv) printRebucket(ctx context.Context, what string, c *adminConfig, rep *rebucketReport) int {
	if err := e.output(c, rep, func(w io.Writer) error { return writeRebucket(w, rep) }); err != nil {
		return e.fail(ctx, what, err)
	}
	switch {
	case rep.Unchanged:
		return exitOK
	case rep.Refused:
		fmt.Fprintf(e.stderr, "outbox-relay %s: refused: nothing changed\n", what)
		return exitFailure
	case !rep.Done:
		fmt.Fprintf(e.stderr, "outbox-relay %s: nothing changed without -confirm: run it again with -confirm to change the tables\n", what)
		return exitConfig
	}
	return exitOK
}

// rebucket changes the tables in one transaction (gormstore.Store.Rebucket),
// running the checks again on what it locked. It fills rep with what it
// did; a check failing inside the transaction, or a row -rehash cannot
// place, returns errRefused.
func (o *opsDB) rebucket(ctx context.Context, c *adminConfig, nowMs int64, rep *rebucketReport) error {
	res, err := o.store.Rebucket(ctx, c.to, c.rehash, func(state *gormstore.RebucketState) error {
		st := summarize(o, state, nowMs)
		rep.Checks, rep.Refused = st.checks(o, c)
		if rep.Refused {
			return errRefused
		}
		rep.Rows = st.pending + st.parked
		rep.LeaseBucketsDeleted = append(rep.LeaseBucketsDeleted[:0], st.buckets...)
		return nil
	})
	var unplaceable *gormstore.UnplaceableRowError
	if errors.As(err, &unplaceable) {
		rep.Checks = append(rep.Checks, rebucketCheck{Check: "rows", Message: fmt.Sprintf(
			"row %d has no key or partition, and its message id is not a UUID (%v): -rehash cannot compute its bucket; delete it first (outbox-relay discard -id %d -confirm, if it is parked)", unplaceable.ID, unplaceable.Err, unplaceable.ID)})
		rep.Refused = true
		return errRefused
	}
	if err != nil {
		return err
	}
	rep.LeaseRowsDeleted, rep.LeaseRowsCreated, rep.RowsMoved, rep.Done = int(res.LeaseRowsDeleted), res.LeaseRowsCreated, res.RowsMoved, true
	return nil
}

func writeRebucket(w io.Writer, rep *rebucketReport) error {
	fmt.Fprintf(w, "rebucket %s: %d → %d buckets, at %s on the database's clock\n", rep.MessagesTable, rep.From, rep.To,
		rep.DatabaseTime.Format("2006-01-02 15:04:05 UTC"))
	for _, ch := range rep.Checks {
		mark := "ok     "
		if !ch.OK {
			mark = "REFUSED"
		}
		fmt.Fprintf(w, "  %s  %s\n", mark, ch.Message)
	}
	if rep.Unchanged {
		fmt.Fprintf(w, "nothing to change: the lease rows already are %s\n", someBuckets(seq(rep.To)))
		return nil
	}
	deleted := plural(int64(rep.LeaseRowsDeleted), "lease row")
	if len(rep.LeaseBucketsDeleted) > 0 {
		deleted += " (" + someBuckets(rep.LeaseBucketsDeleted) + ")"
	}
	created := fmt.Sprintf("%s (%s)", plural(int64(rep.LeaseRowsCreated), "free lease row"), someBuckets(seq(rep.LeaseRowsCreated)))
	switch {
	case rep.Refused:
		fmt.Fprintf(w, "refused: nothing changed\n")
	case !rep.Done:
		fmt.Fprintf(w, "would delete %s and create %s", deleted, created)
		if rep.Rows > 0 {
			fmt.Fprintf(w, ", and move the %d rows to their buckets under %d", rep.Rows, rep.To)
		}
		fmt.Fprintf(w, "; nothing changed without -confirm\n")
	default:
		fmt.Fprintf(w, "deleted %s and created %s", deleted, created)
		if rep.Rows > 0 {
			fmt.Fprintf(w, "; moved %d of the %d rows to another bucket", rep.RowsMoved, rep.Rows)
		}
		fmt.Fprintf(w, "\nnext: deploy every writer with outbox.Config.BucketCount %d and every relay with -bucket-count %d (OUTBOX_BUCKET_COUNT=%d); never run both counts at once\n",
			rep.To, rep.To, rep.To)
	}
	return nil
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
