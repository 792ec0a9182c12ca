package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorm-outbox/outbox/relay"
)

// fakeAdmin is a relay.ParkAdmin in memory; requeue and delete choose rows
// as relay.ParkedSelector.Choose does and take them out of the list.
type fakeAdmin struct {
	rows     []relay.ParkedRow
	err      error // returned by every call when set
	limits   []int
	requeues []relay.ParkedSelector
	deletes  []relay.ParkedSelector
}

func (f *fakeAdmin) ListParked(ctx context.Context, limit int) ([]relay.ParkedRow, error) {
	f.limits = append(f.limits, limit)
	if f.err != nil {
		return nil, f.err
	}
	if limit > 0 && limit < len(f.rows) {
		return f.rows[:limit], nil
	}
	return f.rows, nil
}

func (f *fakeAdmin) take(sel relay.ParkedSelector) int64 {
	chosen := map[int64]bool{}
	for _, r := range sel.Choose(f.rows) {
		chosen[r.ID] = true
	}
	var kept []relay.ParkedRow
	for _, r := range f.rows {
		if !chosen[r.ID] {
			kept = append(kept, r)
		}
	}
	f.rows = kept
	return int64(len(chosen))
}

func (f *fakeAdmin) RequeueParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	f.requeues = append(f.requeues, sel)
	if f.err != nil {
		return 0, f.err
	}
	return f.take(sel), nil
}

func (f *fakeAdmin) DeleteParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	f.deletes = append(f.deletes, sel)
	if f.err != nil {
		return 0, f.err
	}
	return f.take(sel), nil
}

// testNow is the clock of the formatting tests.
var testNow = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// fixtureRows is a parked list covering every case of the display, in
// (bucket, id) order as ListParked returns it.
func fixtureRows() []relay.ParkedRow {
	at := func(ago time.Duration) time.Time { return testNow.Add(-ago) }
	long := strings.Repeat("a", 100)
	return []relay.ParkedRow{
		{ID: 5, MessageID: "m5", Bucket: 0, Topic: "orders", Key: []byte(long), Size: 120, CreatedAt: at(3 * time.Hour), ParkedAt: at(2 * time.Hour), Reason: "broker: message too large"},
		// k1 in bucket 1: a head and two rows held behind it.
		{ID: 10, MessageID: "m10", Bucket: 1, Topic: "orders", Key: []byte("k1"), Size: 2000000, CreatedAt: at(90 * time.Minute), ParkedAt: at(80 * time.Minute), Reason: "broker: message too large"},
		{ID: 11, MessageID: "m11", Bucket: 1, Topic: "orders", Key: []byte("k1"), Size: 10, CreatedAt: at(70 * time.Minute), ParkedAt: at(60 * time.Minute), Reason: relay.HeldReasonPrefix + "10"},
		{ID: 12, MessageID: "m12", Bucket: 1, Topic: "orders", Key: []byte("k1"), Size: 10, CreatedAt: at(65 * time.Minute), ParkedAt: at(60 * time.Minute), Reason: relay.HeldReasonPrefix + "10"},
		// A keyless row, parked alone.
		{ID: 15, MessageID: "m15", Bucket: 1, Topic: "audit", Key: nil, Size: 7, CreatedAt: at(10 * time.Minute), ParkedAt: at(9 * time.Minute), Reason: "broker: topic authorization failed"},
		// A binary key.
		{ID: 20, MessageID: "m20", Bucket: 2, Topic: "orders", Key: []byte{0x00, 0xff, 0x10}, Size: 3, CreatedAt: at(50 * time.Second), ParkedAt: at(40 * time.Second), Reason: "broker: invalid record"},
		// A corrupt row of key k1 in bucket 3: alone.
		{ID: 30, MessageID: "not-a-uuid", Bucket: 3, Topic: "orders", Key: []byte("k1"), Size: 1, CreatedAt: at(72 * time.Hour), ParkedAt: at(49 * time.Hour), Reason: relay.CorruptReasonPrefix + "message id \"not-a-uuid\" is not a UUID"},
	}
}

// runFake runs a subcommand (args[0]) on admin with the test clock.
func runFake(t *testing.T, admin relay.ParkAdmin, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runFakeCtx(t, context.Background(), admin, env, args...)
}

func runFakeCtx(t *testing.T, ctx context.Context, admin relay.ParkAdmin, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &adminEnv{
		getenv: func(k string) string { return env[k] },
		stdout: &out, stderr: &errOut,
		open: func(context.Context, *dbConfig, *slog.Logger) (relay.ParkAdmin, func(), error) {
			if admin == nil {
				t.Fatalf("%v: the store was opened; want a usage error first", args)
			}
			return admin, func() {}, nil
		},
		now: func() time.Time { return testNow },
	}
	code = runSubcommand(ctx, args[0], args[1:], e)
	if testing.Verbose() {
		t.Logf("outbox-relay %s → %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	}
	return code, out.String(), errOut.String()
}

// sqliteFlags are valid database flags; nothing opens them in these tests.
var sqliteFlags = []string{"-db-driver", "sqlite", "-db-dsn", "never-opened.db"}

func withDB(args ...string) []string { return append(args, sqliteFlags...) }

func TestSubcommandUsageErrorsExitTwoNamingTheFlagBeforeAnyConnection(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"requeue_without_selector", withDB("requeue"), "one of -key, -key-hex, -id or -all is required"},
		{"discard_without_selector", withDB("discard", "-confirm"), "one of -key, -key-hex, -id or -all is required"},
		{"two_selectors", withDB("requeue", "-key", "k1", "-id", "3"), "-key and -id: give only one"},
		{"key_and_key_hex", withDB("discard", "-key-hex", "6b31", "-key", "k1", "-confirm"), "-key and -key-hex: give only one"},
		{"all_and_id", withDB("requeue", "-all", "-id", "3"), "-id and -all: give only one"},
		{"bad_hex", withDB("requeue", "-key-hex", "zz"), `-key-hex "zz": not hexadecimal`},
		{"odd_hex", withDB("requeue", "-key-hex", "abc"), `-key-hex "abc": not hexadecimal`},
		{"id_zero", withDB("requeue", "-id", "0"), "-id 0: must be a row id, 1 or more"},
		{"id_negative", withDB("discard", "-id", "-4", "-confirm"), "-id -4: must be a row id, 1 or more"},
		{"id_not_a_number", withDB("requeue", "-id", "seven"), `-id "seven": not an integer`},
		{"negative_limit", withDB("parked", "-limit", "-1"), "-limit -1: must not be negative"},
		{"kafka_flag_rejected", withDB("parked", "-kafka-brokers", "a:1"), "-kafka-brokers: not a flag of outbox-relay parked"},
		{"relay_flag_rejected", withDB("requeue", "-all", "-migrate"), "-migrate: not a flag of outbox-relay requeue"},
		{"selector_on_parked", withDB("parked", "-all"), "-all: not a flag of outbox-relay parked"},
		{"confirm_on_requeue", withDB("requeue", "-all", "-confirm"), "-confirm: not a flag of outbox-relay requeue"},
		{"positional_argument", withDB("requeue", "-all", "extra"), `unexpected argument "extra"`},
		{"missing_driver", []string{"parked", "-db-dsn", "x.db"}, "-db-driver is required"},
		{"unknown_driver", []string{"requeue", "-all", "-db-driver", "oracle", "-db-dsn", "x"}, `-db-driver "oracle": must be postgres, mysql or sqlite`},
		{"missing_dsn", []string{"parked", "-db-driver", "sqlite"}, "-db-dsn is required"},
		{"bad_table_name", withDB("parked", "-messages-table", "drop table;"), "-messages-table"},
		{"negative_statement_timeout", withDB("parked", "-statement-timeout", "-1s"), `-statement-timeout "-1s": must not be negative`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runFake(t, nil, nil, tc.args...)
			if code != exitConfig {
				t.Fatalf("exit code = %d; want %d\nstderr: %s", code, exitConfig, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout = %q; want nothing", stdout)
			}
			prefix := "outbox-relay " + tc.args[0] + ": "
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, prefix) {
				t.Errorf("stderr = %q; want one line starting with %q", stderr, prefix)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr = %q; want it to contain %q", stderr, tc.want)
			}
		})
	}
}

// TestRunDispatchesSubcommandsAndKeepsTheRelayCommandLine: run sends a
// first argument naming a command to it, and anything else to the relay as
// before (a stray argument is still the relay's usage error).
func TestRunDispatchesSubcommandsAndKeepsTheRelayCommandLine(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), withDB("requeue", "-id", "0"), noEnv, &out, &errOut); code != exitConfig || !strings.Contains(errOut.String(), "outbox-relay requeue: -id 0") {
		t.Errorf("run(requeue -id 0) = %d, %q; want 2 and the requeue error", code, errOut.String())
	}
	errOut.Reset()
	if code := run(context.Background(), withDB("bogus", "-kafka-brokers", "a:1"), noEnv, &out, &errOut); code != exitConfig || !strings.Contains(errOut.String(), `unexpected argument "bogus"`) {
		t.Errorf("run(bogus) = %d, %q; want 2 and the relay's unexpected argument error", code, errOut.String())
	}
	errOut.Reset()
	// The relay's flags still require Kafka, and parse as before.
	if code := run(context.Background(), sqliteFlags, noEnv, &out, &errOut); code != exitConfig || !strings.Contains(errOut.String(), "-kafka-brokers is required") {
		t.Errorf("run(relay flags without brokers) = %d, %q; want 2 and -kafka-brokers is required", code, errOut.String())
	}
}

// TestSubcommandsShareTheRelaysDatabaseFlags: the database flags of every
// subcommand are the relay's (names, defaults, usage, environment
// variables, error messages), and only they are read from the environment.
func TestSubcommandsShareTheRelaysDatabaseFlags(t *testing.T) {
	relayFlags := newFlagSet(&config{})
	for name := range dbFlagNames() {
		rf := relayFlags.Lookup(name)
		if rf == nil {
			t.Fatalf("the relay lacks the database flag -%s", name)
		}
		for _, sc := range subcommands {
			f := newSubcommandFlagSet(sc, &adminConfig{}).Lookup(name)
			if f == nil || f.DefValue != rf.DefValue || f.Usage != rf.Usage {
				t.Errorf("%s -%s = %+v; want the relay's %+v", sc.name, name, f, rf)
			}
		}
	}
	// The same bad value, the same message.
	for _, bad := range [][]string{
		{"-db-driver", "oracle", "-db-dsn", "x"},
		{"-db-driver", "mysql", "-db-dsn", "root@127.0.0.1:3306/app"},
		{"-db-driver", "sqlite", "-db-dsn", "x", "-bucket-count", "-1"},
		{"-db-driver", "sqlite", "-db-dsn", "x", "-statement-timeout", "5"},
		{"-db-driver", "sqlite", "-db-dsn", "x", "-statement-timeout", "0s"},
	} {
		_, relayErr := parseConfig(append(bad, "-kafka-brokers", "a:1"), noEnv)
		_, cmdErr := parseSubcommand(findSubcommand("parked"), bad, noEnv)
		if relayErr == nil || cmdErr == nil || relayErr.Error() != cmdErr.Error() {
			t.Errorf("%v: relay error %v, parked error %v; want the same error", bad, relayErr, cmdErr)
		}
	}
	// The environment supplies the database flags; the relay's other
	// variables (set in a relay's pod) are ignored.
	env := map[string]string{
		"OUTBOX_DB_DRIVER": "sqlite", "OUTBOX_DB_DSN": "from-env.db", "OUTBOX_MESSAGES_TABLE": "env_messages",
		"OUTBOX_KAFKA_BROKERS": "not a broker list", "OUTBOX_POLL_INTERVAL": "soon", "OUTBOX_LISTEN": "9090",
	}
	c, err := parseSubcommand(findSubcommand("parked"), nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("parked with the database in the environment: %v", err)
	}
	if c.dbDriver != "sqlite" || c.dbDSN != "from-env.db" || c.outbox.MessagesTable != "env_messages" {
		t.Errorf("config from the environment = %+v", c.dbConfig)
	}
	if _, err := parseSubcommand(findSubcommand("parked"), nil, func(k string) string {
		if k == "OUTBOX_STATEMENT_TIMEOUT" {
			return "5"
		}
		return env[k]
	}); err == nil || !strings.Contains(err.Error(), `OUTBOX_STATEMENT_TIMEOUT="5"`) {
		t.Errorf("a bad OUTBOX_STATEMENT_TIMEOUT: %v; want an error naming it", err)
	}
}

// TestSelectorsAndConfirmAreNeverReadFromTheEnvironment: a variable left
// in a shell must not choose or delete rows.
func TestSelectorsAndConfirmAreNeverReadFromTheEnvironment(t *testing.T) {
	admin := &fakeAdmin{rows: fixtureRows()}
	env := map[string]string{"OUTBOX_ALL": "true", "OUTBOX_KEY": "k1", "OUTBOX_ID": "10", "OUTBOX_CONFIRM": "true"}
	code, _, stderr := runFake(t, nil, env, withDB("discard")...)
	if code != exitConfig || !strings.Contains(stderr, "one of -key, -key-hex, -id or -all is required") {
		t.Errorf("discard with selector variables = %d %q; want 2, no selector", code, stderr)
	}
	code, _, stderr = runFake(t, admin, env, withDB("discard", "-all")...)
	if code != exitConfig || len(admin.deletes) != 0 {
		t.Errorf("discard -all with OUTBOX_CONFIRM=true = %d (%d deletes) %q; want 2 and nothing deleted", code, len(admin.deletes), stderr)
	}
}

func TestDiscardWithoutConfirmDeletesNothingAndShowsWhatItWould(t *testing.T) {
	admin := &fakeAdmin{rows: fixtureRows()}
	code, stdout, stderr := runFake(t, admin, nil, withDB("discard", "-key", "k1")...)
	if code != exitConfig {
		t.Fatalf("exit code = %d; want %d", code, exitConfig)
	}
	if len(admin.deletes) != 0 || len(admin.rows) != len(fixtureRows()) {
		t.Fatalf("DeleteParked called %d times; want none", len(admin.deletes))
	}
	// -key k1: the three rows of bucket 1 and the corrupt one of bucket 3.
	want := `outbox-relay discard -key "k1": would delete 4 parked rows; nothing deleted without -confirm: run it again with -confirm to delete` + "\n"
	if stderr != want {
		t.Errorf("stderr = %q; want %q", stderr, want)
	}
	if !strings.Contains(stdout, `"k1"  1       3`) || !strings.Contains(stdout, "30  3") || strings.Contains(stdout, "(keyless)") {
		t.Errorf("stdout does not show exactly the rows of k1:\n%s", stdout)
	}

	// -id of a held row: every parked row of its key in its bucket.
	code, _, stderr = runFake(t, admin, nil, withDB("discard", "-id", "11")...)
	if code != exitConfig || !strings.Contains(stderr, "would delete 3 parked rows") {
		t.Errorf("discard -id 11 = %d %q; want 2, would delete 3", code, stderr)
	}
	// Nothing matched: still refused, and says 0.
	code, stdout, stderr = runFake(t, admin, nil, withDB("discard", "-key-hex", "ffff")...)
	if code != exitConfig || !strings.Contains(stderr, "would delete 0 parked rows") || stdout != "" {
		t.Errorf("discard -key-hex ffff = %d %q %q; want 2, would delete 0, no table", code, stdout, stderr)
	}
	if len(admin.deletes) != 0 {
		t.Errorf("DeleteParked called; want never without -confirm")
	}
}

func TestDiscardWithConfirmDeletesTheChosenRows(t *testing.T) {
	admin := &fakeAdmin{rows: fixtureRows()}
	code, stdout, stderr := runFake(t, admin, nil, withDB("discard", "-key-hex", "0x00ff10", "-confirm")...)
	if code != exitOK {
		t.Fatalf("exit code = %d; want 0\n%s", code, stderr)
	}
	if len(admin.deletes) != 1 || !bytes.Equal(admin.deletes[0].Key, []byte{0, 0xff, 0x10}) {
		t.Fatalf("DeleteParked selectors = %+v; want one of key 00ff10", admin.deletes)
	}
	if want := "deleted 1 parked row (-key-hex 00ff10)\n"; stdout != want {
		t.Errorf("stdout = %q; want %q", stdout, want)
	}
	code, stdout, _ = runFake(t, admin, nil, withDB("discard", "-key-hex", "0x00ff10", "-confirm")...)
	if want := "deleted 0 parked rows (-key-hex 00ff10): no parked row matched\n"; code != exitOK || stdout != want {
		t.Errorf("second discard = %d %q; want 0 and %q", code, stdout, want)
	}
}

func TestRequeuePrintsHowManyRowsAndTheSelector(t *testing.T) {
	admin := &fakeAdmin{rows: fixtureRows()}
	for _, tc := range []struct {
		args []string
		sel  relay.ParkedSelector
		want string
	}{
		{[]string{"-id", "12"}, relay.ParkedSelector{ID: 12}, "requeued 3 rows (-id 12)\n"},
		{[]string{"-key", "k1"}, relay.ParkedSelector{Key: []byte("k1")}, "requeued 1 row (-key \"k1\")\n"},
		{[]string{"-key", ""}, relay.ParkedSelector{Key: []byte{}}, "requeued 0 rows (-key \"\"): no parked row matched\n"},
		{[]string{"-all"}, relay.ParkedSelector{All: true}, "requeued 3 rows (-all)\n"},
		{[]string{"-all"}, relay.ParkedSelector{All: true}, "requeued 0 rows (-all): no parked row matched\n"},
	} {
		code, stdout, stderr := runFake(t, admin, nil, withDB(append([]string{"requeue"}, tc.args...)...)...)
		if code != exitOK || stdout != tc.want {
			t.Errorf("requeue %v = %d %q (stderr %q); want 0 and %q", tc.args, code, stdout, stderr, tc.want)
		}
		got := admin.requeues[len(admin.requeues)-1]
		if got.ID != tc.sel.ID || got.All != tc.sel.All || !bytes.Equal(got.Key, tc.sel.Key) || (got.Key == nil) != (tc.sel.Key == nil) {
			t.Errorf("requeue %v: selector %+v; want %+v", tc.args, got, tc.sel)
		}
	}
}

func TestStoreFailuresExitOneAndInterruptionsSaySo(t *testing.T) {
	admin := &fakeAdmin{err: errors.New("database is locked")}
	code, _, stderr := runFake(t, admin, nil, withDB("requeue", "-all")...)
	if code != exitFailure || stderr != "outbox-relay requeue -all: database is locked\n" {
		t.Errorf("requeue on a failing store = %d %q; want 1 and the error", code, stderr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	admin.err = context.Canceled
	code, _, stderr = runFakeCtx(t, ctx, admin, nil, withDB("discard", "-id", "3", "-confirm")...)
	if code != exitFailure || !strings.Contains(stderr, "outbox-relay discard -id 3: interrupted") {
		t.Errorf("interrupted discard = %d %q; want 1 and interrupted", code, stderr)
	}
}

func TestParkedGroupsRowsPerKeyAndListsLoneRowsById(t *testing.T) {
	admin := &fakeAdmin{rows: fixtureRows()}
	code, stdout, stderr := runFake(t, admin, nil, withDB("parked")...)
	if code != exitOK {
		t.Fatalf("exit code = %d\n%s", code, stderr)
	}
	long := `"` + strings.Repeat("a", 64) + `"…` // 67 characters
	pad := func(s string) string { return s + strings.Repeat(" ", 67-utf8.RuneCountInString(s)) }
	want := pad("KEY") + `  BUCKET  ROWS  FIRST ID  OLDEST  PARKED FOR  REASON
` + long + `  0       1     5         3h00m   2h00m       broker: message too large
` + pad(`"k1"`) + `  1       3     10        1h30m   1h20m       broker: message too large
` + pad("0x00ff10") + `  2       1     20        50s     40s         broker: invalid record

PARKED ALONE (keyless or corrupt)
ID  BUCKET  KEY        AGE     PARKED FOR  REASON
15  1       (keyless)  10m00s  9m00s       broker: topic authorization failed
30  3       "k1"       3d00h   2d01h       corrupt row: message id "not-a-uuid" is not a UUID

7 rows parked: 3 keys, 2 rows alone. Requeue with outbox-relay requeue -id FIRST_ID (that key in that bucket) or -key/-key-hex KEY (every bucket); delete with outbox-relay discard … -confirm.
`
	if stdout != want {
		t.Errorf("parked output:\n%s\nwant:\n%s", stdout, want)
	}
	if strings.Contains(stdout, relay.HeldReasonPrefix) {
		t.Errorf("a held row's reason is shown; want its head's")
	}
	if len(admin.limits) != 1 || admin.limits[0] != defaultParkedLimit+1 {
		t.Errorf("ListParked limits = %v; want one call with %d (the default -limit and one to tell whether there are more)", admin.limits, defaultParkedLimit+1)
	}
}

func TestParkedRowsListsEveryRow(t *testing.T) {
	code, stdout, _ := runFake(t, &fakeAdmin{rows: fixtureRows()}, nil, withDB("parked", "-rows")...)
	if code != exitOK {
		t.Fatalf("exit code = %d", code)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 1+7+2 {
		t.Fatalf("got %d lines; want a header, 7 rows and a total:\n%s", len(lines), stdout)
	}
	if h := strings.Fields(lines[0]); strings.Join(h, " ") != "ID MESSAGE ID BUCKET TOPIC KEY SIZE AGE PARKED FOR REASON" {
		t.Errorf("header = %q", lines[0])
	}
	if f := strings.Fields(lines[4]); strings.Join(f, " ") != `12 m12 1 orders "k1" 10 1h05m 1h00m held behind parked row 10` {
		t.Errorf("row 12 = %q", lines[4])
	}
	for _, want := range []string{"11  m11", "held behind parked row 10", "2000000", "not-a-uuid", "(keyless)", "7 rows parked."} {
		if !strings.Contains(stdout, want) {
			t.Errorf("parked -rows lacks %q:\n%s", want, stdout)
		}
	}
}

// TestParkedJSONIsOneObjectPerGroupWithKeysInBase64AndText: parked -json
// gives every key in key_base64, and in key as the raw text (not quoted
// again inside JSON) when it is UTF-8, null for a binary key.
func TestParkedJSONIsOneObjectPerGroupWithKeysInBase64AndText(t *testing.T) {
	code, stdout, _ := runFake(t, &fakeAdmin{rows: fixtureRows()}, nil, withDB("parked", "-json")...)
	if code != exitOK {
		t.Fatalf("exit code = %d", code)
	}
	var groups []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var g map[string]any
		if err := json.Unmarshal([]byte(line), &g); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		groups = append(groups, g)
	}
	if len(groups) != 5 {
		t.Fatalf("%d objects; want 5 (3 keys, 2 alone):\n%s", len(groups), stdout)
	}
	k1 := groups[1]
	if k1["kind"] != "key" || k1["key_base64"] != "azE=" || k1["key"] != "k1" || k1["rows"] != 3.0 || k1["first_id"] != 10.0 ||
		k1["head_id"] != 10.0 || k1["reason"] != "broker: message too large" || k1["oldest_age_seconds"] != 5400.0 || k1["parked_seconds"] != 4800.0 {
		t.Errorf("k1 group = %v", k1)
	}
	if ids, _ := k1["ids"].([]any); len(ids) != 3 {
		t.Errorf("k1 ids = %v; want 3", k1["ids"])
	}
	if long := groups[0]["key"].(string); long != strings.Repeat("a", 100) {
		t.Errorf("a long key in JSON = %q; want it in full", long)
	}
	if bin := groups[3]; bin["key_base64"] != "AP8Q" || bin["key"] != nil {
		t.Errorf("binary key group = %v", bin)
	}
	if kl := groups[2]; kl["kind"] != "keyless" || kl["key_base64"] != nil || kl["key"] != nil || kl["first_id"] != 15.0 {
		t.Errorf("keyless row = %v", kl)
	}
	if c := groups[4]; c["kind"] != "corrupt" || c["first_id"] != 30.0 || c["key"] != "k1" {
		t.Errorf("corrupt row = %v", c)
	}

	code, stdout, _ = runFake(t, &fakeAdmin{rows: fixtureRows()}, nil, withDB("parked", "-json", "-rows")...)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != exitOK || len(lines) != 7 {
		t.Fatalf("parked -json -rows = %d, %d lines; want 0, 7", code, len(lines))
	}
	var row map[string]any
	if err := json.Unmarshal([]byte(lines[2]), &row); err != nil {
		t.Fatal(err)
	}
	if row["id"] != 11.0 || row["message_id"] != "m11" || row["reason"] != relay.HeldReasonPrefix+"10" || row["key_base64"] != "azE=" || row["created_at"] != "2025-03-01T10:50:00Z" {
		t.Errorf("row 11 = %v", row)
	}
}

func TestParkedWithNoRowsSaysSoAndExitsZero(t *testing.T) {
	code, stdout, stderr := runFake(t, &fakeAdmin{}, nil, withDB("parked", "-messages-table", "orders_outbox")...)
	if code != exitOK || stdout != "no parked rows in orders_outbox\n" || stderr != "" {
		t.Errorf("parked on none = %d %q %q; want 0 and no parked rows", code, stdout, stderr)
	}
	code, stdout, stderr = runFake(t, &fakeAdmin{}, nil, withDB("parked", "-json")...)
	if code != exitOK || stdout != "" || !strings.Contains(stderr, "no parked rows") {
		t.Errorf("parked -json on none = %d %q %q; want 0, empty stdout, the note on stderr", code, stdout, stderr)
	}
}

func TestParkedSaysWhenTheLimitCutTheList(t *testing.T) {
	admin := &fakeAdmin{rows: fixtureRows()}
	code, stdout, _ := runFake(t, admin, nil, withDB("parked", "-rows", "-limit", "3")...)
	if code != exitOK || !strings.Contains(stdout, "3 rows parked.") || !strings.Contains(stdout, "showing the first 3 parked rows (-limit 3); there are more") {
		t.Errorf("parked -limit 3 = %d:\n%s", code, stdout)
	}
	_, stdout, _ = runFake(t, admin, nil, withDB("parked", "-limit", "0")...)
	if admin.limits[len(admin.limits)-1] != 0 || strings.Contains(stdout, "there are more") {
		t.Errorf("parked -limit 0: ListParked limit %d; want 0 (all), no note", admin.limits[len(admin.limits)-1])
	}
}

func TestKeyTextQuotesPrintableKeysHexesOthersAndTruncates(t *testing.T) {
	for _, tc := range []struct {
		key  []byte
		max  int
		want string
	}{
		{nil, 64, "(keyless)"},
		{[]byte{}, 64, `""`},
		{[]byte("order 17"), 64, `"order 17"`},
		{[]byte(`say "hi"\`), 64, `"say \"hi\"\\"`},
		{[]byte("café ☕"), 64, `"café ☕"`},
		{[]byte("tab\there"), 64, "0x" + "7461620968657265"},
		{[]byte{0xc3, 0x28}, 64, "0xc328"}, // invalid UTF-8
		{[]byte("abcdef"), 4, `"abcd"…`},
		{[]byte("éééééé"), 3, `"ééé"…`},
		{[]byte{1, 2, 3, 4, 5}, 6, "0x010203…"},
		{[]byte{1, 2, 3}, 6, "0x010203"},
	} {
		if got := keyText(tc.key, tc.max); got != tc.want {
			t.Errorf("keyText(%q, %d) = %s; want %s", tc.key, tc.max, got, tc.want)
		}
	}
}

// TestTopLevelHelpIsShort: outbox-relay -h fits a screen (at most 60
// lines): every command, the common flags and the way to the rest
// (help flags); the full flag list is not in it.
func TestTopLevelHelpIsShort(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, noEnv, &out, &errOut); code != exitOK {
		t.Fatalf("-h exited %d: %s", code, errOut.String())
	}
	help := out.String()
	if n := strings.Count(help, "\n"); n > 60 {
		t.Errorf("-h is %d lines; want at most 60:\n%s", n, help)
	}
	want := []string{"outbox-relay help flags", "outbox-relay version", "-db-dsn  [OUTBOX_DB_DSN]", "-kafka-brokers  [OUTBOX_KAFKA_BROKERS]"}
	for _, sc := range subcommands {
		want = append(want, "outbox-relay "+sc.name+" ")
	}
	for _, w := range want {
		if !strings.Contains(help, w) {
			t.Errorf("-h lacks %q:\n%s", w, help)
		}
	}
	if strings.Contains(help, "-kafka-sasl-password") {
		t.Errorf("-h lists every flag; want the common ones:\n%s", help)
	}
}

func TestHelpMentionsTheSubcommands(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, noEnv, &out, &errOut); code != exitOK {
			t.Fatalf("%v exited %d", args, code)
		}
		for _, want := range []string{"outbox-relay parked", "outbox-relay requeue (-key TEXT | -key-hex HEX | -id N | -all)", "outbox-relay discard", "-confirm"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v lacks %q", args, want)
			}
		}
	}
	for _, sc := range subcommands {
		for _, args := range [][]string{{sc.name, "-h"}, {"help", sc.name}} {
			var out, errOut bytes.Buffer
			if code := run(context.Background(), args, noEnv, &out, &errOut); code != exitOK {
				t.Fatalf("%v exited %d: %s", args, code, errOut.String())
			}
			help := out.String()
			if !strings.HasPrefix(help, "Usage: outbox-relay "+sc.name) {
				t.Errorf("%v: %q", args, help)
			}
			newSubcommandFlagSet(sc, &adminConfig{}).VisitAll(func(f *flag.Flag) {
				if !strings.Contains(help, "  -"+f.Name) {
					t.Errorf("%v lacks -%s", args, f.Name)
				}
			})
			if strings.Contains(help, "-kafka-brokers") {
				t.Errorf("%v mentions -kafka-brokers", args)
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"help", "bogus"}, noEnv, &out, &errOut); code != exitConfig || !strings.Contains(errOut.String(), `unknown command "bogus"`) {
		t.Errorf("help bogus = %d %q; want 2 naming it", code, errOut.String())
	}
}

func TestSelectParkedChoosesAsTheStoreDoes(t *testing.T) {
	rows := fixtureRows()
	ids := func(rs []relay.ParkedRow) []int64 {
		var out []int64
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	for _, tc := range []struct {
		sel  relay.ParkedSelector
		want []int64
	}{
		{relay.ParkedSelector{ID: 10}, []int64{10, 11, 12}}, // a head: its key in its bucket, not the corrupt row of k1
		{relay.ParkedSelector{ID: 12}, []int64{10, 11, 12}}, // a held row: the same
		{relay.ParkedSelector{ID: 15}, []int64{15}},         // keyless: alone
		{relay.ParkedSelector{ID: 30}, []int64{30}},         // corrupt: alone
		{relay.ParkedSelector{ID: 99}, nil},
		{relay.ParkedSelector{Key: []byte("k1")}, []int64{10, 11, 12, 30}}, // every bucket, corrupt included
		{relay.ParkedSelector{Key: []byte{}}, nil},
		{relay.ParkedSelector{All: true}, []int64{5, 10, 11, 12, 15, 20, 30}},
	} {
		if got := ids(tc.sel.Choose(rows)); !slicesEqual(got, tc.want) {
			t.Errorf("%+v.Choose = %v; want %v", tc.sel, got, tc.want)
		}
	}
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
