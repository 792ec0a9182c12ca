package chaos_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestEffectsChaosKeepsEveryEffectOnce is the CI-sized effects run
// (CHAOS.md, "Effects run") on PostgreSQL and the real broker, once per
// relay mode: writers commit business rows with their outbox messages,
// three relay processes publish them, and two inbox consumer processes of
// each client (kafka-go, franz-go) apply one effect per message in their
// own database, while every fault is injected once: a relay SIGKILLed, a
// relay SIGSTOPped past its lease, a zombie relay stopped between its
// produce and its commit until peers published newer rows of its buckets,
// a consumer killed between its transaction's commit and its offset
// commit, a consumer leaving its group, the broker's JVM SIGSTOPped, the
// relays' and the consumers' database sessions killed mid-statement. Each
// consumer database must hold exactly one effect per committed business
// row, none of a rolled-back one, each key's in commit order and counted
// right, and every fault must be proven from the processes' logs (the
// zombie's refused commit, the killed consumer's message skipped as a
// duplicate on its redelivery, …).
func TestEffectsChaosKeepsEveryEffectOnce(t *testing.T) {
	bin, brokers := setup(t)
	dsn := os.Getenv(testenv.EnvPostgres)
	if dsn == "" {
		if testenv.RequireAll() {
			t.Fatalf("%s is not set and %s=1", testenv.EnvPostgres, testenv.EnvRequireAll)
		}
		t.Skipf("%s is not set", testenv.EnvPostgres)
	}
	if len(brokers) == 0 {
		t.Skipf("%s is not set: the effects run pauses the real broker", testenv.EnvKafka)
	}
	pid := realBrokerPID(t)
	for _, mode := range []struct {
		name          string
		transactional bool
	}{
		{"default_mode", false},
		{"fenced_mode", true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			s, err := chaos.RunEffects(ctx, chaos.EffectsConfig{
				Env: chaos.Env{Bin: bin, Dialect: chaos.Postgres, BaseDSN: dsn, Brokers: brokers, Dir: t.TempDir()}, BrokerPID: pid,
				Transactional: mode.transactional, Messages: 2400, WriteFor: 30 * time.Second, Seed: time.Now().UnixNano(),
			})
			t.Log(s)
			for _, c := range s.Cells {
				t.Logf("%s: the faults' proofs:\n%s", c.Client, s.Evidence(c))
			}
			if err != nil {
				t.Fatalf("RunEffects: %v", err)
			}
			if got, want := len(s.Cells), len(chaos.Clients()); got != want {
				t.Fatalf("RunEffects audited %d clients; want %d", got, want)
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
