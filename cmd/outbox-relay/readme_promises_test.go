package main

// Tests of worker behaviour the README promises and no other test pins
// down: -h lists the flags with their environment variables, a flag on the
// command line wins over its variable, and /healthz answers 503 with the
// reason while the relay is not running.

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
)

func noEnv(string) string { return "" }

func TestHelpListsTheDocumentedFlagsWithTheirEnvironmentVariables(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, noEnv, &out, &errOut); code != 0 {
		t.Fatalf("outbox-relay -h exited %d; want 0\nstderr: %s", code, errOut.String())
	}
	help := out.String()
	// The flags and variables the README names.
	for _, name := range []string{
		"db-driver", "db-dsn", "migrate", "kafka-brokers", "kafka-client-id",
		"kafka-tls", "kafka-tls-ca", "kafka-tls-cert", "kafka-tls-key", "kafka-tls-server-name",
		"kafka-sasl-mechanism", "kafka-sasl-password",
		"batch-size", "poll-interval", "lease-duration",
		"notify-postgres-dsn", "notify-channel", "listen", "log-format", "log-level",
	} {
		if want := "-" + name + "  [" + envName(name) + "]"; !strings.Contains(help, want) {
			t.Errorf("outbox-relay -h lacks %q", want)
		}
	}
	for _, v := range []string{"OUTBOX_DB_DSN", "OUTBOX_KAFKA_SASL_PASSWORD"} {
		if !strings.Contains(help, "["+v+"]") {
			t.Errorf("outbox-relay -h lacks the variable %s", v)
		}
	}
	// Every flag is listed with its variable.
	newFlagSet(&config{}).VisitAll(func(f *flag.Flag) {
		if want := "-" + f.Name + "  [" + envName(f.Name) + "]"; !strings.Contains(help, want) {
			t.Errorf("outbox-relay -h lacks %q", want)
		}
	})
}

// base is the smallest valid command line: SQLite and an unreachable
// broker (nothing connects before Run).
func base(t *testing.T) []string {
	return []string{"-db-driver", "sqlite", "-db-dsn", filepath.Join(t.TempDir(), "w.db"), "-kafka-brokers", "127.0.0.1:1"}
}

func TestCommandLineFlagWinsOverItsEnvironmentVariable(t *testing.T) {
	env := map[string]string{"OUTBOX_POLL_INTERVAL": "soon", "OUTBOX_LOG_FORMAT": "xml"}
	getenv := func(k string) string { return env[k] }
	if _, err := parseConfig(base(t), getenv); err == nil || !strings.Contains(err.Error(), "OUTBOX_POLL_INTERVAL") {
		t.Fatalf("invalid OUTBOX_POLL_INTERVAL alone: parseConfig = %v; want an error naming it", err)
	}
	args := append(base(t), "-poll-interval", "2s", "-log-format", "json")
	if _, err := parseConfig(args, getenv); err != nil {
		t.Fatalf("flags given on the command line: parseConfig = %v; want their variables ignored", err)
	}
}

func TestHealthzIs503WithTheReasonUntilTheRelayRuns(t *testing.T) {
	cfg, err := parseConfig(append(base(t), "-listen", "127.0.0.1:0"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	w, err := build(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	rec := httptest.NewRecorder()
	w.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	body := strings.TrimSpace(rec.Body.String())
	if rec.Code != http.StatusServiceUnavailable || body == "" || body == "ok" {
		t.Fatalf("GET /healthz before the relay runs = %d %q; want 503 with the reason", rec.Code, body)
	}
}
