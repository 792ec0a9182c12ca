// Package testenv gives tests the databases and Kafka brokers that are
// available: SQLite and an in-process broker always; PostgreSQL, MySQL or
// MariaDB, and a real Apache Kafka broker when the environment names them.
//
//	OUTBOX_TEST_POSTGRES_DSN   e.g. host=127.0.0.1 port=55432 user=postgres dbname=outbox_test sslmode=disable
//	OUTBOX_TEST_MYSQL_DSN      e.g. root@tcp(127.0.0.1:53306)/outbox_test?parseTime=true
//	OUTBOX_TEST_KAFKA_BROKERS  e.g. 127.0.0.1:59092
//	OUTBOX_TEST_REQUIRE_ALL=1  a missing service fails the test instead of being left out
//
// Every call hands out a fresh, empty database (a new database on the
// server, dropped at cleanup), so tests and packages can run in parallel.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Environment variable names.
const (
	EnvPostgres   = "OUTBOX_TEST_POSTGRES_DSN"
	EnvMySQL      = "OUTBOX_TEST_MYSQL_DSN"
	EnvKafka      = "OUTBOX_TEST_KAFKA_BROKERS"
	EnvRequireAll = "OUTBOX_TEST_REQUIRE_ALL"
)

// Dialect names, as gorm's Dialector.Name() reports them.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
	MySQL    = "mysql"
)

// RequireAll reports whether OUTBOX_TEST_REQUIRE_ALL asks for every service.
func RequireAll() bool {
	v := os.Getenv(EnvRequireAll)
	return v != "" && v != "0" && v != "false"
}

// isSet reports whether every variable of names is set; when one is not,
// it fails t under OUTBOX_TEST_REQUIRE_ALL.
func isSet(t testing.TB, names ...string) bool {
	t.Helper()
	var missing []string
	for _, n := range names {
		if os.Getenv(n) == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 && RequireAll() {
		t.Fatalf("testenv: %s not set and %s=1 (scripts/services.sh start prints them)", strings.Join(missing, ", "), EnvRequireAll)
	}
	return len(missing) == 0
}

// Opener opens a fresh empty database of one dialect.
type Opener struct {
	// Name is the dialect name: sqlite, postgres or mysql.
	Name string
	open func(t testing.TB, cfg *gorm.Config) *gorm.DB
}

// Open returns a fresh, empty database, closed and dropped at cleanup. A nil
// cfg means a quiet logger and gorm's defaults.
func (o Opener) Open(t testing.TB, cfg *gorm.Config) *gorm.DB {
	t.Helper()
	if cfg == nil {
		cfg = &gorm.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = logger.Default.LogMode(logger.Silent)
	}
	return o.open(t, cfg)
}

// Databases returns an Opener for each available database: SQLite always,
// PostgreSQL and MySQL when their DSN is set. Under OUTBOX_TEST_REQUIRE_ALL a
// missing DSN fails t.
func Databases(t testing.TB) []Opener {
	t.Helper()
	dbs := []Opener{{Name: SQLite, open: func(t testing.TB, cfg *gorm.Config) *gorm.DB {
		return open(t, SQLite, SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")), cfg)
	}}}
	for _, server := range []struct{ name, env string }{{Postgres, EnvPostgres}, {MySQL, EnvMySQL}} {
		if isSet(t, server.env) {
			base := os.Getenv(server.env)
			dbs = append(dbs, Opener{Name: server.name, open: func(t testing.TB, cfg *gorm.Config) *gorm.DB {
				return open(t, server.name, createDB(t, server.name, base), cfg)
			}})
		}
	}
	return dbs
}

// ForEachDB runs f as a subtest named after each available database, with a
// fresh database opened with cfg (nil for defaults).
func ForEachDB(t *testing.T, cfg *gorm.Config, f func(t *testing.T, db *gorm.DB)) {
	t.Helper()
	for _, o := range Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			var c *gorm.Config
			if cfg != nil {
				cc := *cfg
				c = &cc
			}
			f(t, o.Open(t, c))
		})
	}
}

// Unique returns prefix followed by random hex, for database and topic names.
func Unique(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// open opens dsn of dialect, its pool closed at cleanup: before the DROP
// DATABASE a createDB registered earlier.
func open(t testing.TB, dialect, dsn string, cfg *gorm.Config) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(Dialector(dialect, dsn), cfg)
	if err != nil {
		t.Fatalf("testenv: open %s: %v", dialect, err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

// createDB creates a database on the server of base, dropped at cleanup,
// and returns its DSN.
func createDB(t testing.TB, dialect, base string) string {
	t.Helper()
	dsn, drop, err := CreateDatabase(context.Background(), dialect, base, Unique("outbox_t_"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return dsn
}

// DialectorOn returns a gorm dialector of the dialect name (Postgres, MySQL
// or SQLite) on an existing pool, e.g. for a dbresolver replica or source.
func DialectorOn(name string, pool gorm.ConnPool) gorm.Dialector {
	switch name {
	case Postgres:
		return postgres.New(postgres.Config{Conn: pool})
	case MySQL:
		return mysql.New(mysql.Config{Conn: pool, SkipInitializeWithVersion: true})
	default:
		return &sqlite.Dialector{Conn: pool}
	}
}

// MustExec runs statements on db, failing t on error.
func MustExec(t testing.TB, db *gorm.DB, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if err := db.Exec(s).Error; err != nil {
			t.Fatalf("testenv: %s: %v", s, err)
		}
	}
}

// PostgresDSN returns OUTBOX_TEST_POSTGRES_DSN pointed at a fresh database
// (dropped at cleanup), or ok false when it is not set (a failure under
// OUTBOX_TEST_REQUIRE_ALL).
func PostgresDSN(t testing.TB) (dsn string, ok bool) {
	t.Helper()
	if !isSet(t, EnvPostgres) {
		return "", false
	}
	return createDB(t, Postgres, os.Getenv(EnvPostgres)), true
}
