package main

// The inbox's metric names as the Prometheus exporter shows them, next to
// the relay's (readme_promises_test.go). The inbox is no part of the
// worker; the test lives here because this module has the OpenTelemetry SDK
// and the Prometheus exporter, which the library module must not require
// (scripts/importer-check.sh). inbox's TestMetricInstrumentsBehindTheREADMEsTable
// (internal/tests/inbox) pins the instruments' kinds, units and attributes
// without the exporter.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// inboxRecord returns a record of topic at partition/offset carrying id in
// the outbox's message-id header ("" for none).
func inboxRecord(topic string, partition int, offset int64, id string) kafka.Message {
	m := kafka.Message{Topic: topic, Partition: partition, Offset: offset, Key: []byte("k"), Value: []byte("v")}
	if id != "" {
		m.Headers = []kafka.Header{{Key: kafkapub.DefaultMessageIDHeader, Value: []byte(id)}}
	}
	return m
}

// queueReader is an in-memory inbox.Reader: it hands out its records, then
// blocks until ctx is done; commits are accepted.
type queueReader struct {
	mu   sync.Mutex
	msgs []kafka.Message
}

func (q *queueReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	q.mu.Lock()
	if len(q.msgs) > 0 {
		m := q.msgs[0]
		q.msgs = q.msgs[1:]
		q.mu.Unlock()
		return m, nil
	}
	q.mu.Unlock()
	<-ctx.Done()
	return kafka.Message{}, ctx.Err()
}

func (q *queueReader) CommitMessages(context.Context, ...kafka.Message) error { return nil }

// memWriter is an in-memory dead-letter inbox.Writer.
type memWriter struct {
	mu   sync.Mutex
	msgs []kafka.Message
}

func (w *memWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msgs...)
	return nil
}

func (w *memWriter) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.msgs)
}

// TestInboxMetricNamesAsThePrometheusExporterShowsThem proves the README's
// inbox metrics table: the six instruments, exported through the
// OpenTelemetry Prometheus exporter, have the documented names and types
// and carry inbox_handler (inbox_table for the purge counter), and no other
// inbox_ metric exists.
func TestInboxMetricNamesAsThePrometheusExporterShowsThem(t *testing.T) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	clock := relaytest.NewManualClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	db := testenv.Databases(t)[0].Open(t, nil)
	cfg := inbox.Config{}
	if err := inbox.AutoMigrate(db, cfg); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, inbox.Options{Config: cfg, MeterProvider: mp, Clock: clock, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// processed, duplicates, failures, the duration: three Handle calls.
	nop := func(*gorm.DB) error { return nil }
	for _, id := range []string{"m-1", "m-1", ""} {
		_, _ = ib.Handle(ctx, "readme", inboxRecord("orders", 0, 0, id), nop)
	}
	// dead_lettered: a Consumer whose handler always fails.
	dlq := &memWriter{}
	c, err := inbox.NewConsumer(ib, &queueReader{msgs: []kafka.Message{inboxRecord("orders", 0, 1, "poison")}}, "readme", func(*gorm.DB, kafka.Message) error {
		return errors.New("injected failure")
	}, inbox.ConsumerOptions{DeadLetter: dlq, DeadLetterTopic: "dlq", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for deadline := time.Now().Add(30 * time.Second); dlq.len() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			stop()
			<-done
			t.Fatal("the record was never dead-lettered")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Consumer.Run = %v; want nil after the stop", err)
	}
	// purged: m-1 is two hours old.
	clock.Advance(2 * time.Hour)
	if n, err := ib.Purge(ctx); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1", n, err)
	}

	want := map[string]dto.MetricType{
		"inbox_processed_total":         dto.MetricType_COUNTER,
		"inbox_duplicates_total":        dto.MetricType_COUNTER,
		"inbox_failures_total":          dto.MetricType_COUNTER,
		"inbox_handle_duration_seconds": dto.MetricType_HISTOGRAM,
		"inbox_dead_lettered_total":     dto.MetricType_COUNTER,
		"inbox_purged_total":            dto.MetricType_COUNTER,
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		got[f.GetName()] = f
	}
	for name, typ := range want {
		f := got[name]
		if f == nil {
			t.Errorf("%s is not exported", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s has type %v; the README documents %v", name, f.GetType(), typ)
		}
		label, value := "inbox_handler", "readme"
		if name == "inbox_purged_total" {
			label, value = "inbox_table", inbox.DefaultTable
		}
		for _, m := range f.GetMetric() {
			v := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					v = l.GetValue()
				}
			}
			if v != value {
				t.Errorf("%s has %s=%q; want %q", name, label, v, value)
			}
		}
	}
	for name := range got {
		if _, ok := want[name]; strings.HasPrefix(name, "inbox_") && !ok {
			t.Errorf("exported %s is not in the README's metrics table", name)
		}
	}
}
