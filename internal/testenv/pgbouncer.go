package testenv

import (
	"context"
	"os"
	"testing"

	"gorm.io/gorm"
)

// EnvPgBouncer names PgBouncer in transaction pooling mode in front of the
// PostgreSQL of OUTBOX_TEST_POSTGRES_DSN, e.g.
//
//	host=127.0.0.1 port=56432 user=postgres dbname=outbox_test sslmode=disable default_query_exec_mode=exec
//
// (scripts/services.sh starts one). Its databases are created and dropped
// through OUTBOX_TEST_POSTGRES_DSN, so both must be set; the pooler must
// forward any database name (a "*" entry in its [databases]).
const EnvPgBouncer = "OUTBOX_TEST_PGBOUNCER_DSN"

// PgBouncer is the Opener name of PostgreSQL reached through PgBouncer; its
// gorm dialect is still postgres.
const PgBouncer = "pgbouncer"

// PgBouncerDSN creates a fresh database directly on the PostgreSQL server
// (dropped at cleanup) and returns OUTBOX_TEST_PGBOUNCER_DSN pointed at it,
// to be connected through the pooler; direct is OUTBOX_TEST_POSTGRES_DSN
// pointed at the same database. ok is false when either variable is unset
// (a failure under OUTBOX_TEST_REQUIRE_ALL). A later key=value appended to
// dsn overrides the pooler DSN's own (pgx keeps the last), e.g.
// dsn+" default_query_exec_mode=cache_statement".
func PgBouncerDSN(t testing.TB) (dsn, direct string, ok bool) {
	t.Helper()
	if !isSet(t, EnvPgBouncer, EnvPostgres) {
		return "", "", false
	}
	name := Unique("outbox_t_")
	direct, drop, err := CreateDatabase(context.Background(), Postgres, os.Getenv(EnvPostgres), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return WithPostgresParam(os.Getenv(EnvPgBouncer), "dbname", name), direct, true
}

// PgBouncerOpener returns an Opener (Name "pgbouncer") whose every Open
// creates a fresh database directly on PostgreSQL and connects to it through
// PgBouncer; ok is false when OUTBOX_TEST_PGBOUNCER_DSN or
// OUTBOX_TEST_POSTGRES_DSN is unset (a failure under
// OUTBOX_TEST_REQUIRE_ALL). In transaction pooling mode use gorm's
// PrepareStmt false (the default) and a DSN exec mode that prepares no named
// statement (exec or simple_protocol).
func PgBouncerOpener(t testing.TB) (Opener, bool) {
	t.Helper()
	if !isSet(t, EnvPgBouncer, EnvPostgres) {
		return Opener{}, false
	}
	return Opener{Name: PgBouncer, open: func(t testing.TB, cfg *gorm.Config) *gorm.DB {
		t.Helper()
		dsn, _, _ := PgBouncerDSN(t)
		return open(t, Postgres, dsn, cfg)
	}}, true
}
