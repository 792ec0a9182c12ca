package pgnotify_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/pgnotify"
)

// TestTransactionPoolerRefused: through PgBouncer in transaction pooling
// mode, Listen and Check fail with ErrTransactionPooler (naming PgBouncer
// and the remedy) instead of listening forever for nothing; directly on
// PostgreSQL, Check passes. Publish works through the pooler, even with a
// DSN that names no exec mode.
func TestTransactionPoolerRefused(t *testing.T) {
	pgb, direct, ok := testenv.PgBouncerDSN(t)
	if !ok {
		t.Skipf("%s not set", testenv.EnvPgBouncer)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	channel := testenv.Unique("ch_")
	newTransport := func(t *testing.T, dsn string) *pgnotify.Transport {
		tr, err := pgnotify.New(pgnotify.Config{ConnString: dsn, Channel: channel, ProbeTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}

	t.Run("direct_check_passes", func(t *testing.T) {
		began := time.Now()
		if err := newTransport(t, direct).Check(ctx); err != nil {
			t.Fatalf("Check on PostgreSQL directly = %v; want nil", err)
		}
		t.Logf("probe took %v", time.Since(began).Round(time.Millisecond))
	})

	t.Run("pgbouncer_listen_and_check_fail", func(t *testing.T) {
		tr := newTransport(t, pgb)
		began := time.Now()
		err := tr.Listen(ctx, func(int) { t.Error("callback called") })
		if !errors.Is(err, pgnotify.ErrTransactionPooler) {
			t.Fatalf("Listen through pgbouncer = %v; want ErrTransactionPooler", err)
		}
		for _, want := range []string{"PgBouncer", "transaction", "session-mode"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Listen error %q does not mention %q", err, want)
			}
		}
		t.Logf("Listen returned after %v: %v", time.Since(began).Round(time.Millisecond), err)
		if err := tr.Check(ctx); !errors.Is(err, pgnotify.ErrTransactionPooler) {
			t.Fatalf("Check through pgbouncer = %v; want ErrTransactionPooler", err)
		}
	})

	t.Run("publish_through_pgbouncer_reaches_a_direct_listener", func(t *testing.T) {
		// no default_query_exec_mode: the publisher picks exec itself
		noMode := strings.ReplaceAll(pgb, "default_query_exec_mode=exec", "")
		pub := newTransport(t, noMode)
		lctx, lcancel := context.WithCancel(ctx)
		defer lcancel()
		got, done := listen(lctx, newTransport(t, direct))
		waitListening(t, direct, channel)
		for i := 0; i < 20; i++ {
			if err := pub.Publish(ctx, []int{i}); err != nil {
				t.Fatalf("Publish %d through pgbouncer: %v", i, err)
			}
		}
		if ids := receive(t, got, 20); ids[19] != 19 {
			t.Fatalf("received %v; want 0..19", ids)
		}
		lcancel()
		<-done
	})
}
