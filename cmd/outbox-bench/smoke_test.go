package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox/cmd/internal/bench"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// smokeArgs is a tiny run of every scenario: it proves that the harness
// works end to end (every row drained and consumed, every latency row acked
// and consumed, statements counted), never how fast.
var smokeArgs = []string{"-q", "-n", "300", "-naive-n", "30", "-relays", "1,2", "-rates", "50",
	"-latency-duration", "300ms", "-enqueue-tx", "8", "-idle-window", "1500ms", "-idle-fleets", "1"}

// TestSmokeRunsEveryScenario runs the harness in its smoke mode on SQLite
// and the in-process broker and, when the environment provides them, on
// PostgreSQL and MySQL with the real broker. It asserts results exist and
// are complete, not their timings.
func TestSmokeRunsEveryScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("smoke run skipped in -short mode")
	}
	type target struct{ name, db, dsn, broker string }
	targets := []target{{"sqlite_kfake", "sqlite", "", "kfake"}}
	for _, o := range testenv.Databases(t) {
		switch o.Name {
		case testenv.Postgres:
			targets = append(targets, target{"postgres", "postgres", os.Getenv(testenv.EnvPostgres), "kfake"})
		case testenv.MySQL:
			targets = append(targets, target{"mysql", "mysql", os.Getenv(testenv.EnvMySQL), "kfake"})
		}
	}
	real, hasReal := testenv.RealBroker(t)
	for _, tg := range targets {
		broker := tg.broker
		if tg.db != "sqlite" && hasReal {
			broker = "real"
		}
		t.Run(tg.name+"_"+broker, func(t *testing.T) {
			rep, stdout := runReport(t, append([]string{"-db", tg.db, "-dsn", tg.dsn, "-broker", broker, "-brokers", strings.Join(real.Addrs, ",")}, smokeArgs...))
			// raw loop, naive relay, relay ×1, relay ×2.
			if got := len(rep.Drain); got != 4 {
				t.Errorf("drain results = %d; want 4", got)
			}
			for _, d := range rep.Drain {
				if d.Rows == 0 || d.MsgPerSec <= 0 {
					t.Errorf("drain %s ×%d = %+v; want rows drained at a positive rate", d.Name, d.Relays, d)
				}
				if d.FirstQuarterMsgPerSec <= 0 || d.LastQuarterMsgPerSec <= 0 || d.EndVsStart <= 0 {
					t.Errorf("drain %s ×%d: quarter rates %v, %v (end/start %v); want positive", d.Name, d.Relays,
						d.FirstQuarterMsgPerSec, d.LastQuarterMsgPerSec, d.EndVsStart)
				}
				if got, want := d.LeaseLosses != nil, d.Name == "relay"; got != want {
					t.Errorf("drain %s ×%d: lease losses reported %v; want %v", d.Name, d.Relays, got, want)
				}
			}
			wantModes := 2 // local, poll
			if tg.db == "postgres" {
				wantModes = 3 // + pgnotify
			}
			if got := len(rep.Latency); got != wantModes {
				t.Errorf("latency results = %d; want %d", got, wantModes)
			}
			for _, l := range rep.Latency {
				if l.Messages == 0 {
					t.Errorf("latency %s: no messages measured", l.Mode)
				}
				// 50/s for 300ms, after a warm-up of a tenth (1 row) that
				// is not measured.
				if l.Messages > 15 || l.WarmUp != 1 {
					t.Errorf("latency %s: %d messages measured after %d warming up; want at most 15 after 1", l.Mode, l.Messages, l.WarmUp)
				}
			}
			if got := len(rep.Enqueue); got != 5 {
				t.Errorf("enqueue results = %d; want 5", got)
			}
			if len(rep.Idle) != 1 || rep.Idle[0].Statements == 0 {
				t.Errorf("idle results = %+v; want one fleet with counted statements", rep.Idle)
			}
			for _, section := range []string{"Drain throughput", "Latency", "Enqueue overhead", "Idle cost"} {
				if !strings.Contains(stdout.String(), section) {
					t.Errorf("tables lack %q:\n%s", section, stdout.String())
				}
			}
		})
	}
}

// runReport runs the harness with args and -json and returns the report it
// wrote and its tables; it fails the test if the run fails.
func runReport(t *testing.T, args []string) (bench.Report, *bytes.Buffer) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "report.json")
	args = append(args, "-json", out)
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q) = %v; stderr:\n%s", args, err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report JSON: %v", err)
	}
	return rep, &stdout
}

func TestRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-relays", "0"},
		{"-max-concurrent-buckets", "-1"},
		{"-rates", "x"},
		{"-scenarios", "nope"},
		{"-db", "oracle"},
		{"stray"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), append(args, "-q"), &stdout, &stderr); err == nil {
			t.Errorf("run(%q) = nil; want an error", args)
		}
	}
}
