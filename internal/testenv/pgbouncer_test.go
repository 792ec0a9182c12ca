package testenv_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestPgBouncerExecModes checks which pgx exec modes survive PgBouncer's
// transaction pooling: exec and simple_protocol do (no named statement, one
// round trip); cache_statement (pgx's default) fails with "prepared
// statement ... already exists / does not exist", describe_exec with
// "unnamed prepared statement does not exist". Eight clients on one pool
// make the server connections change hands.
func TestPgBouncerExecModes(t *testing.T) {
	for _, c := range []struct {
		mode string
		ok   bool
	}{{"exec", true}, {"simple_protocol", true}, {"cache_statement", false}} {
		t.Run(c.mode, func(t *testing.T) {
			dsn, _, ok := testenv.PgBouncerDSN(t)
			if !ok {
				t.Skipf("%s not set", testenv.EnvPgBouncer)
			}
			db, err := sql.Open("pgx", dsn+" default_query_exec_mode="+c.mode)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(8)
			var (
				wg    sync.WaitGroup
				mu    sync.Mutex
				first error
			)
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 200; i++ {
						var n int
						if err := db.QueryRowContext(context.Background(), fmt.Sprintf("SELECT $1::int + %d", i%5), i).Scan(&n); err != nil {
							mu.Lock()
							if first == nil {
								first = err
							}
							mu.Unlock()
							return
						}
					}
				}()
			}
			wg.Wait()
			switch {
			case c.ok && first != nil:
				t.Fatalf("%s through pgbouncer: %v", c.mode, first)
			case !c.ok && first == nil:
				t.Fatalf("%s through pgbouncer: no error; want a prepared statement error", c.mode)
			case !c.ok && !strings.Contains(first.Error(), "prepared statement"):
				t.Fatalf("%s through pgbouncer: %v; want a prepared statement error", c.mode, first)
			case !c.ok:
				t.Logf("%s through pgbouncer fails as documented: %v", c.mode, first)
			}
		})
	}
}

func TestPgBouncerOpenerFreshDatabase(t *testing.T) {
	o, ok := testenv.PgBouncerOpener(t)
	if !ok {
		t.Skipf("%s not set", testenv.EnvPgBouncer)
	}
	a, b := o.Open(t, nil), o.Open(t, nil)
	var na, nb string
	if err := a.Raw("SELECT current_database()").Scan(&na).Error; err != nil {
		t.Fatal(err)
	}
	if err := b.Raw("SELECT current_database()").Scan(&nb).Error; err != nil {
		t.Fatal(err)
	}
	if na == nb || !strings.HasPrefix(na, "outbox_t_") {
		t.Fatalf("databases %q and %q; want two fresh outbox_t_ databases", na, nb)
	}
	testenv.MustExec(t, a, "CREATE TABLE x (id int)", "INSERT INTO x VALUES (1)")
}
