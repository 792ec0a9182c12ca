package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
			if strings.Contains(stderr, "outbox-relay -h") {
				t.Errorf("stderr = %q; a runtime failure must not point at the flags", stderr)
			}
			if strings.Contains(stderr, "secret") {
				t.Errorf("stderr = %q; want no password", stderr)
			}
		})
	}
}
