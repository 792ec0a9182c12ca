package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// pausePublishTimeout is the relay's kafkapub.Config.PublishTimeout in
// TestRelayRecoversFromAPausedRealBroker.
const pausePublishTimeout = 2 * time.Second

// realBrokerPID returns the pid of the real broker's JVM, read from the pid
// file scripts/services.sh writes ($OUTBOX_SERVICES_DIR/kafka/kafka.pid; see
// testenv.BrokerPID); it skips (fails under OUTBOX_TEST_REQUIRE_ALL)
// when the file or the process is missing.
func realBrokerPID(t *testing.T) int {
	t.Helper()
	pid, err := testenv.BrokerPID()
	if err != nil {
		if testenv.RequireAll() {
			t.Fatalf("%v and %s=1", err, testenv.EnvRequireAll)
		}
		t.Skip(err)
	}
	return pid
}

// pausableBroker skips unless OUTBOX_CHAOS is set (a test that freezes the
// shared broker must not run beside the other packages' tests), and
// returns the real broker and the pid of its JVM.
func pausableBroker(t *testing.T) (testenv.Broker, int) {
	t.Helper()
	if v := os.Getenv(EnvChaos); v == "" || v == "0" {
		t.Skipf("set %s=1 to run the reliability harness", EnvChaos)
	}
	broker, ok := testenv.RealBroker(t)
	if !ok {
		t.Skipf("%s is not set", testenv.EnvKafka)
	}
	return broker, realBrokerPID(t)
}

// pauseMetrics reads the relay's publish failures and in-flight age.
func pauseMetrics(t *testing.T, r *sdkmetric.ManualReader) (failures int64, inflightAge float64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == relay.MetricPublishFailures {
					for _, p := range d.DataPoints {
						failures += p.Value
					}
				}
			case metricdata.Gauge[float64]:
				if m.Name == relay.MetricPublishStalled {
					for _, p := range d.DataPoints {
						inflightAge = max(inflightAge, p.Value)
					}
				}
			}
		}
	}
	return failures, inflightAge
}

// TestRelayRecoversFromAPausedRealBroker freezes the real broker (SIGSTOP
// of its JVM: connections stay open, nothing answers) for three times the
// relay's PublishTimeout while writers keep enqueuing, and checks that the
// relay counted and logged a failed publish within the bound (generously:
// under 3 × PublishTimeout), that its in-flight gauge showed the stall,
// and that once the broker resumed every committed row was delivered (0
// lost, no per-key order violation after dedup; duplicates are reported).
func TestRelayRecoversFromAPausedRealBroker(t *testing.T) {
	broker, pid := pausableBroker(t)

	db := freshDB(t, "pause-test")
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatalf("AutoMigrate: %v", err)
	}
	if err := db.Use(outbox.Plugin{}); err != nil {
		t.Fatal(err)
	}

	const partitions = 8
	topic := fmt.Sprintf("chaos-pause-%08x", rand.Uint32())
	broker.CreateTopic(t, topic, partitions, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consumer := chaos.StartConsumer(ctx, broker.Addrs, topic, partitions)
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: broker.Addrs, PublishTimeout: pausePublishTimeout})
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	logs := &testenv.Logs{}
	rl, err := relay.New(store, pub, relay.Options{
		PollInterval: 100 * time.Millisecond, ErrorBackoff: 250 * time.Millisecond, BatchSize: 100,
		MeterProvider: mp, Logger: logs.Logger(), SingleWriter: db.Dialector.Name() == "sqlite",
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	var stopOnce sync.Once
	stopRelay := func() {
		stopOnce.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v; want nil after a stop", err)
			}
			if err := pub.Close(); err != nil {
				t.Logf("publisher Close = %v", err)
			}
			consumer.Wait()
			_ = mp.Shutdown(context.Background())
		})
	}
	t.Cleanup(stopRelay)

	// One writer: batches of 10 rows over 20 keys, every 50 ms, retrying a
	// failed transaction; the ledger holds committed ids in commit order.
	var (
		mu       sync.Mutex
		perKey   = map[string][]string{}
		all      []string
		writeErr error
	)
	writerStop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for seq := 0; ; {
			select {
			case <-writerStop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			var msgs []*outbox.Message
			for range 10 {
				msgs = append(msgs, outbox.NewStringMessage(topic, fmt.Sprintf("k%d", seq%20), strconv.Itoa(seq)))
				seq++
			}
			if err := db.Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, msgs...) }); err != nil {
				mu.Lock()
				writeErr = errors.Join(writeErr, err)
				mu.Unlock()
				continue
			}
			mu.Lock()
			for _, m := range msgs {
				perKey[string(m.Key)] = append(perKey[string(m.Key)], m.MessageID.String())
				all = append(all, m.MessageID.String())
			}
			mu.Unlock()
		}
	}()
	var writerOnce sync.Once
	stopWriter := func() { writerOnce.Do(func() { close(writerStop); <-writerDone }) }
	t.Cleanup(stopWriter)

	// Delivery flows.
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, _, total := consumer.Snapshot(); total >= 200 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("fewer than 200 records 30s into the run, before any pause")
		}
	}
	baseFailures, _ := pauseMetrics(t, reader)
	baseWarns := len(logs.Matching("publish failed"))

	// Freeze the broker; it is resumed whatever happens.
	var contOnce sync.Once
	var contAt time.Time
	resume := func() {
		contOnce.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT %d: %v", pid, err)
			}
			contAt = time.Now()
		})
	}
	t.Cleanup(resume)
	defer resume()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %d: %v", pid, err)
	}
	pausedAt := time.Now()

	bound := 3 * pausePublishTimeout
	var failureAfter, warnAfter time.Duration
	var maxAge float64
	for time.Since(pausedAt) < bound {
		failures, age := pauseMetrics(t, reader)
		maxAge = max(maxAge, age)
		if failureAfter == 0 && failures > baseFailures {
			failureAfter = time.Since(pausedAt)
		}
		if warnAfter == 0 && len(logs.Matching("publish failed")) > baseWarns {
			warnAfter = time.Since(pausedAt)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	committedBeforeCont := append([]string(nil), all...)
	mu.Unlock()
	resume()
	pausedFor := contAt.Sub(pausedAt)

	// Writers keep going a little after the resume, then stop.
	var backlogAt, lastAt time.Time
	for time.Since(contAt) < time.Second {
		if backlogAt.IsZero() && consumer.Has(committedBeforeCont) {
			backlogAt = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopWriter()
	mu.Lock()
	ids := append([]string(nil), all...)
	mu.Unlock()

	drained := false
	for end := time.Now().Add(40 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if backlogAt.IsZero() && consumer.Has(committedBeforeCont) {
			backlogAt = time.Now()
		}
		if lastAt.IsZero() && consumer.Has(ids) {
			lastAt = time.Now()
		}
		var n int64
		if err := db.Model(&outbox.Message{}).Count(&n).Error; err == nil && n == 0 && !lastAt.IsZero() {
			drained = true
			break
		}
	}
	stopRelay()

	ck := consumer.Verify(perKey, nil, nil, nil)
	since := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return at.Sub(contAt).Round(time.Millisecond).String()
	}
	t.Logf("paused=%v publish_timeout=%v first_failure_after=%v first_warn_after=%v max_stalled=%.2fs messages=%d lost=%d duplicates=%d order_violations=%d backlog_after_cont=%s last_record_after_cont=%s",
		pausedFor.Round(time.Millisecond), pausePublishTimeout, failureAfter.Round(time.Millisecond), warnAfter.Round(time.Millisecond), maxAge,
		len(ids), ck.Lost, ck.Duplicates, ck.OrderViolations, since(backlogAt), since(lastAt))

	if failureAfter == 0 {
		t.Errorf("no %s counted within %v of the pause (PublishTimeout %v)", relay.MetricPublishFailures, bound, pausePublishTimeout)
	}
	if warnAfter == 0 {
		t.Errorf("no WARN \"publish failed\" within %v of the pause; logs:\n%s", bound, strings.Join(logs.Matching("level="), "\n"))
	} else if warns := logs.Matching("publish failed")[baseWarns:]; !slices.ContainsFunc(warns, func(l string) bool { return strings.Contains(l, "level=WARN") }) {
		t.Errorf("the publish failure was not logged at WARN (one line of its kind; the rest at DEBUG): %s", warns)
	}
	if maxAge <= 0 {
		t.Errorf("%s stayed 0 while the broker was paused", relay.MetricPublishStalled)
	}
	if writeErr != nil {
		t.Logf("writer transactions that failed (not in the ledger): %v", writeErr)
	}
	if !drained {
		var n int64
		db.Model(&outbox.Message{}).Count(&n)
		t.Errorf("not drained 40s after the resume: %d rows left in the outbox, all consumed: %v", n, !lastAt.IsZero())
	}
	if ck.Lost != 0 || ck.OrderViolations != 0 {
		t.Errorf("lost %d, order violations %d; want 0 and 0", ck.Lost, ck.OrderViolations)
	}
	checkNothingParked(t, db, strings.Join(logs.Matching("row parked"), ""))
}
