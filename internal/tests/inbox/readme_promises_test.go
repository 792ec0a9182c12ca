package inbox_test

// Tests of what the README's "Consuming" section promises and no other
// test pins down: the defaults and the instruments behind the metrics
// table. The metric names as the Prometheus exporter shows them are checked
// in the cmd module (cmd/outbox-relay,
// TestInboxMetricNamesAsThePrometheusExporterShowsThem): the exporter and
// the OpenTelemetry SDK stay out of the library module's go.mod (see
// scripts/importer-check.sh).

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

func TestDocumentedDefaults(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"DefaultTable", inbox.DefaultTable, "inbox_processed_messages"},
		{"DefaultRetention", inbox.DefaultRetention, 7 * 24 * time.Hour},
		{"DefaultPurgeBatchSize", inbox.DefaultPurgeBatchSize, 1000},
		{"DefaultPurgeInterval", inbox.DefaultPurgeInterval, time.Hour},
		{"DefaultRetryBackoff", inbox.DefaultRetryBackoff, 500 * time.Millisecond},
		{"DefaultMaxRetryBackoff", inbox.DefaultMaxRetryBackoff, 30 * time.Second},
		{"DefaultMaxAttempts", inbox.DefaultMaxAttempts, 5},
		{"DefaultCommitTimeout", inbox.DefaultCommitTimeout, 5 * time.Second},
		{"MaxMessageIDLength", inbox.MaxMessageIDLength, 300},
		{"MaxHandlerLength", inbox.MaxHandlerLength, 128},
		{"dead-letter headers", []string{inbox.HeaderError, inbox.HeaderHandler, inbox.HeaderAttempts, inbox.HeaderTopic, inbox.HeaderPartition, inbox.HeaderOffset},
			[]string{"x-inbox-error", "x-inbox-handler", "x-inbox-attempts", "x-inbox-topic", "x-inbox-partition", "x-inbox-offset"}},
	} {
		if !equalAny(c.got, c.want) {
			t.Errorf("%s = %v; the README documents %v", c.name, c.got, c.want)
		}
	}
	ib, _ := setup(t, testenv.Databases(t)[0].Open(t, nil), inbox.Options{})
	if id, err := ib.MessageID(record("orders", 0, 0, "from-the-relay")); err != nil || id != "from-the-relay" {
		t.Errorf("MessageID with x-outbox-message-id = %q, %v; want the header", id, err)
	}
}

func equalAny(a, b any) bool {
	as, aok := a.([]string)
	bs, bok := b.([]string)
	if aok && bok {
		return strings.Join(as, ",") == strings.Join(bs, ",")
	}
	return a == b
}

// queueReader is an in-memory Reader: it hands out its records, then
// blocks until ctx is done; commits are accepted, each signalled on
// commits when it is non-nil.
type queueReader struct {
	mu      sync.Mutex
	msgs    []kafka.Message
	commits chan kafka.Message
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

func (q *queueReader) CommitMessages(_ context.Context, msgs ...kafka.Message) error {
	if q.commits != nil {
		for _, m := range msgs {
			q.commits <- m
		}
	}
	return nil
}

// memWriter is an in-memory dead-letter Writer.
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

// TestMetricInstrumentsBehindTheREADMEsTable proves the instruments behind
// the README's inbox metrics table: the six of them, with the kinds and
// units that make the OpenTelemetry Prometheus exporter show the
// documented names and types (a counter gains _total, unit s _seconds, a
// {annotation} nothing), each carrying inbox.handler (inbox.table for the
// purge counter), and no other. cmd/outbox-relay's
// TestInboxMetricNamesAsThePrometheusExporterShowsThem checks the names
// themselves through the exporter.
func TestMetricInstrumentsBehindTheREADMEsTable(t *testing.T) {
	clock := relaytest.NewManualClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	db := testenv.Databases(t)[0].Open(t, nil)
	ib, reader := setup(t, db, inbox.Options{Clock: clock, Retention: time.Hour})
	ctx := withTimeout(t, time.Minute)

	// processed, duplicates, failures, the duration: three Handle calls.
	nop := func(*gorm.DB) error { return nil }
	for _, id := range []string{"m-1", "m-1", ""} {
		_, _ = ib.Handle(ctx, "readme", record("orders", 0, 0, id), nop)
	}
	// dead_lettered: a Consumer whose handler always fails.
	dlq := &memWriter{}
	c, err := inbox.NewConsumer(ib, &queueReader{msgs: []kafka.Message{record("orders", 0, 1, "poison")}}, "readme", func(*gorm.DB, kafka.Message) error {
		return errInjected
	}, inbox.ConsumerOptions{DeadLetter: dlq, DeadLetterTopic: "dlq", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c)
	for deadline := time.Now().Add(30 * time.Second); dlq.len() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the record was never dead-lettered")
		}
	}
	stop()
	// purged: m-1 is two hours old.
	clock.Advance(2 * time.Hour)
	if n, err := ib.Purge(ctx); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1", n, err)
	}

	type instrument struct {
		kind metrictest.Kind
		unit string
	}
	want := map[string]instrument{
		inbox.MetricProcessed:      {metrictest.Counter, "{message}"}, // inbox_processed_total
		inbox.MetricDuplicates:     {metrictest.Counter, "{message}"}, // inbox_duplicates_total
		inbox.MetricFailures:       {metrictest.Counter, "{attempt}"}, // inbox_failures_total
		inbox.MetricHandleDuration: {metrictest.Histogram, "s"},       // inbox_handle_duration_seconds
		inbox.MetricDeadLettered:   {metrictest.Counter, "{message}"}, // inbox_dead_lettered_total
		inbox.MetricPurged:         {metrictest.Counter, "{message}"}, // inbox_purged_total
	}
	got, err := reader.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	seen := map[string]bool{}
	for _, p := range got {
		seen[p.Name] = true
		w, ok := want[p.Name]
		if !ok {
			t.Errorf("instrument %s is not in the README's metrics table", p.Name)
			continue
		}
		if p.Kind != w.kind || p.Unit != w.unit {
			t.Errorf("%s is a %s in %q; the README's name and type need a %s in %q", p.Name, p.Kind, p.Unit, w.kind, w.unit)
		}
		key, value := inbox.AttrHandler, "readme"
		if p.Name == inbox.MetricPurged {
			key, value = inbox.AttrTable, inbox.DefaultTable
		}
		if v := p.Attr(key); v != value {
			t.Errorf("%s has %s=%q; want %q", p.Name, key, v, value)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s has no data point", name)
		}
	}
}
