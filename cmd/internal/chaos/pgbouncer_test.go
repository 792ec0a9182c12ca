package chaos_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestChaosRunPgBouncer is a shorter chaos run whose writers and relays
// reach PostgreSQL through PgBouncer in transaction pooling mode
// (OUTBOX_TEST_PGBOUNCER_DSN; required under OUTBOX_TEST_REQUIRE_ALL): 8,000
// messages, 3 relays, 10 faults (kills, pauses, graceful stops, and
// terminations of the server sessions the relays last used) over 30s, with
// the same checks as TestChaosRun. Its name matches CI's -run 'TestChaosRun'.
func TestChaosRunPgBouncer(t *testing.T) {
	bin, brokers := setup(t)
	pooler, dsn := os.Getenv(testenv.EnvPgBouncer), os.Getenv(testenv.EnvPostgres)
	if pooler == "" || dsn == "" {
		if testenv.RequireAll() {
			t.Fatalf("%s and %s must be set when %s=1", testenv.EnvPgBouncer, testenv.EnvPostgres, testenv.EnvRequireAll)
		}
		t.Skipf("%s and %s not set", testenv.EnvPgBouncer, testenv.EnvPostgres)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	s, err := chaos.Run(ctx, chaos.RunConfig{
		Env: chaos.Env{Bin: bin, Dialect: chaos.Postgres, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir()}, PoolerDSN: pooler,
		Messages: 8000, Relays: 3, Faults: 10, WriteFor: 30 * time.Second, Seed: time.Now().UnixNano(),
	})
	t.Log(s)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if got := s.TotalFaults(); got < 8 {
		t.Errorf("Run injected %d faults; want at least 8", got)
	}
	if s.Written < 8000 {
		t.Errorf("Run wrote %d messages; want at least 8000", s.Written)
	}
}
