package relay_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// saslDB opens the database of the SASL_SSL tests: PostgreSQL when the
// environment names it, else SQLite (the store is not what they test).
func saslDB(t *testing.T) *gorm.DB {
	t.Helper()
	dbs := testenv.Databases(t)
	o := dbs[0]
	for _, d := range dbs {
		if d.Name == testenv.Postgres {
			o = d
		}
	}
	return o.Open(t, nil)
}

// saslSetup opens a database with the outbox plugin and tables, and a
// gormstore over it.
func saslSetup(t *testing.T, n *relay.Notifier) (*gorm.DB, *gormstore.Store) {
	t.Helper()
	db := saslDB(t)
	return db, e2eStore(t, db, n)
}

// enqueueSASL commits rows transactions of one keyed record each (every
// fifth transaction also enqueues a record and then rolls back) and returns
// the committed records by message id and the rolled-back ids.
func enqueueSASL(t *testing.T, db *gorm.DB, topic string, rows int) (committed map[string]*outbox.Message, rolledBack map[string]bool) {
	t.Helper()
	committed, rolledBack = map[string]*outbox.Message{}, map[string]bool{}
	for i := range rows {
		m := outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i%7), fmt.Sprintf("value-%d", i))
		if err := db.Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, m) }); err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
		committed[m.MessageID.String()] = m
		if i%5 == 4 {
			rb := outbox.NewStringMessage(topic, "rolled-back", fmt.Sprintf("rolled-back-%d", i))
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := outbox.Enqueue(tx, rb); err != nil {
					return err
				}
				return errors.New("rolled back on purpose")
			})
			if err == nil {
				t.Fatal("rolled-back transaction committed")
			}
			rolledBack[rb.MessageID.String()] = true
		}
	}
	return committed, rolledBack
}

// TestEndToEndSASLSSL moves GORM-enqueued rows through gormstore, the relay
// and a kafkapub.Publisher whose Transport speaks TLS (verified with the test
// CA) and SASL to the real broker's SASL_SSL listener, and reads every
// record back over that listener with its message-id header: with
// SCRAM-SHA-512, and with PLAIN.
func TestEndToEndSASLSSL(t *testing.T) {
	b, ok := testenv.RealSASLBroker(t)
	if !ok {
		t.Skipf("no SASL_SSL broker: set %s, %s, %s and %s (scripts/services.sh start prints them)",
			testenv.EnvKafkaSASL, testenv.EnvKafkaSASLUser, testenv.EnvKafkaSASLPassword, testenv.EnvKafkaCAFile)
	}
	for _, tc := range []struct {
		name string
		mech func() sasl.Mechanism
	}{
		{"scram-sha-512", func() sasl.Mechanism { return b.SCRAM(t, b.Password) }},
		{"plain", func() sasl.Mechanism { return b.Plain(b.Password) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			topic := testenv.Unique("e2e-sasl-")
			b.CreateTopic(t, topic, 4)

			n := relay.NewNotifier()
			db, store := saslSetup(t, n)
			r, done := startKafkaRelay(ctx, t, db, store, n, kafkapub.Config{Brokers: b.Addrs, Transport: b.Transport(t, tc.mech())})

			committed, rolledBack := enqueueSASL(t, db, topic, 60)
			checkRecords(t, b.ReadAll(t, topic, len(committed), time.Minute), committed, rolledBack)
			waitOutboxEmpty(ctx, t, db)
			if err := r.Health(); err != nil {
				t.Errorf("Health() = %v; want nil", err)
			}
			stopRelay(t, cancel, done)
		})
	}
}

// errorRecorder is a Publisher that remembers the errors of the wrapped
// publisher's results.
type errorRecorder struct {
	relay.Publisher
	mu   sync.Mutex
	errs []error
}

func (p *errorRecorder) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := p.Publisher.Publish(ctx, batches)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, res := range results {
		if res.Err != nil {
			p.errs = append(p.errs, res.Err)
		}
	}
	return results
}

func (p *errorRecorder) errors() []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.errs...)
}

// TestSASLWrongPassword runs the relay against the SASL_SSL listener with a
// wrong SCRAM-SHA-512 password: every publish fails with kafka-go's
// SASLAuthenticationFailed, named in the relay's WARN line; the
// publish.failures counter rises; Health reports the authentication
// failure; no row is acknowledged or deleted. A
// relay with the right password then publishes every row once the
// credentials are fixed: nothing is lost.
func TestSASLWrongPassword(t *testing.T) {
	b, ok := testenv.RealSASLBroker(t)
	if !ok {
		t.Skipf("no SASL_SSL broker: set %s and the rest (scripts/services.sh start prints them)", testenv.EnvKafkaSASL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.Unique("e2e-sasl-badpw-")
	b.CreateTopic(t, topic, 4)
	db, store := saslSetup(t, nil)
	committed, rolledBack := enqueueSASL(t, db, topic, 30)

	// 1. the wrong password
	bad, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs, Transport: b.Transport(t, b.SCRAM(t, b.Password+"-wrong"))})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	rec := &errorRecorder{Publisher: bad}
	var logs testenv.Logs
	reader := metrictest.NewReader()
	opts := relay.Options{
		PollInterval:       50 * time.Millisecond,
		ErrorBackoff:       20 * time.Millisecond,
		LeaseRenewInterval: 200 * time.Millisecond,
		LeaseDuration:      5 * time.Second,
		Logger:             logs.Logger(),
		MeterProvider:      reader.MeterProvider(),
		SingleWriter:       db.Dialector.Name() == "sqlite",
	}
	r, err := relay.New(store, rec, opts)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	deadline := time.Now().Add(30 * time.Second)
	for len(rec.errors()) < 3 || reader.Read(t).Values[relay.MetricPublishFailures] < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %d publish errors, publish.failures %v; want at least 3 (logs:\n%s)",
				len(rec.errors()), reader.Read(t).Values[relay.MetricPublishFailures], strings.Join(logs.Matching(""), "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, err := range rec.errors() {
		if !errors.Is(err, kafka.SASLAuthenticationFailed) {
			t.Fatalf("publish error %d = %v; want one matching kafka.SASLAuthenticationFailed", i, err)
		}
	}
	t.Logf("publish error: %v", rec.errors()[0])
	// One WARN line for the kind of failure (the other buckets' copies are
	// DEBUG), whichever bucket logged it first.
	warn := slices.DeleteFunc(logs.Matching("publish failed"), func(l string) bool { return !strings.Contains(l, "level=WARN") })
	if len(warn) == 0 || !strings.Contains(warn[0], "SASL Authentication Failed") {
		t.Fatalf("WARN lines %q; want a publish failure naming SASL Authentication Failed", warn)
	}
	t.Logf("log line: %s", warn[0])
	if got := reader.Read(t).Values[relay.MetricPublishAcknowledged]; got != 0 {
		t.Fatalf("publish.acknowledged = %v with a wrong password; want 0", got)
	}
	var left int64
	if err := db.Model(&outbox.Message{}).Count(&left).Error; err != nil {
		t.Fatal(err)
	}
	if int(left) != len(committed) {
		t.Fatalf("%d rows in the outbox with a wrong password; want all %d kept", left, len(committed))
	}
	checkWrongPasswordHealth(t, r)
	stopRelay(t, stop, done)

	// 2. fixed: a publisher with the right password publishes every row
	good, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs, Transport: b.Transport(t, b.SCRAM(t, b.Password))})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	opts.Logger, opts.MeterProvider = nil, nil
	r2, err := relay.New(store, good, opts)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- r2.Run(ctx) }()
	checkRecords(t, b.ReadAll(t, topic, len(committed), time.Minute), committed, rolledBack)
	waitOutboxEmpty(ctx, t, db)
	if err := r2.Health(); err != nil {
		t.Errorf("Health() with the right password = %v; want nil", err)
	}
	stopRelay(t, cancel, done)
}

// checkWrongPasswordHealth checks Health while every publish fails to
// authenticate: unhealthy, wrapping kafka-go's SASLAuthenticationFailed
// and ErrPublisherAuth (unlike other publish failures, which are not cycle
// failures).
func checkWrongPasswordHealth(t *testing.T, r *relay.Relay) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for { // (until the first cycle completes, Health says so first)
		err := r.Health()
		if errors.Is(err, kafka.SASLAuthenticationFailed) && errors.Is(err, relay.ErrPublisherAuth) && strings.Contains(err.Error(), "cannot authenticate to Kafka") {
			t.Logf("Health() = %v", err)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Health() = %v; want the authentication failure", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSASLUntrustedBrokerCertificate publishes to the SASL_SSL listener
// with a TLS configuration that does not trust the test CA: the publish
// fails with an error matching x509.UnknownAuthorityError, the relay
// reports it in Health, and no row is deleted.
func TestSASLUntrustedBrokerCertificate(t *testing.T) {
	b, ok := testenv.RealSASLBroker(t)
	if !ok {
		t.Skipf("no SASL_SSL broker: set %s and the rest (scripts/services.sh start prints them)", testenv.EnvKafkaSASL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := testenv.Unique("e2e-sasl-untrusted-")
	b.CreateTopic(t, topic, 1)
	db, store := saslSetup(t, nil)
	committed, _ := enqueueSASL(t, db, topic, 5)
	tr := &kafka.Transport{TLS: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}, SASL: b.SCRAM(t, b.Password)}
	t.Cleanup(tr.CloseIdleConnections)
	pub, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	rec := &errorRecorder{Publisher: pub}
	r, err := relay.New(store, rec, relay.Options{PollInterval: 50 * time.Millisecond, ErrorBackoff: 20 * time.Millisecond, LeaseRenewInterval: 200 * time.Millisecond, LeaseDuration: 5 * time.Second, SingleWriter: db.Dialector.Name() == "sqlite"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var unknownCA x509.UnknownAuthorityError
	for len(rec.errors()) == 0 || !errors.As(r.Health(), &unknownCA) { // (the first cycle: "no cycle completed yet")
		if ctx.Err() != nil {
			t.Fatalf("no failed publish and unhealthy relay after a minute (errors %v, Health %v)", rec.errors(), r.Health())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := rec.errors()[0]; !errors.As(err, &unknownCA) {
		t.Fatalf("publish error = %v; want one matching x509.UnknownAuthorityError", err)
	}
	t.Logf("Health() = %v", r.Health())
	var left int64
	if err := db.Model(&outbox.Message{}).Count(&left).Error; err != nil {
		t.Fatal(err)
	}
	if int(left) != len(committed) {
		t.Fatalf("%d rows left; want all %d kept", left, len(committed))
	}
	stopRelay(t, cancel, done)
}
