package pgnotify_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/pgnotify"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// crossPod is two relays in one process, each with its own database handle,
// plugin, notifier and LISTEN/NOTIFY transport, as two pods would have.
type crossPod struct {
	dbA, dbB *gorm.DB
	pubA     *relaytest.Publisher
	pubB     *relaytest.Publisher
	owners   func() map[int]string
}

func openPod(t *testing.T, dsn string, clock relay.Clock, now func() time.Time, id string, channel string, poll time.Duration) (*gorm.DB, *relaytest.Publisher) {
	t.Helper()
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	n := relay.NewNotifier()
	if err := db.Use(outbox.Plugin{Notifier: n}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	store, err := gormstore.New(db, gormstore.Options{Clock: nowFunc(now)})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := pgnotify.New(pgnotify.Config{ConnString: dsn, Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	pub := relaytest.NewPublisher()
	r, err := relay.New(store, pub, relay.Options{
		RelayID: id, Clock: clock, PollInterval: poll, Notifier: n, HintTransport: tr,
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
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Run = %v", id, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s: Run did not return", id)
		}
	})
	return db, pub
}

func leaseOwners(t *testing.T, db *gorm.DB) map[int]string {
	t.Helper()
	var ls []outbox.BucketLease
	if err := db.Find(&ls).Error; err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, l := range ls {
		if l.Owner != nil {
			out[int(l.Bucket)] = *l.Owner
		}
	}
	return out
}

// TestCommitInOnePodWakesTheOwnerInAnother: with polling at an hour and a
// clock that does not move, a commit through pod A's plugin to a bucket
// owned by pod B wakes B through LISTEN/NOTIFY, and B publishes it.
func TestCommitInOnePodWakesTheOwnerInAnother(t *testing.T) {
	dsn, ok := testenv.PostgresDSN(t)
	if !ok {
		t.Skip("OUTBOX_TEST_POSTGRES_DSN not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clock := relaytest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	channel := testenv.Unique("outbox_")
	dbA, pubA := openPod(t, dsn, clock, clock.Now, "pod-a", channel, time.Hour)
	if !clock.WaitForWaiters(ctx, 1) {
		t.Fatal("pod A never went idle")
	}
	_, pubB := openPod(t, dsn, clock, clock.Now, "pod-b", channel, time.Hour)
	if !clock.WaitForWaiters(ctx, 2) {
		t.Fatal("pod B never went idle")
	}
	// Rebalance until each pod owns half of the buckets. After each round
	// of the clock the pods' acquisitions may still be running: look again
	// for a moment before the next round.
	var bBucket = -1
	settled := func() bool {
		owners := leaseOwners(t, dbA)
		if len(owners) != 8 {
			return false
		}
		for b, o := range owners {
			if o == "pod-b" {
				bBucket = b
			}
		}
		return bBucket >= 0
	}
	for i := 0; i < 10 && bBucket < 0; i++ {
		for look := time.Now().Add(2 * time.Second); !settled() && time.Now().Before(look); {
			time.Sleep(20 * time.Millisecond)
		}
		if bBucket >= 0 {
			break
		}
		clock.Advance(relay.DefaultLeaseRenewInterval)
		if !clock.WaitForWaiters(ctx, 2) {
			t.Fatal("pods did not settle")
		}
	}
	if bBucket < 0 {
		t.Fatalf("owners = %v; want pod-b to own some bucket", leaseOwners(t, dbA))
	}
	frozen := clock.Now()
	// Both listeners must be subscribed: a hint sent before B listens would
	// be lost (polling, at an hour, would then find it).
	waitListeners(ctx, t, dbA, channel, 2)

	p := int32(bBucket)
	m := &outbox.Message{Topic: "orders", Partition: &p, Value: []byte("for pod b")}
	start := time.Now()
	if err := dbA.Create(m).Error; err != nil {
		t.Fatal(err)
	}
	if !pubB.WaitCalls(ctx, 1) {
		t.Fatal("pod B was not woken by pod A's commit")
	}
	t.Logf("commit in pod A → publish in pod B: %v", time.Since(start))
	if got := pubB.Calls()[0][0].MessageID; got != m.MessageID {
		t.Fatalf("pod B published %s; want %s", got, m.MessageID)
	}
	if len(pubA.Calls()) != 0 {
		t.Fatalf("pod A published %d batches; want 0 (it does not own bucket %d)", len(pubA.Calls()), bBucket)
	}
	if !clock.Now().Equal(frozen) {
		t.Fatal("the clock moved: pod B must wake without polling")
	}
}

// TestWriterOnlyProcessWakesTheRelay: a process that writes outbox rows but
// runs no relay (its plugin notifies a pgnotify.Sender) wakes the relay of
// another process through LISTEN/NOTIFY, with that relay's polling at an
// hour and its clock frozen.
func TestWriterOnlyProcessWakesTheRelay(t *testing.T) {
	dsn, ok := testenv.PostgresDSN(t)
	if !ok {
		t.Skip("OUTBOX_TEST_POSTGRES_DSN not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clock := relaytest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	channel := testenv.Unique("outbox_")
	relayDB, pub := openPod(t, dsn, clock, clock.Now, "worker", channel, time.Hour)
	if !clock.WaitForWaiters(ctx, 1) {
		t.Fatal("the relay never went idle")
	}

	// The writer process: plugin + Sender, no relay.
	tr, err := pgnotify.New(pgnotify.Config{ConnString: dsn, Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	sender := tr.NewSender(pgnotify.SenderOptions{})
	sctx, scancel := context.WithCancel(ctx)
	sent := make(chan error, 1)
	go func() { sent <- sender.Run(sctx) }()
	defer func() {
		scancel()
		if err := <-sent; err != nil {
			t.Errorf("Sender.Run = %v; want nil after the stop", err)
		}
	}()
	writer, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s, err := writer.DB(); err == nil {
			s.Close()
		}
	}()
	if err := writer.Use(outbox.Plugin{Notifier: sender}); err != nil {
		t.Fatal(err)
	}
	waitListeners(ctx, t, relayDB, channel, 1)

	m := &outbox.Message{Topic: "orders", Key: []byte("k"), Value: []byte("from a writer-only process")}
	if err := writer.Create(m).Error; err != nil {
		t.Fatal(err)
	}
	if !pub.WaitCalls(ctx, 1) {
		t.Fatal("the relay was not woken by the writer's commit")
	}
	if got := pub.Calls()[0][0].MessageID; got != m.MessageID {
		t.Fatalf("published %s; want %s", got, m.MessageID)
	}
	if !clock.Now().Equal(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatal("the clock moved: the relay must wake without polling")
	}
}

// waitListeners waits until n sessions LISTEN on channel.
func waitListeners(ctx context.Context, t *testing.T, db *gorm.DB, channel string, n int) {
	t.Helper()
	for {
		var got int
		if err := db.Raw("SELECT count(*) FROM pg_stat_activity WHERE query LIKE ?", "LISTEN%"+channel+"%").Scan(&got).Error; err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d listeners on %s; want %d", got, channel, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nowFunc is a gormstore.Clock reading a function.
type nowFunc func() time.Time

func (f nowFunc) Now() time.Time { return f() }
