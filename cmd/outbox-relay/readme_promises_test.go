package main

// Tests of worker behaviour the README promises and no other test pins
// down: -h lists the flags with their environment variables, a flag on the
// command line wins over its variable, /healthz answers 503 with the
// reason while the relay is not running, and /metrics shows the relay's
// instruments under the names of the README's metrics table.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

func noEnv(string) string { return "" }

func TestHelpListsTheDocumentedFlagsWithTheirEnvironmentVariables(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"help", "flags"}, noEnv, &out, &errOut); code != 0 {
		t.Fatalf("outbox-relay help flags exited %d; want 0\nstderr: %s", code, errOut.String())
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
			t.Errorf("outbox-relay help flags lacks %q", want)
		}
	}
	for _, v := range []string{"OUTBOX_DB_DSN", "OUTBOX_KAFKA_SASL_PASSWORD"} {
		if !strings.Contains(help, "["+v+"]") {
			t.Errorf("outbox-relay help flags lacks the variable %s", v)
		}
	}
	// Every flag is listed with its variable.
	newFlagSet(&config{}).VisitAll(func(f *flag.Flag) {
		if want := "-" + f.Name + "  [" + envName(f.Name) + "]"; !strings.Contains(help, want) {
			t.Errorf("outbox-relay help flags lacks %q", want)
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

// offsetStore is a MemStore that reports a clock offset, as gormstore does.
type offsetStore struct{ *relaytest.MemStore }

func (offsetStore) ClockOffset() (time.Duration, time.Duration, bool) {
	return -40 * time.Second, time.Millisecond, true
}

// TestMetricNamesAsThePrometheusExporterShowsThem proves the README's
// metrics table: the relay's fourteen instruments, exported through the
// OpenTelemetry SDK and Prometheus exporter exactly as the worker sets them
// up (build), have the documented names and types and carry
// outbox_name="outbox" by default, and no other outbox_ metric exists.
// (relay's TestMetricInstrumentsBehindTheREADMEsTable pins the instruments'
// kinds and units without the exporter.)
func TestMetricNamesAsThePrometheusExporterShowsThem(t *testing.T) {
	cfg, err := parseConfig([]string{"-db-driver", "sqlite", "-db-dsn", "unused.db", "-kafka-brokers", "127.0.0.1:1"}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	w, err := build(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)

	// Every counter gets a sample: the first publish fails; the retry hangs
	// past the lease while every renewal fails, so the lease set is lost,
	// and is then acknowledged. The store reports a clock offset and backlog
	// samples.
	store := offsetStore{relaytest.NewMemStore(2, time.Now)}
	store.SetHook(func(_ context.Context, op string) error {
		if op == relaytest.OpRenew {
			return errors.New("database unreachable")
		}
		return nil
	})
	store.AddToBucket(0, outbox.NewStringMessage("t", "k", "v"))
	pub := relaytest.NewPublisher()
	var calls atomic.Int64
	pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		switch calls.Add(1) {
		case 1:
			return relay.Result{Err: errors.New("broker unavailable")}
		case 2:
			select {
			case <-ctx.Done():
				return relay.Result{Err: ctx.Err()}
			case <-time.After(time.Second): // over three leases
			}
		}
		return relay.Result{Acknowledged: len(b)}
	})
	r, err := relay.New(store, pub, relay.Options{
		BucketCount: 2, MeterProvider: w.mp, MetricsBacklog: true, MetricsInterval: 20 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, ErrorBackoff: 20 * time.Millisecond,
		LeaseDuration: 300 * time.Millisecond, LeaseRenewInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	want := map[string]dto.MetricType{
		"outbox_owned_buckets":              dto.MetricType_GAUGE,
		"outbox_buckets_unowned":            dto.MetricType_GAUGE,
		"outbox_publish_acknowledged_total": dto.MetricType_COUNTER,
		"outbox_publish_failures_total":     dto.MetricType_COUNTER,
		"outbox_lease_expirations_total":    dto.MetricType_COUNTER,
		"outbox_fenced_total":               dto.MetricType_COUNTER,
		"outbox_publish_duration_seconds":   dto.MetricType_HISTOGRAM,
		"outbox_cycle_duration_seconds":     dto.MetricType_HISTOGRAM,
		"outbox_pending_messages":           dto.MetricType_GAUGE,
		"outbox_pending_oldest_age_seconds": dto.MetricType_GAUGE,
		"outbox_pending_available_ratio":    dto.MetricType_GAUGE,
		"outbox_head_oldest_age_seconds":    dto.MetricType_GAUGE,
		"outbox_publish_stalled_seconds":    dto.MetricType_GAUGE,
		"outbox_parked_total":               dto.MetricType_COUNTER,
		"outbox_parked_messages":            dto.MetricType_GAUGE,
		"outbox_clock_offset_seconds":       dto.MetricType_GAUGE,
	}
	var got map[string]*dto.MetricFamily
	eventually(t, "every documented metric", gathered{&got}, func() bool {
		fams, err := w.reg.Gather()
		if err != nil {
			t.Fatalf("Gather: %v", err)
		}
		got = map[string]*dto.MetricFamily{}
		for _, f := range fams {
			got[f.GetName()] = f
		}
		for name := range want {
			if got[name] == nil {
				return false
			}
		}
		return true
	})
	for name, typ := range want {
		f := got[name]
		if f.GetType() != typ {
			t.Errorf("%s has type %v; the README documents %v", name, f.GetType(), typ)
		}
		for _, m := range f.GetMetric() {
			label := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "outbox_name" {
					label = l.GetValue()
				}
			}
			if label != "outbox" {
				t.Errorf("%s has outbox_name=%q; want %q", name, label, "outbox")
			}
		}
	}
	for name := range got {
		if _, ok := want[name]; strings.HasPrefix(name, "outbox_") && !ok {
			t.Errorf("exported %s is not in the README's metrics table", name)
		}
	}
}

// gathered prints the metric families of the latest Gather on failure.
type gathered struct{ got *map[string]*dto.MetricFamily }

func (g gathered) String() string {
	var names []string
	for name := range *g.got {
		names = append(names, name)
	}
	slices.Sort(names)
	return fmt.Sprintf("gathered: %s", strings.Join(names, " "))
}
