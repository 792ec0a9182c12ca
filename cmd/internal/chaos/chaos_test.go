package chaos_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// EnvChaos enables the crash matrix and the chaos run (they take minutes and
// start child processes): OUTBOX_CHAOS=1.
const EnvChaos = "OUTBOX_CHAOS"

// setup skips unless OUTBOX_CHAOS is set, builds the relay child with the
// failpoints compiled in, and returns the binary and the broker: the real
// broker when the environment names it (required under
// OUTBOX_TEST_REQUIRE_ALL), else nil (an in-process kfake broker).
func setup(t *testing.T) (bin string, brokers []string) {
	t.Helper()
	if v := os.Getenv(EnvChaos); v == "" || v == "0" {
		t.Skipf("set %s=1 to run the reliability harness", EnvChaos)
	}
	bin = filepath.Join(t.TempDir(), "outbox-chaos")
	cmd := exec.Command("go", "build", "-tags", "outbox_failpoints", "-o", bin, "github.com/gorm-outbox/outbox/cmd/outbox-chaos")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the relay child: %v\n%s", err, out)
	}
	if b, ok := testenv.RealBroker(t); ok {
		brokers = b.Addrs
	}
	return bin, brokers
}

// forEachDatabase runs f in one subtest per database, named after its
// dialect: postgres and mysql when the environment names them (a missing
// one fails under OUTBOX_TEST_REQUIRE_ALL, else its subtest skips), and
// sqlite, a file shared by the harness and the relay processes (WAL, busy
// timeout: see chaos.CreateDatabase).
func forEachDatabase(t *testing.T, f func(t *testing.T, dialect, dsn string)) {
	for _, db := range []struct{ dialect, env string }{
		{chaos.Postgres, testenv.EnvPostgres},
		{chaos.MySQL, testenv.EnvMySQL},
		{chaos.SQLite, ""},
	} {
		t.Run(db.dialect, func(t *testing.T) {
			dsn := "-"
			if db.env != "" {
				if dsn = os.Getenv(db.env); dsn == "" {
					if testenv.RequireAll() {
						t.Fatalf("%s is not set and %s=1", db.env, testenv.EnvRequireAll)
					}
					t.Skipf("%s is not set", db.env)
				}
			}
			f(t, db.dialect, dsn)
		})
	}
}

// matrixMessages is the crash matrix's messages per cell, per database.
var matrixMessages = map[string]int{chaos.Postgres: 2000, chaos.MySQL: 2000, chaos.SQLite: 2000}

// TestCrashMatrix SIGKILLs a relay process at each step of its life, on
// each database, and checks that a restart or a peer delivers every message
// in per-key order.
func TestCrashMatrix(t *testing.T) {
	bin, brokers := setup(t)
	forEachDatabase(t, func(t *testing.T, dialect, dsn string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		rows, err := chaos.CrashMatrix(ctx, chaos.MatrixConfig{Env: chaos.Env{Bin: bin, Dialect: dialect, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir()}, Messages: matrixMessages[dialect]})
		t.Logf("crash matrix (%s):\n%s", dialect, chaos.FormatMatrix(rows, false))
		if err != nil {
			t.Fatalf("CrashMatrix: %v", err)
		}
		if got, want := len(rows), 2*len(chaos.MatrixSteps()); got != want {
			t.Fatalf("CrashMatrix = %d rows; want %d", got, want)
		}
		for _, r := range rows {
			if r.Lost != 0 || r.OrderViolations != 0 {
				t.Errorf("%s, %s: lost %d, order violations %d; want 0 and 0", r.Step, r.Mode, r.Lost, r.OrderViolations)
			}
			if !r.PoisonParked {
				t.Errorf("%s, %s: the poison row was never parked", r.Step, r.Mode)
			}
			if r.Resumed < 0 && !strings.Contains(r.Step, "acquisition") {
				t.Errorf("%s, %s: no delivery after the kill; want the rest of the messages delivered", r.Step, r.Mode)
			}
		}
	})
}

// chaosSize is the size of one bounded chaos run.
type chaosSize struct {
	messages, faults int
	writeFor         time.Duration
}

// chaosSizes: PostgreSQL keeps the CI run's historical size; MariaDB and
// SQLite run shorter (fewer messages over less time, the same rate of
// faults), so that the three fit the chaos step's budget.
var chaosSizes = map[string]chaosSize{
	chaos.Postgres: {20000, 24, 75 * time.Second},
	chaos.MySQL:    {8000, 12, 36 * time.Second},
	chaos.SQLite:   {6000, 10, 30 * time.Second},
}

// TestChaosRun is the bounded CI chaos run on each database: 3 relay
// processes under kills, pauses, graceful stops and (PostgreSQL, MariaDB)
// kills of the relays' database sessions in the middle of a statement;
// nothing lost, nothing rolled back delivered, per-key order kept, no bucket
// with two live owners, the table drains, and every database-kill fault
// reached the relays (they logged store errors during it).
func TestChaosRun(t *testing.T) {
	bin, brokers := setup(t)
	forEachDatabase(t, func(t *testing.T, dialect, dsn string) {
		size := chaosSizes[dialect]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		s, err := chaos.Run(ctx, chaos.RunConfig{
			Env:      chaos.Env{Bin: bin, Dialect: dialect, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir()},
			Messages: size.messages, Relays: 3, Faults: size.faults, WriteFor: size.writeFor, Seed: time.Now().UnixNano(),
		})
		t.Log(s)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if got, want := s.TotalFaults(), size.faults*5/6; got < want {
			t.Errorf("Run injected %d faults; want at least %d", got, want)
		}
		if s.Written < size.messages {
			t.Errorf("Run wrote %d messages; want at least %d", s.Written, size.messages)
		}
		checkDBKillsReachedRelays(t, s)
	})
}

// checkDBKillsReachedRelays fails t unless the run's database-kill faults
// (at least one on a database with sessions) hit a relay statement in
// flight and the relays logged a store error during them.
func checkDBKillsReachedRelays(t *testing.T, s chaos.Summary) {
	t.Helper()
	if s.Dialect == chaos.SQLite {
		return // no sessions to kill
	}
	if len(s.DBKills) == 0 {
		t.Errorf("no database-kill fault ran; want at least one (every kind is scheduled)")
		return
	}
	killed, mid := s.DBKillTotals()
	if killed == 0 || mid == 0 {
		t.Errorf("the database-kill faults killed %d relay sessions, %d of them mid-statement; want at least one mid-statement", killed, mid)
	}
	if s.RelayStoreWarnings == 0 {
		t.Errorf("the relays logged no store-error WARN during %d database-kill faults (%d in the whole run); want at least one", len(s.DBKills), s.RelayStoreWarningsTotal)
	}
}
