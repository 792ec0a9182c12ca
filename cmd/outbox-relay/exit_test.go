package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// runWorker runs bin to completion (at most a minute) and returns its exit
// code and stderr.
func runWorker(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	_ = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("worker still running after a minute\n%s", stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

// TestWorkerExitsOneWhenTheDatabaseIsUnreachable: a well-formed DSN whose
// server cannot be reached is a runtime failure (exit 1) on every driver,
// not a configuration error, even where the driver dials while opening.
func TestWorkerExitsOneWhenTheDatabaseIsUnreachable(t *testing.T) {
	bin := buildWorker(t)
	for _, tc := range []struct{ driver, dsn string }{
		{"mysql", "app:secret@tcp(127.0.0.1:1)/app?timeout=5s"},
		{"postgres", "host=127.0.0.1 port=1 user=app password=secret dbname=app sslmode=disable connect_timeout=5"},
		{"sqlite", "file:" + filepath.Join(t.TempDir(), "no", "such", "dir", "outbox.db") + "?mode=rw"},
	} {
		t.Run(tc.driver, func(t *testing.T) {
			code, stderr := runWorker(t, bin, "-db-driver", tc.driver, "-db-dsn", tc.dsn,
				"-kafka-brokers", "127.0.0.1:1", "-listen", "")
			if code != exitFailure {
				t.Fatalf("exit code = %d; want %d\n%s", code, exitFailure, stderr)
			}
			if !strings.Contains(stderr, "database unreachable") {
				t.Errorf("stderr = %q; want it to say the database is unreachable", stderr)
			}
			if strings.Contains(stderr, "outbox-relay help flags") || strings.Contains(stderr, "outbox-relay -h") {
				t.Errorf("stderr = %q; a runtime failure must not point at the flags", stderr)
			}
			if strings.Contains(stderr, "secret") {
				t.Errorf("stderr = %q; want no password", stderr)
			}
		})
	}
}

// dsnOf returns the DSN a gorm.DB was opened with.
func dsnOf(t *testing.T, db *gorm.DB) (driver, dsn string) {
	t.Helper()
	switch d := db.Dialector.(type) {
	case *sqlite.Dialector:
		return "sqlite", d.DSN
	case *postgres.Dialector:
		return "postgres", d.DSN
	case *mysql.Dialector:
		return "mysql", d.DSN
	}
	t.Fatalf("unknown dialector %T", db.Dialector)
	return "", ""
}

// TestWorkerWithoutMigrateExitsOnMissingTables: started without -migrate
// on a database that lacks outbox tables, the worker names exactly the
// missing tables in one error, suggests -migrate and the dialect's DDL file,
// and exits 1 at once, instead of retrying forever; gorm logs no SQL.
func TestWorkerWithoutMigrateExitsOnMissingTables(t *testing.T) {
	bin := buildWorker(t)
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		driver, dsn := dsnOf(t, db)
		cfg := outbox.Config{MessagesTable: "w_messages", LeasesTable: "w_leases", RelaysTable: "w_relays"}
		// Only the leases table exists.
		if err := db.Table(cfg.LeasesTableName()).AutoMigrate(&outbox.BucketLease{}); err != nil {
			t.Fatal(err)
		}
		args := []string{"-db-driver", driver, "-db-dsn", dsn, "-kafka-brokers", "127.0.0.1:1", "-listen", "",
			"-messages-table", "w_messages", "-leases-table", "w_leases", "-relays-table", "w_relays"}
		start := time.Now()
		code, stderr := runWorker(t, bin, args...)
		if code != exitFailure {
			t.Fatalf("exit code = %d; want %d\n%s", code, exitFailure, stderr)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("exit after %v; want it at start", d)
		}
		var errLines []string
		for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
			if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
				errLines = append(errLines, l)
			}
		}
		if len(errLines) != 1 {
			t.Fatalf("want exactly one warning or error line, got %d:\n%s", len(errLines), stderr)
		}
		msg := errLines[0]
		for _, want := range []string{"w_messages", "w_relays", "-migrate", "migrations/" + driver + ".sql"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q lacks %q", msg, want)
			}
		}
		if strings.Contains(msg, "w_leases") {
			t.Errorf("error %q names w_leases, which exists", msg)
		}
		for _, bad := range []string{"SELECT", "INSERT", "SQL executed"} {
			if strings.Contains(stderr, bad) {
				t.Errorf("stderr shows SQL (%q):\n%s", bad, stderr)
			}
		}

		// With -migrate the same start creates them and runs.
		w := startWorker(t, bin, append(args[:len(args):len(args)], "-migrate", "-listen", "127.0.0.1:0", "-log-format", "json"))
		w.terminate(t)
		for _, tbl := range []string{"w_messages", "w_leases", "w_relays"} {
			if !db.Migrator().HasTable(tbl) {
				t.Errorf("table %s missing after -migrate", tbl)
			}
		}
	})
}
