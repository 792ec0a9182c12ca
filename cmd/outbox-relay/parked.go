package main

// The subcommands, and the parked-row ones: parked, requeue and discard.
// Every subcommand opens the relay's database with the relay's own
// database flags (dbFlags) and exits; none publishes or serves HTTP.

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox/relay"
)

const defaultParkedLimit = 1000

// subcommand is one command of the binary other than the relay.
type subcommand struct {
	name    string
	args    string // the synopsis after the name, before the flags
	summary string // one line for the general usage
	doc     string // the paragraph of the command's own usage
	// readOnly: the command only reads; SQLite is opened read-only
	// (mode=ro), so that a mistyped path fails instead of creating a file.
	readOnly bool
	flags    func(fs *flag.FlagSet, c *adminConfig)       // the command's own flags
	check    func(fs *flag.FlagSet, c *adminConfig) error // after parsing, when set
	exit     string                                       // replaces the usual paragraph on exit codes
	run      func(ctx context.Context, e *adminEnv, c *adminConfig) int
}

// subcommands lists the commands in the order of the usage text.
var subcommands = []*subcommand{
	statusCommand,
	checkCommand,
	{
		name:     "parked",
		readOnly: true,
		args:     "[-rows] [-json] [-limit N]",
		summary:  "list the parked rows, per key",
		doc: `Lists the parked rows: rows the relay set aside because the broker will never
accept them as stored (or the store cannot decode them), together with the
later rows of their key, which wait behind them in order. One line per key
and bucket (its rows, first id, oldest row's age, how long it has been
parked and why), then the rows parked alone (keyless or corrupt) by id.
Printable keys are quoted, others shown in hex; long keys are truncated
(select them with -id FIRST_ID). Prints "no parked rows" when there are none.`,
		flags: func(fs *flag.FlagSet, c *adminConfig) {
			intVar(fs, &c.limit, "limit", defaultParkedLimit, "read at most this many parked rows (0: all)")
			fs.BoolVar(&c.rows, "rows", false, "list every row instead of one line per key")
			fs.BoolVar(&c.asJSON, "json", false, "print JSON: one object per line, per key (or per row with -rows), keys in base64 and as text")
		},
		check: func(_ *flag.FlagSet, c *adminConfig) error {
			return firstBroken(rule{c.limit < 0, fmt.Sprintf("-limit %d: must not be negative (0: no limit)", c.limit)})
		},
		run: runParked,
	},
	{
		name:    "requeue",
		args:    "(-key TEXT | -key-hex HEX | -id N | -all)",
		summary: "publish parked rows again, in their original order",
		doc: `Clears the parked mark of the chosen rows: the relay publishes them again in
id order, ahead of the later rows of their key. -key chooses every parked
row of the key in every bucket; -id N chooses row N alone if it is keyless
or corrupt, else every parked row of its key in its bucket; -all chooses
every parked row. Fix the cause first (topic, ACLs, size limit), or the rows
are parked again.`,
		flags: selectorFlags,
		check: parseSelector,
		run: func(ctx context.Context, e *adminEnv, c *adminConfig) int {
			return runSelected(ctx, e, c, false)
		},
	},
	{
		name:    "discard",
		args:    "(-key TEXT | -key-hex HEX | -id N | -all) -confirm",
		summary: "delete parked rows (never publishes them)",
		doc: `Deletes the chosen parked rows; their records are never published. Rows that
are not parked are never deleted. The selectors are those of requeue.
Without -confirm it deletes nothing: it shows the rows it would delete and
exits 2.`,
		flags: func(fs *flag.FlagSet, c *adminConfig) {
			selectorFlags(fs, c)
			fs.BoolVar(&c.confirm, "confirm", false, "really delete (without it, show what would be deleted and exit 2)")
		},
		check: parseSelector,
		run: func(ctx context.Context, e *adminEnv, c *adminConfig) int {
			return runSelected(ctx, e, c, true)
		},
	},
	rebucketCommand,
}

func findSubcommand(name string) *subcommand {
	for _, sc := range subcommands {
		if sc.name == name {
			return sc
		}
	}
	return nil
}

// adminEnv is what a subcommand runs with: run passes the process's, tests
// a fake store and fixed clocks.
type adminEnv struct {
	getenv         func(string) string
	stdout, stderr io.Writer
	// open returns the store's ParkAdmin on the database of c, and a
	// function that closes it.
	open func(ctx context.Context, c *dbConfig, log *slog.Logger) (relay.ParkAdmin, func(), error)
	now  func() time.Time // this host's clock
	// dbNow, when set, replaces the database's clock (gormstore.Store.Now).
	dbNow func(ctx context.Context) (time.Time, error)
}

// adminConfig is a subcommand's configuration.
type adminConfig struct {
	dbConfig

	// parked
	limit  int
	rows   bool
	asJSON bool

	// requeue and discard
	sel     relay.ParkedSelector
	selDesc string // the selector as the user gave it, e.g. -key "k1"
	confirm bool

	// status, check and rebucket
	leaseDuration time.Duration // the relays' -lease-duration
	maxAge        time.Duration // status
	allBuckets    bool          // status
	to            int           // rebucket
	force         bool          // rebucket
	rehash        bool          // rebucket
}

// selectorFlags declares the flags of a ParkedSelector.
func selectorFlags(fs *flag.FlagSet, c *adminConfig) {
	fs.Func("key", "choose the parked rows of this key, given as text, in every bucket", func(s string) error {
		c.sel.Key = append([]byte{}, s...) // never nil: "" is the empty key
		return nil
	})
	fs.Func("key-hex", "choose the parked rows of this key, given in hexadecimal (as parked shows a binary key: 0x optional), in every bucket", func(s string) error {
		k, err := hex.DecodeString(strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X"))
		if err != nil {
			return errors.New("not hexadecimal: want pairs of 0-9a-f, e.g. 6b6579 for the key \"key\"")
		}
		c.sel.Key = append([]byte{}, k...)
		return nil
	})
	intVar(fs, &c.sel.ID, "id", 0, "choose parked row N: alone if keyless or corrupt, else with every parked row of its key in its bucket")
	fs.BoolVar(&c.sel.All, "all", false, "choose every parked row")
}

// newSubcommandFlagSet declares sc's flags into c: the database flags
// shared with the relay, and its own.
func newSubcommandFlagSet(sc *subcommand, c *adminConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("outbox-relay "+sc.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dbFlags(fs, &c.dbConfig)
	sc.flags(fs, c)
	return fs
}

func dbFlagNames() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	dbFlags(fs, &dbConfig{})
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
}

// envFlagNames are the only flags of a subcommand read from the
// environment, as a relay's pod sets them (a selector or -confirm there
// could delete rows nobody named on the command line).
var envFlagNames = func() map[string]bool {
	names := dbFlagNames()
	names["lease-duration"] = true
	return names
}()

// parseSubcommand parses sc's command line and environment; errors are one
// line naming the flag, flag.ErrHelp for -h.
func parseSubcommand(sc *subcommand, args []string, getenv func(string) string) (*adminConfig, error) {
	c := &adminConfig{}
	fs := newSubcommandFlagSet(sc, c)
	if err := parseFlags(fs, args, getenv, envFlagNames); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: "); ok {
			return nil, fmt.Errorf("%s: not a flag of outbox-relay %s (it takes the database flags and its own only)", name, sc.name)
		}
		return nil, err
	}
	if sc.check != nil {
		if err := sc.check(fs, c); err != nil {
			return nil, err
		}
	}
	return c, c.dbConfig.check()
}

// parseSelector checks that exactly one selector flag was given and
// describes it.
func parseSelector(fs *flag.FlagSet, c *adminConfig) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var set []string
	for _, name := range []string{"key", "key-hex", "id", "all"} {
		if given[name] && !(name == "all" && !c.sel.All) { // -all=false chooses nothing
			set = append(set, "-"+name)
		}
	}
	if err := firstBroken(rule{len(set) == 0, "one of -key, -key-hex, -id or -all is required"},
		rule{len(set) > 1, strings.Join(set, " and ") + ": give only one of -key, -key-hex, -id or -all"}); err != nil {
		return err
	}
	switch set[0] {
	case "-key":
		c.selDesc = "-key " + strconv.Quote(string(c.sel.Key))
	case "-key-hex":
		c.selDesc = "-key-hex " + hex.EncodeToString(c.sel.Key)
	case "-id":
		if c.sel.ID <= 0 {
			return fmt.Errorf("-id %d: must be a row id, 1 or more", c.sel.ID)
		}
		c.selDesc = "-id " + strconv.FormatInt(c.sel.ID, 10)
	case "-all":
		c.selDesc = "-all"
	}
	return c.sel.Validate()
}

// runSubcommand runs the subcommand called name with args (those after the
// name) and returns the exit code: 0 done, 2 usage or configuration error
// (or discard without -confirm), 1 runtime failure.
func runSubcommand(ctx context.Context, name string, args []string, e *adminEnv) int {
	if name == "help" {
		return runHelp(args, e)
	}
	sc := findSubcommand(name)
	c, err := parseSubcommand(sc, args, e.getenv)
	if errors.Is(err, flag.ErrHelp) {
		subcommandUsage(e.stdout, sc)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "outbox-relay %s: %s (see outbox-relay %s -h)\n", sc.name, oneLine(err), sc.name)
		return exitConfig
	}
	c.readOnly = sc.readOnly
	return sc.run(ctx, e, c)
}

// runHelp prints the general usage, or a subcommand's.
func runHelp(args []string, e *adminEnv) int {
	topic := strings.Join(args, " ")
	switch sc := findSubcommand(topic); {
	case len(args) == 0 || topic == "-h" || topic == "-help" || topic == "--help":
		usage(e.stdout)
	case topic == "flags":
		flagsUsage(e.stdout)
	case sc != nil:
		subcommandUsage(e.stdout, sc)
	default:
		names := make([]string, len(subcommands))
		for i, sc := range subcommands {
			names[i] = sc.name
		}
		fmt.Fprintf(e.stderr, "outbox-relay help: unknown command %q: want %s (see outbox-relay -h)\n", topic, orList(names))
		return exitConfig
	}
	return exitOK
}

// subcommandUsage writes sc's usage: its doc, its own flags, then the
// database flags with their environment variables.
func subcommandUsage(w io.Writer, sc *subcommand) {
	fmt.Fprintf(w, "Usage: outbox-relay %s %s [database flags]\n\n%s\n\n", sc.name, sc.args, sc.doc)
	exit := cmp.Or(sc.exit, `Exit status: 0 done (also when no row matched); 2 bad usage or
configuration (one error line naming the flag, before any connection);
1 a runtime failure (database unreachable, outbox tables missing, a store
error, interrupted by SIGINT or SIGTERM).`)
	fmt.Fprintf(w, "%s Each statement is bounded by\n-statement-timeout. The relay's flags not listed here do not apply.\n\nFlags:\n", exit)
	db := dbFlagNames()
	fs := newSubcommandFlagSet(sc, &adminConfig{})
	fs.VisitAll(func(f *flag.Flag) {
		switch {
		case db[f.Name]:
		case envFlagNames[f.Name]:
			printFlag(w, f)
		default:
			fmt.Fprintf(w, "  -%s\n    \t%s%s\n", f.Name, f.Usage, defaultNote(f))
		}
	})
	fmt.Fprintf(w, "\nDatabase flags, as the relay's (each also read from the variable beside it):\n")
	fs.VisitAll(func(f *flag.Flag) {
		if db[f.Name] {
			printFlag(w, f)
		}
	})
}

// defaultNote returns " (default X)" for a flag whose default is not zero.
func defaultNote(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "0s", "false", "[]":
		return ""
	}
	return fmt.Sprintf(" (default %s)", f.DefValue)
}

// subcommandsUsage is the part of the general usage about the subcommands.
func subcommandsUsage(w io.Writer) {
	fmt.Fprintf(w, "Commands (outbox-relay COMMAND -h for each; without one, the relay runs):\n")
	for _, sc := range subcommands {
		fmt.Fprintf(w, "  outbox-relay %s %s\n    \t%s\n", sc.name, sc.args, sc.summary)
	}
	fmt.Fprintf(w, "  outbox-relay version\n    \tthe build's version, the library's, the VCS revision and the Go version\n")
	fmt.Fprintf(w, "  outbox-relay help [COMMAND | flags]\n    \tthis text, a command's, or every flag of the relay\n")
	fmt.Fprintf(w, `
The commands take the relay's database flags (-db-driver, -db-dsn, -schema,
-messages-table, -leases-table, -relays-table, -bucket-count,
-statement-timeout) and their variables (status, check and rebucket also
-lease-duration), and flags of their own; they neither publish nor serve
HTTP. Only requeue, discard and rebucket change anything.

`)
}

// connect opens the store's ParkAdmin for what, reporting a failure on
// stderr.
func (e *adminEnv) connect(ctx context.Context, what string, c *adminConfig) (relay.ParkAdmin, func(), bool) {
	admin, closeFn, err := e.open(ctx, &c.dbConfig, e.logger())
	if err != nil {
		e.fail(ctx, what, err)
		return nil, nil, false
	}
	return admin, closeFn, true
}

func runParked(ctx context.Context, e *adminEnv, c *adminConfig) int {
	admin, closeFn, ok := e.connect(ctx, "parked", c)
	if !ok {
		return exitFailure
	}
	defer closeFn()
	n := c.limit
	if n > 0 {
		n++ // one more: are there more?
	}
	rows, err := admin.ListParked(ctx, n)
	if err != nil {
		return e.fail(ctx, "parked", err)
	}
	more := c.limit > 0 && len(rows) > c.limit
	if more {
		rows = rows[:c.limit]
	}
	now := e.now()
	if len(rows) == 0 {
		// With -json, stdout stays valid (empty) JSON lines.
		out := e.stdout
		if c.asJSON {
			out = e.stderr
		}
		fmt.Fprintf(out, "no parked rows in %s\n", c.outbox.WithDefaults().MessagesTableName())
		return exitOK
	}
	switch {
	case c.asJSON && c.rows:
		err = writeRowsJSON(e.stdout, rows, now)
	case c.asJSON:
		err = writeGroupsJSON(e.stdout, groupParked(rows), now)
	case c.rows:
		err = writeRowsTable(e.stdout, rows, now)
	default:
		err = writeGroupsTable(e.stdout, groupParked(rows), now, true)
	}
	if err != nil {
		return e.fail(ctx, "parked", err)
	}
	if more {
		note := fmt.Sprintf("showing the first %d parked rows (-limit %d); there are more: raise -limit, or -limit 0 for all", c.limit, c.limit)
		if c.asJSON {
			fmt.Fprintf(e.stderr, "outbox-relay parked: %s\n", note)
		} else {
			fmt.Fprintf(e.stdout, "\n%s\n", note)
		}
	}
	return exitOK
}

// runSelected is requeue, or with discard the discard subcommand.
func runSelected(ctx context.Context, e *adminEnv, c *adminConfig, discard bool) int {
	what, done, noun, act := "requeue "+c.selDesc, "requeued", "row", relay.ParkAdmin.RequeueParked
	if discard {
		what, done, noun, act = "discard "+c.selDesc, "deleted", "parked row", relay.ParkAdmin.DeleteParked
	}
	admin, closeFn, ok := e.connect(ctx, what, c)
	if !ok {
		return exitFailure
	}
	defer closeFn()
	if discard && !c.confirm {
		rows, err := admin.ListParked(ctx, 0)
		if err != nil {
			return e.fail(ctx, what, err)
		}
		chosen := c.sel.Choose(rows)
		if len(chosen) > 0 {
			if err := writeGroupsTable(e.stdout, groupParked(chosen), e.now(), false); err != nil {
				return e.fail(ctx, what, err)
			}
		}
		fmt.Fprintf(e.stderr, "outbox-relay %s: would delete %s; nothing deleted without -confirm: run it again with -confirm to delete\n",
			what, plural(int64(len(chosen)), "parked row"))
		return exitConfig
	}
	n, err := act(admin, ctx, c.sel)
	if err != nil {
		return e.fail(ctx, what, err)
	}
	none := ""
	if n == 0 {
		none = ": no parked row matched"
	}
	fmt.Fprintf(e.stdout, "%s %s (%s)%s\n", done, plural(n, noun), c.selDesc, none)
	return exitOK
}

// plural returns "1 row", "2 rows".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.FormatInt(n, 10) + " " + noun + "s"
}
