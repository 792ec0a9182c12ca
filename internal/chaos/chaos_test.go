package chaos_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/chaos"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// EnvChaos enables the crash matrix and the chaos run (they take minutes and
// start child processes): OUTBOX_CHAOS=1.
const EnvChaos = "OUTBOX_CHAOS"

// setup skips unless OUTBOX_CHAOS is set, builds the relay child with the
// failpoints compiled in, and returns the binary, the database and the
// broker: PostgreSQL and the real broker when the environment names them
// (required under OUTBOX_TEST_REQUIRE_ALL), else SQLite and kfake.
func setup(t *testing.T) (bin, dialect, dsn string, brokers []string) {
	t.Helper()
	if v := os.Getenv(EnvChaos); v == "" || v == "0" {
		t.Skipf("set %s=1 to run the reliability harness", EnvChaos)
	}
	bin = filepath.Join(t.TempDir(), "outbox-chaos")
	cmd := exec.Command("go", "build", "-tags", "outbox_failpoints", "-o", bin, "github.com/gorm-outbox/outbox/cmd/outbox-chaos")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the relay child: %v\n%s", err, out)
	}
	dialect, dsn = chaos.SQLite, "-"
	if v := os.Getenv(testenv.EnvPostgres); v != "" {
		dialect, dsn = chaos.Postgres, v
	} else if testenv.RequireAll() {
		t.Fatalf("%s is not set and %s=1", testenv.EnvPostgres, testenv.EnvRequireAll)
	}
	if b, ok := testenv.RealBroker(t); ok {
		brokers = b.Addrs
	}
	return bin, dialect, dsn, brokers
}

// TestCrashMatrix SIGKILLs a relay process at each step of its life and
// checks that a restart or a peer delivers every message.
func TestCrashMatrix(t *testing.T) {
	bin, dialect, dsn, brokers := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rows, err := chaos.CrashMatrix(ctx, chaos.MatrixConfig{Bin: bin, Dialect: dialect, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir(), Messages: 2000})
	t.Logf("crash matrix (%s):\n%s", dialect, chaos.FormatMatrix(rows))
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
		if r.Resumed < 0 && !strings.Contains(r.Step, "acquisition") {
			t.Errorf("%s, %s: no delivery after the kill; want the rest of the messages delivered", r.Step, r.Mode)
		}
	}
}

// TestChaosRun is the bounded CI chaos run: 20,000 messages, 3 relays and 24
// faults; nothing lost, nothing rolled back delivered, per-key order kept, no
// bucket with two live owners, and the table drains.
func TestChaosRun(t *testing.T) {
	bin, dialect, dsn, brokers := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := chaos.Run(ctx, chaos.RunConfig{
		Bin: bin, Dialect: dialect, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir(),
		Messages: 20000, Relays: 3, Faults: 24, WriteFor: 75 * time.Second, Seed: time.Now().UnixNano(),
	})
	t.Log(s)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if got := s.TotalFaults(); got < 20 {
		t.Errorf("Run injected %d faults; want at least 20", got)
	}
	if s.Written < 20000 {
		t.Errorf("Run wrote %d messages; want at least 20000", s.Written)
	}
}
