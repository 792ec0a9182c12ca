package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
)

// TestMembershipChaos changes the fleet's membership under steady writes
// on each database (chaos.RunConfig.Membership: two relays, then a third
// joins, one stops gracefully, one restarts under its id, one under a new
// id, one is killed and later replaced): nothing lost, per-key order kept,
// no bucket with two live owners, and no bucket without a live owner for
// more than 2 s after a join, a stop or a restart, or for more than the
// lease plus 2 s after a kill.
func TestMembershipChaos(t *testing.T) {
	bin, brokers := setup(t)
	const lease = 3 * time.Second // the harness relays' lease
	bound := map[string]time.Duration{
		chaos.ChangeJoin: 2 * time.Second, chaos.ChangeStop: 2 * time.Second,
		chaos.ChangeRestart: 2 * time.Second, chaos.ChangeRestartNewID: 2 * time.Second,
		chaos.ChangeKill: lease + 2*time.Second,
	}
	forEachDatabase(t, func(t *testing.T, dialect, dsn string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		s, err := chaos.Run(ctx, chaos.RunConfig{
			Env:        chaos.Env{Bin: bin, Dialect: dialect, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir()},
			Membership: true, Seed: time.Now().UnixNano(),
		})
		t.Log(s)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if got, want := len(s.Handovers), len(bound); got != want {
			t.Fatalf("Run measured %d kinds of change; want %d", got, want)
		}
		for _, h := range s.Handovers {
			if h.Unowned > bound[h.Kind] {
				t.Errorf("after a %s a bucket went %v without a live owner; want at most %v", h.Kind, h.Unowned.Round(time.Millisecond), bound[h.Kind])
			}
		}
	})
}
