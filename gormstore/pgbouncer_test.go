package gormstore_test

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/storetest"
)

// TestConformancePgBouncer runs the storetest kit on PostgreSQL through
// PgBouncer in transaction pooling mode (OUTBOX_TEST_PGBOUNCER_DSN, with
// default_query_exec_mode=exec; gorm's PrepareStmt off): no store statement
// may depend on session state, since consecutive statements of one client
// connection can run on different server connections.
func TestConformancePgBouncer(t *testing.T) {
	o, ok := testenv.PgBouncerOpener(t)
	if !ok {
		t.Skipf("%s not set", testenv.EnvPgBouncer)
	}
	db, f := openDB(t, o)
	began := time.Now()
	storetest.Run(t, func(t *testing.T, n int) *storetest.Harness { return harness(t, db, f, n) })
	t.Logf("pgbouncer: conformance suite took %v", time.Since(began).Round(time.Millisecond))
}
