package gormstore_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/storetest"
	"gorm.io/gorm"
)

// sessionState matches statements that leave state on the server session,
// which a transaction pooler hands to other clients (or loses).
var sessionState = regexp.MustCompile(`(?i)^\s*(SET|RESET|PREPARE|EXECUTE|DEALLOCATE|DISCARD|LISTEN|UNLISTEN|DECLARE|LOCK|LOAD|CREATE\s+(GLOBAL\s+|LOCAL\s+)?(TEMP|TEMPORARY)\b)|pg_advisory|advisory_lock|set_config|GET_LOCK`)

// TestConformancePgBouncer runs the storetest kit on PostgreSQL through
// PgBouncer in transaction pooling mode (OUTBOX_TEST_PGBOUNCER_DSN, with
// default_query_exec_mode=exec; gorm's PrepareStmt off): consecutive
// statements of one client connection can run on different server
// connections, so no store statement may depend on session state. It also
// checks every statement the store sent through gorm for session state
// (SET, PREPARE, LISTEN, temporary tables, advisory locks, ...).
func TestConformancePgBouncer(t *testing.T) {
	o, ok := testenv.PgBouncerOpener(t)
	if !ok {
		t.Skipf("%s not set", testenv.EnvPgBouncer)
	}
	db, f := openDB(t, o)
	rec := &testenv.SQLRecorder{}
	recorded := db.Session(&gorm.Session{Logger: rec})
	began := time.Now()
	storetest.Run(t, func(t *testing.T, n int) *storetest.Harness { return harness(t, recorded, f, n) })
	t.Logf("pgbouncer: conformance suite took %v", time.Since(began).Round(time.Millisecond))
	stmts := rec.Statements()
	if len(stmts) == 0 {
		t.Fatal("no statement recorded")
	}
	kinds := map[string]int{}
	for _, s := range stmts {
		// SET LOCAL and the fetches' guard (a local set_config) last until
		// the transaction's end, which a transaction pooler keeps on one
		// server connection.
		if sessionState.MatchString(s) && !strings.HasPrefix(s, "SET LOCAL ") && s != fetchGuard {
			t.Errorf("statement with session state: %s", s)
		}
		if w := strings.Fields(s); len(w) > 0 {
			kinds[strings.ToUpper(w[0])]++
		}
	}
	t.Logf("%d statements checked for session state: %v", len(stmts), kinds)
}
