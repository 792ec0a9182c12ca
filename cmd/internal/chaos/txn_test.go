package chaos_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
)

// postgresDSN returns the PostgreSQL DSN of the environment, skipping t
// when there is none (a failure under OUTBOX_TEST_REQUIRE_ALL).
func postgresDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(testenv.EnvPostgres)
	if dsn == "" {
		if testenv.RequireAll() {
			t.Fatalf("%s is not set and %s=1", testenv.EnvPostgres, testenv.EnvRequireAll)
		}
		t.Skipf("%s is not set", testenv.EnvPostgres)
	}
	return dsn
}

// TestCrashMatrixTransactional is the crash matrix with transactional
// relays and a read_committed checker, on PostgreSQL: nothing lost, order
// kept after deduplication, and duplicates only from batches the victim
// had committed to Kafka but not yet deleted when it died: at most one
// batch per bucket it was serving (relay.DefaultMaxConcurrentBuckets at
// once), and order violations without deduplication only from those
// repeated batches (Consumer.UnexplainedOrderViolations 0). Unlike the default mode, the victim's own batch killed
// after its records were appended but before the commit (during publish,
// during renewal) is never seen: it is aborted when its bucket's next
// owner initialises the transactional id.
func TestCrashMatrixTransactional(t *testing.T) {
	bin, brokers := setup(t)
	dsn := postgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rows, err := chaos.CrashMatrix(ctx, chaos.MatrixConfig{Env: chaos.Env{Bin: bin, Dialect: chaos.Postgres, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir()}, Messages: 2000, Transactional: true})
	t.Logf("transactional crash matrix (postgres):\n%s", chaos.FormatMatrix(rows, true))
	if err != nil {
		t.Fatalf("CrashMatrix: %v", err)
	}
	const batch = 100 // the children's batch size
	for _, r := range rows {
		if r.Lost != 0 || r.OrderViolations != 0 {
			t.Errorf("%s, %s: lost %d, order violations %d; want 0 and 0", r.Step, r.Mode, r.Lost, r.OrderViolations)
		}
		if r.Duplicates > relay.DefaultMaxConcurrentBuckets*batch {
			t.Errorf("%s, %s: %d duplicates; want at most one batch per bucket served at once (%d)", r.Step, r.Mode, r.Duplicates, relay.DefaultMaxConcurrentBuckets*batch)
		}
		if r.UnexplainedOrderViolations != 0 {
			t.Errorf("%s, %s: %d of %d order violations without deduplication are not a batch published again; want 0", r.Step, r.Mode, r.UnexplainedOrderViolations, r.RawOrderViolations)
		}
	}
}

// TestChaosRunTransactional is the bounded chaos run with transactional
// relays and a read_committed checker, on PostgreSQL: the checks of
// TestChaosRun, and per-key order without deduplication (a relay paused
// past its lease cannot make its late batch visible).
func TestChaosRunTransactional(t *testing.T) {
	bin, brokers := setup(t)
	dsn := postgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := chaos.Run(ctx, chaos.RunConfig{
		Env:      chaos.Env{Bin: bin, Dialect: chaos.Postgres, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir()},
		Messages: 20000, Relays: 3, Faults: 24, WriteFor: 75 * time.Second, Seed: time.Now().UnixNano(), Transactional: true,
	})
	t.Log(s)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if s.Faults[chaos.FaultPause] == 0 {
		t.Errorf("no pause fault ran; want at least one (a relay stalled past its lease)")
	}
}
