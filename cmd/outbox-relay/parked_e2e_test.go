package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestParkedRowCommandsOnARealStore parks rows with a gormstore.Store (as
// a relay would), then lists, requeues and discards them with the
// subcommands, run as the binary runs them, on every available database
// (SQLite always; PostgreSQL and MySQL when OUTBOX_TEST_POSTGRES_DSN and
// OUTBOX_TEST_MYSQL_DSN are set).
func TestParkedRowCommandsOnARealStore(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		cfg := outbox.Config{BucketCount: 4, MessagesTable: "park_messages", LeasesTable: "park_leases", RelaysTable: "park_relays"}
		useOutbox(t, db, cfg)
		store, err := gormstore.New(db, gormstore.Options{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}

		// The test parks rows as relay "test-relay", which needs the leases.
		if got, err := relaytest.Owned(store.AcquireBucketLeases(t.Context(), "test-relay", 4, time.Hour)); err != nil || len(got) != 4 {
			t.Fatalf("AcquireBucketLeases = %v, %v; want all 4 buckets", got, err)
		}
		driver, dsn := dsnOf(t, db)
		flags := []string{"-db-driver", driver, "-db-dsn", dsn, "-bucket-count", "4",
			"-messages-table", cfg.MessagesTable, "-leases-table", cfg.LeasesTable, "-relays-table", cfg.RelaysTable}
		parkedScenario(t, db, cfg, store, store, func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			return run(ctx, append(args, flags...), noEnv, stdout, stderr)
		})
	})
}

// parkedScenario parks rows of db with parker, then runs the subcommands
// with runCmd and checks their output and the rows left.
func parkedScenario(t *testing.T, db *gorm.DB, cfg outbox.Config, admin relay.ParkAdmin, parker relay.Store,
	runCmd func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	binKey := []byte("bin\x00\xff")
	msg := func(key []byte, value string) *outbox.Message {
		return &outbox.Message{Topic: "orders", Key: key, Value: []byte(value)}
	}
	if err := outbox.Enqueue(db,
		msg([]byte("k1"), "k1-0"), msg([]byte("k1"), "k1-1"), msg([]byte("k1"), "k1-2"),
		msg([]byte("k2"), "k2-0"), msg([]byte("k2"), "k2-1"),
		msg(nil, "keyless"), msg(binKey, "corrupt"), msg([]byte("free"), "free"),
	); err != nil {
		t.Fatal(err)
	}
	rows := func() map[string]outbox.Message {
		t.Helper()
		var ms []outbox.Message
		if err := db.Table(cfg.MessagesTableName()).Order("id").Find(&ms).Error; err != nil {
			t.Fatal(err)
		}
		byValue := map[string]outbox.Message{}
		for _, m := range ms {
			byValue[string(m.Value)] = m
		}
		return byValue
	}
	m := rows()
	park := func(value, reason string) {
		t.Helper()
		r := m[value]
		if err := parker.Park(ctx, "test-relay", int(r.Bucket), r.ID, reason); err != nil {
			t.Fatalf("Park %s: %v", value, err)
		}
	}
	// hold parks values as held behind head, as a relay of an earlier
	// release did.
	hold := func(head string, values ...string) {
		t.Helper()
		for _, v := range values {
			park(v, relay.HeldReasonPrefix+strconv.FormatInt(m[head].ID, 10))
		}
	}
	park("k1-0", "broker: message too large")
	hold("k1-0", "k1-1", "k1-2")
	park("k2-0", "broker: topic authorization failed")
	hold("k2-0", "k2-1")
	park("keyless", "broker: invalid record")
	park("corrupt", relay.CorruptReasonPrefix+"test")
	// A later row of k2, not parked: discard must leave it.
	if err := outbox.Enqueue(db, msg([]byte("k2"), "k2-late")); err != nil {
		t.Fatal(err)
	}

	cmd := func(wantCode int, args ...string) (stdout, stderr string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := runCmd(ctx, args, &out, &errOut)
		t.Logf("outbox-relay %s → %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
		if code != wantCode {
			t.Fatalf("outbox-relay %s exited %d; want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, wantCode, out.String(), errOut.String())
		}
		return out.String(), errOut.String()
	}
	parkedValues := func() []string {
		t.Helper()
		list, err := admin.ListParked(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		ids := map[int64]string{}
		for v, r := range m {
			ids[r.ID] = v
		}
		var vs []string
		for _, r := range list {
			vs = append(vs, ids[r.ID])
		}
		slices.Sort(vs)
		return vs
	}

	// parked: one line per key, the lone rows by id.
	out, _ := cmd(exitOK, "parked")
	lineOf := func(prefix string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, prefix) {
				return strings.Join(strings.Fields(l), " ")
			}
		}
		t.Fatalf("no line starting with %q:\n%s", prefix, out)
		return ""
	}
	if l := lineOf(`"k1"`); !strings.HasPrefix(l, `"k1" `+itoa(int64(m["k1-0"].Bucket))+" 3 "+itoa(m["k1-0"].ID)+" ") || !strings.HasSuffix(l, "broker: message too large") {
		t.Errorf("k1 line = %q", l)
	}
	if l := lineOf(`"k2"`); !strings.Contains(l, " 2 "+itoa(m["k2-0"].ID)+" ") || !strings.HasSuffix(l, "broker: topic authorization failed") {
		t.Errorf("k2 line = %q", l)
	}
	if l := lineOf(itoa(m["keyless"].ID) + " "); !strings.Contains(l, "(keyless)") {
		t.Errorf("keyless line = %q", l)
	}
	if l := lineOf(itoa(m["corrupt"].ID) + " "); !strings.Contains(l, "0x62696e00ff") || !strings.HasSuffix(l, "corrupt row: test") {
		t.Errorf("corrupt line = %q", l)
	}
	if strings.Contains(out, relay.HeldReasonPrefix) || !strings.Contains(out, "7 rows parked: 2 keys, 2 rows alone.") {
		t.Errorf("parked output:\n%s", out)
	}

	// parked -json: the same four groups.
	out, _ = cmd(exitOK, "parked", "-json")
	var groups []groupJSON
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var g groupJSON
		if err := json.Unmarshal([]byte(line), &g); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		groups = append(groups, g)
	}
	if len(groups) != 4 {
		t.Fatalf("parked -json: %d groups; want 4", len(groups))
	}

	// requeue -key k1: its three rows are pending again, in place.
	if out, _ = cmd(exitOK, "requeue", "-key", "k1"); out != "requeued 3 rows (-key \"k1\")\n" {
		t.Errorf("requeue -key k1 printed %q", out)
	}
	if got, want := parkedValues(), []string{"corrupt", "k2-0", "k2-1", "keyless"}; !slices.Equal(got, want) {
		t.Errorf("parked after requeue -key k1: %v; want %v", got, want)
	}
	for _, v := range []string{"k1-0", "k1-1", "k1-2"} {
		if r, ok := rows()[v]; !ok || r.ID != m[v].ID {
			t.Errorf("row %s after requeue: %+v, %v; want it kept with its id", v, r, ok)
		}
	}
	if out, _ = cmd(exitOK, "requeue", "-key-hex", "6b31"); out != "requeued 0 rows (-key-hex 6b31): no parked row matched\n" {
		t.Errorf("second requeue printed %q", out)
	}

	// discard without -confirm: refused, nothing deleted.
	_, errOut := cmd(exitConfig, "discard", "-key", "k2")
	if !strings.Contains(errOut, "would delete 2 parked rows") {
		t.Errorf("discard without -confirm: %q", errOut)
	}
	if len(rows()) != 9 {
		t.Fatalf("rows after discard without -confirm = %d; want 9", len(rows()))
	}
	// With it: only the parked rows of k2 go, not k2-late.
	if out, _ = cmd(exitOK, "discard", "-key", "k2", "-confirm"); out != "deleted 2 parked rows (-key \"k2\")\n" {
		t.Errorf("discard -key k2 -confirm printed %q", out)
	}
	left := rows()
	for _, v := range []string{"k2-0", "k2-1"} {
		if _, ok := left[v]; ok {
			t.Errorf("row %s survived its discard", v)
		}
	}
	if _, ok := left["k2-late"]; !ok {
		t.Errorf("the unparked row k2-late was deleted")
	}

	// -id of the keyless row; -all takes the corrupt one.
	if out, _ = cmd(exitOK, "requeue", "-id", itoa(m["keyless"].ID)); out != "requeued 1 row (-id "+itoa(m["keyless"].ID)+")\n" {
		t.Errorf("requeue -id printed %q", out)
	}
	if out, _ = cmd(exitOK, "discard", "-all", "-confirm"); out != "deleted 1 parked row (-all)\n" {
		t.Errorf("discard -all printed %q", out)
	}
	if out, _ = cmd(exitOK, "parked"); out != "no parked rows in park_messages\n" {
		t.Errorf("parked at the end printed %q", out)
	}
	left = rows()
	var vs []string
	for v := range left {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	if want := []string{"free", "k1-0", "k1-1", "k1-2", "k2-late", "keyless"}; !slices.Equal(vs, want) {
		t.Errorf("rows at the end: %v; want %v", vs, want)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestSubcommandsExitOneWhenTheDatabaseFails: an unreachable database or
// missing outbox tables are runtime failures (exit 1), reported in one
// line without the DSN's password.
func TestSubcommandsExitOneWhenTheDatabaseFails(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.db")
	if err := os.WriteFile(empty, nil, 0o644); err != nil { // an empty SQLite database
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"unreachable", []string{"-db-driver", "postgres", "-db-dsn", "host=127.0.0.1 port=1 user=app password=secret dbname=app sslmode=disable connect_timeout=5"}, "database unreachable (postgres)"},
		{"missing_tables", []string{"-db-driver", "sqlite", "-db-dsn", "file:" + empty, "-messages-table", "nothing_here"}, "missing outbox tables nothing_here, outbox_leases, outbox_relays"},
	} {
		for _, args := range [][]string{{"parked"}, {"requeue", "-all"}, {"discard", "-id", "1", "-confirm"}} {
			t.Run(tc.name+"/"+args[0], func(t *testing.T) {
				var out, errOut bytes.Buffer
				code := run(context.Background(), append(args, tc.flags...), noEnv, &out, &errOut)
				if code != exitFailure {
					t.Fatalf("exit code = %d; want %d\n%s", code, exitFailure, errOut.String())
				}
				msg := errOut.String()
				if strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tc.want) || strings.Contains(msg, "secret") || strings.Contains(msg, " -h)") {
					t.Errorf("stderr = %q; want one line with %q, no password, no pointer to the flags", msg, tc.want)
				}
			})
		}
	}
}
