package kafkapub_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// hangBound is the generous bound on a Publish call against a hung broker
// with a 1 s PublishTimeout: no tight timing assertion, but far below
// kafka-go's own 10 attempts × 10 s.
const hangBound = 5 * time.Second

// hangProduce makes c hold every produce request it receives (the broker
// stops answering, as a SIGSTOPped one does) until the returned release is
// called; held produce requests are then handled as usual (appended). held
// counts the produce requests that were held. release is idempotent and is
// also called at cleanup, before the cluster closes.
func hangProduce(t *testing.T, c *kfake.Cluster) (release func(), held *atomic.Int64) {
	t.Helper()
	held = new(atomic.Int64)
	released := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		select {
		case <-released:
			return nil, nil, false
		default:
		}
		held.Add(1)
		c.SleepControl(func() { <-released })
		return nil, nil, false
	})
	t.Cleanup(release)
	return release, held
}

func boundTopic(t *testing.T, b testenv.Broker, partitions int) string {
	t.Helper()
	name := regexp.MustCompile(`[^a-zA-Z0-9._-]+`).ReplaceAllString(t.Name(), "_")
	topic := fmt.Sprintf("%s-%08x", name, rand.Uint32())
	b.CreateTopic(t, topic, partitions, nil)
	return topic
}

func boundPublisher(t *testing.T, b testenv.Broker, timeout time.Duration) *kafkapub.Publisher {
	t.Helper()
	p, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs, PublishTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
	return p
}

// TestKafkaPublisher_PublishTimeout_bounds_a_publish_to_a_hung_broker: with
// PublishTimeout 1s, a Publish against a broker that never answers produce
// requests returns, well within kafka-go's retry budget, an error wrapping
// context.DeadlineExceeded that names PublishTimeout, with nothing
// acknowledged; once the broker answers again the same batch is
// acknowledged.
func TestKafkaPublisher_PublishTimeout_bounds_a_publish_to_a_hung_broker(t *testing.T) {
	b := testenv.NewFake(t)
	topic := boundTopic(t, b, 4)
	p := boundPublisher(t, b, time.Second)
	// Warm up: metadata cached, connections open.
	warm := []*outbox.Message{{MessageID: outbox.NewUUID(), Topic: topic, Key: []byte("warm")}}
	if res := p.Publish(context.Background(), [][]*outbox.Message{warm})[0]; res.Err != nil || res.Acknowledged != 1 {
		t.Fatalf("warm-up Publish = %+v", res)
	}

	release, held := hangProduce(t, b.Fake)
	var batch []*outbox.Message
	for i := range 20 {
		batch = append(batch, &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")})
	}
	start := time.Now()
	res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
	took := time.Since(start)
	t.Logf("Publish against a hung broker returned after %v: %+v", took, res)
	if took > hangBound {
		t.Errorf("Publish took %v against a hung broker; want about PublishTimeout (1s), < %v", took, hangBound)
	}
	if res.Acknowledged != 0 {
		t.Errorf("Acknowledged = %d; want 0 (the broker answered nothing)", res.Acknowledged)
	}
	if !errors.Is(res.Err, context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(res.Err), "PublishTimeout") {
		t.Errorf("Err = %v; want one wrapping context.DeadlineExceeded and naming PublishTimeout", res.Err)
	}
	if held.Load() == 0 {
		t.Errorf("no produce request was held; the test did not hang the broker")
	}

	// The broker answers again: the retried batch is acknowledged (the held
	// requests may have been appended as well: duplicates, never losses).
	release()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res = p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
		if res.Err == nil && res.Acknowledged == len(batch) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Publish after the broker resumed = %+v; want all %d acknowledged", res, len(batch))
		}
		time.Sleep(100 * time.Millisecond)
	}
	recs := b.ReadAll(t, topic, 1+len(batch), 10*time.Second)
	seen := map[string]int{}
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key == kafkapub.DefaultMessageIDHeader {
				seen[string(h.Value)]++
			}
		}
	}
	for _, m := range batch {
		if seen[m.MessageID.String()] == 0 {
			t.Errorf("message %s lost", m.MessageID)
		}
	}
	t.Logf("%d records for %d messages (duplicates from the held requests: %d)", len(recs), 1+len(batch), len(recs)-1-len(batch))
}

// logBuffer is a goroutine-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// metricValues returns the counters' sums and the gauges' values r
// collects, by instrument name.
func metricValues(t *testing.T, r *metrictest.Reader) map[string]float64 {
	t.Helper()
	points, err := r.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	out := map[string]float64{}
	for _, p := range points {
		switch p.Kind {
		case metrictest.Counter:
			out[p.Name] += p.Value
		case metrictest.Gauge:
			out[p.Name] = p.Value
		}
	}
	return out
}

// TestRelay_hung_broker_is_counted_logged_and_visible_then_delivered: a
// relay publishing through a Publisher with PublishTimeout 1s to a
// broker that stops answering produce requests counts a failure and logs a
// WARN naming the timeout within a few seconds, its in-flight gauge shows
// the stall meanwhile, every failed attempt is one count and one line (WARN,
// or DEBUG for an error repeated within a minute), and
// once the broker answers again every row is delivered (0 lost; the held
// requests may add duplicates).
func TestRelay_hung_broker_is_counted_logged_and_visible_then_delivered(t *testing.T) {
	b := testenv.NewFake(t)
	topic := boundTopic(t, b, 4)
	pub := boundPublisher(t, b, time.Second)
	release, held := hangProduce(t, b.Fake)

	store := relaytest.NewMemStore(4, time.Now)
	var rows []*outbox.Message
	for i := range 40 {
		rows = append(rows, &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: fmt.Appendf(nil, "key-%d", i), Value: fmt.Appendf(nil, "v%d", i)})
	}
	store.Add(rows...)
	reader := metrictest.NewReader()
	logs := &logBuffer{}
	r, err := relay.New(store, pub, relay.Options{
		BucketCount:   4,
		PollInterval:  50 * time.Millisecond,
		ErrorBackoff:  200 * time.Millisecond,
		MeterProvider: reader.MeterProvider(),
		Logger:        slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v; want nil", err)
			}
		}
	}
	t.Cleanup(stop)

	// The stall shows: the in-flight age grows, then the failure is counted
	// and logged, all within the generous bound.
	var maxAge float64
	var firstFailure time.Duration
	for {
		m := metricValues(t, reader)
		maxAge = max(maxAge, m[relay.MetricPublishStalled])
		if m[relay.MetricPublishFailures] >= 1 {
			firstFailure = time.Since(start)
			break
		}
		if time.Since(start) > hangBound {
			t.Fatalf("no publish failure counted %v into a hung broker (in-flight age seen: %vs)", hangBound, maxAge)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("first failure counted %v after the relay started against a hung broker; in-flight age seen before it: %.2fs", firstFailure, maxAge)
	if maxAge <= 0 {
		t.Errorf("%s stayed 0 while the publish hung", relay.MetricPublishStalled)
	}
	waitLog := time.Now().Add(hangBound)
	for !strings.Contains(logs.String(), "publish failed") {
		if time.Now().After(waitLog) {
			t.Fatalf("no WARN for the failed publish; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "PublishTimeout") {
		t.Errorf("the WARN does not name the timeout; logs:\n%s", logs.String())
	}

	// Keep the broker hung a little longer: more attempts, each bounded.
	time.Sleep(1500 * time.Millisecond)
	if held.Load() == 0 {
		t.Fatal("no produce request was held; the test did not hang the broker")
	}
	release()
	for store.Len() > 0 {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%d rows still pending 30s after the start", store.Len())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()

	m := metricValues(t, reader)
	failures := m[relay.MetricPublishFailures]
	// A line per failed attempt: WARN, or DEBUG for an error repeated
	// within a minute (a head row retried alone fails as it did in its
	// group).
	lines := strings.Count(logs.String(), "publish failed")
	warns := strings.Count(logs.String(), "level=WARN msg=\"publish failed")
	if failures < 2 || float64(lines) != failures || warns < 1 {
		t.Errorf("failures counted = %v, lines = %d (%d WARN); want equal, at least 2 (one per bounded attempt), a WARN among them", failures, lines, warns)
	}
	if age := m[relay.MetricPublishStalled]; age != 0 {
		t.Errorf("%s after the stop = %v; want 0", relay.MetricPublishStalled, age)
	}
	recs := b.ReadAll(t, topic, len(rows), 10*time.Second)
	seen := map[string]int{}
	for _, rec := range recs {
		for _, h := range rec.Headers {
			if h.Key == kafkapub.DefaultMessageIDHeader {
				seen[string(h.Value)]++
			}
		}
	}
	lost := 0
	for _, m := range rows {
		if seen[m.MessageID.String()] == 0 {
			lost++
		}
	}
	if lost != 0 {
		t.Errorf("%d of %d rows lost", lost, len(rows))
	}
	t.Logf("%v failed attempts, %d held produce requests; %d records for %d rows (%d duplicates), 0 lost", failures, held.Load(), len(recs), len(rows), len(recs)-len(rows))
}
