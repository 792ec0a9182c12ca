package chaos_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
)

// pauseLease is the lease of the relay processes of
// TestPausedRelayProcessPublishesNoRowBehindAPeersParkedHead.
const pauseLease = 3 * time.Second

// TestPausedRelayProcessPublishesNoRowBehindAPeersParkedHead (defect 1 of
// issue 27, with worker processes): relay-a owns every bucket and is
// SIGSTOPped past its lease; relay-b takes the buckets, parks key K's head
// (a record larger than the publisher's BatchBytes: unpublishable) and
// stops gracefully; K gets a third row; relay-a is SIGCONTed, takes the
// same buckets back and publishes another key's row of K's bucket, but
// neither of K's rows behind the parked head. Before issue 27 relay-a kept
// its stale, empty view of the parked keys and published K's third row.
func TestPausedRelayProcessPublishesNoRowBehindAPeersParkedHead(t *testing.T) {
	bin, brokers := setup(t)
	forEachDatabase(t, func(t *testing.T, dialect, dsn string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		d, err := chaos.CreateDatabase(ctx, dialect, dsn, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Drop(context.Background()) })
		brokers := brokers
		if brokers == nil {
			fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(8))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(fake.Close)
			brokers = fake.ListenAddrs()
		}
		topic := fmt.Sprintf("pause-park-%d", time.Now().UnixNano())
		if err := chaos.CreateTopic(ctx, brokers, topic, 8); err != nil {
			t.Fatal(err)
		}
		db, err := chaos.Open(dialect, d.DSN, "pause-park-harness", 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Use(outbox.Plugin{}); err != nil {
			t.Fatal(err)
		}
		rs := &chaos.Relays{Bin: bin, LogDir: t.TempDir(), Base: chaos.RelayConfig{
			Dialect: dialect, DSN: d.RelayDSN, Brokers: brokers,
			LeaseDuration: pauseLease, RenewInterval: time.Second, PollInterval: 200 * time.Millisecond, BatchSize: 100,
		}}
		t.Cleanup(func() { rs.StopAll(10 * time.Second) })

		waitFor := func(what string, within time.Duration, cond func() bool) {
			t.Helper()
			for end := time.Now().Add(within); !cond(); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("no %s within %v (relay logs in %s)", what, within, rs.LogDir)
				}
			}
		}
		ownsAll := func(id string) func() bool {
			return func() bool {
				var n int64
				err := db.Raw("SELECT COUNT(*) FROM outbox_leases WHERE owner = ? AND expires_at_ms > ?", id, time.Now().UnixMilli()).Scan(&n).Error
				return err == nil && n == outbox.DefaultBucketCount
			}
		}
		enqueue := func(key, value string) int64 {
			t.Helper()
			m := outbox.NewMessage(topic, []byte(key), []byte(value))
			if err := outbox.Enqueue(db.WithContext(ctx), m); err != nil {
				t.Fatal(err)
			}
			return m.ID
		}
		present := func(id int64) bool {
			var n int64
			if err := db.Table(outbox.DefaultMessagesTable).Where("id = ?", id).Count(&n).Error; err != nil {
				t.Fatal(err)
			}
			return n == 1
		}
		parked := func(id int64) bool {
			var n int64
			if err := db.Table(outbox.DefaultMessagesTable).Where("id = ? AND parked_at_ms IS NOT NULL", id).Count(&n).Error; err != nil {
				t.Fatal(err)
			}
			return n == 1
		}

		a, err := rs.Start("relay-a")
		if err != nil {
			t.Fatal(err)
		}
		waitFor("relay-a owning every bucket", 30*time.Second, ownsAll("relay-a"))
		a.Signal(syscall.SIGSTOP)
		time.Sleep(pauseLease + time.Second) // a real process: its lease runs out in real time

		b, err := rs.Start("relay-b")
		if err != nil {
			t.Fatal(err)
		}
		waitFor("relay-b owning every bucket", 30*time.Second, ownsAll("relay-b"))
		head := enqueue("K", "K0:"+strings.Repeat("x", 2<<20)) // beyond BatchBytes (1 MiB): unpublishable
		second := enqueue("K", "K1")
		waitFor("K's head parked by relay-b", time.Minute, func() bool { return parked(head) })
		b.Stop(10 * time.Second)
		third := enqueue("K", "K2")

		a.Signal(syscall.SIGCONT)
		waitFor("relay-a owning every bucket again", 30*time.Second, ownsAll("relay-a"))
		other := otherKeyOfBucket("K")
		control := enqueue(other, "control")
		waitFor("relay-a publishing a row of K's bucket", 30*time.Second, func() bool { return !present(control) })
		time.Sleep(3 * time.Second) // several more sweeps of K's bucket
		for _, id := range []int64{second, third} {
			if !present(id) {
				t.Errorf("K's row %d behind the parked head %d was published (deleted from the table)", id, head)
			}
		}
		if !parked(head) {
			t.Fatalf("K's head %d is no longer parked", head)
		}
	})
}

// otherKeyOfBucket returns a key other than key that the outbox places in
// key's bucket (default bucket count).
func otherKeyOfBucket(key string) string {
	want := outbox.BucketOf([]byte(key), nil, outbox.UUID{}, outbox.DefaultBucketCount)
	for i := 0; ; i++ {
		k := fmt.Sprintf("other-%d", i)
		if outbox.BucketOf([]byte(k), nil, outbox.UUID{}, outbox.DefaultBucketCount) == want {
			return k
		}
	}
}

// TestCLIRequeueOfARepairedCorruptRowReleasesNothingBehindTheParkedHead
// (defect 2 of issue 27, with a worker process and the CLI): key K's first
// row C is corrupt (parked alone), its second H unpublishable (parked);
// the operator repairs C and runs `outbox-relay requeue -id C`, as the
// runbook says. C is published; H's later rows, and one committed
// afterwards, stay in the table.
func TestCLIRequeueOfARepairedCorruptRowReleasesNothingBehindTheParkedHead(t *testing.T) {
	bin, brokers := setup(t)
	cli := filepath.Join(t.TempDir(), "outbox-relay")
	if out, err := exec.Command("go", "build", "-o", cli, "github.com/gorm-outbox/outbox/cmd/outbox-relay").CombinedOutput(); err != nil {
		t.Fatalf("build outbox-relay: %v\n%s", err, out)
	}
	forEachDatabase(t, func(t *testing.T, dialect, dsn string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		d, err := chaos.CreateDatabase(ctx, dialect, dsn, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Drop(context.Background()) })
		brokers := brokers
		if brokers == nil {
			fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(8))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(fake.Close)
			brokers = fake.ListenAddrs()
		}
		topic := fmt.Sprintf("requeue-corrupt-%d", time.Now().UnixNano())
		if err := chaos.CreateTopic(ctx, brokers, topic, 8); err != nil {
			t.Fatal(err)
		}
		db, err := chaos.Open(dialect, d.DSN, "requeue-corrupt-harness", 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Use(outbox.Plugin{}); err != nil {
			t.Fatal(err)
		}
		enqueue := func(key, value string) int64 {
			t.Helper()
			m := outbox.NewMessage(topic, []byte(key), []byte(value))
			if err := outbox.Enqueue(db.WithContext(ctx), m); err != nil {
				t.Fatal(err)
			}
			return m.ID
		}
		count := func(where string, id int64) bool {
			var n int64
			if err := db.Table(outbox.DefaultMessagesTable).Where("id = ? AND "+where, id).Count(&n).Error; err != nil {
				t.Fatal(err)
			}
			return n == 1
		}
		present := func(id int64) bool { return count("1 = 1", id) }
		parked := func(id int64) bool { return count("parked_at_ms IS NOT NULL", id) }
		waitFor := func(what string, within time.Duration, cond func() bool) {
			t.Helper()
			for end := time.Now().Add(within); !cond(); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("no %s within %v", what, within)
				}
			}
		}

		c := enqueue("K", "C")
		badHeaders := outbox.EncodeHeaders(outbox.Headers{{Key: "k", Value: []byte("v")}})
		badHeaders[0] = 9 // a codec version the store does not know
		if err := db.Table(outbox.DefaultMessagesTable).Where("id = ?", c).Update("headers", badHeaders).Error; err != nil {
			t.Fatal(err)
		}
		head := enqueue("K", "K0:"+strings.Repeat("x", 2<<20)) // beyond BatchBytes (1 MiB): unpublishable
		behind := enqueue("K", "K1")
		rs := &chaos.Relays{Bin: bin, LogDir: t.TempDir(), Base: chaos.RelayConfig{
			Dialect: dialect, DSN: d.RelayDSN, Brokers: brokers,
			LeaseDuration: pauseLease, RenewInterval: time.Second, PollInterval: 200 * time.Millisecond, BatchSize: 100,
		}}
		t.Cleanup(func() { rs.StopAll(10 * time.Second) })
		if _, err := rs.Start("relay-a"); err != nil {
			t.Fatal(err)
		}
		waitFor("C and K's head parked", time.Minute, func() bool { return parked(c) && parked(head) })

		// The repair, then the requeue of C alone, by the CLI.
		if err := db.Table(outbox.DefaultMessagesTable).Where("id = ?", c).Update("headers", nil).Error; err != nil {
			t.Fatal(err)
		}
		out, err := exec.CommandContext(ctx, cli, "requeue", "-id", fmt.Sprint(c), "-db-driver", dialect, "-db-dsn", d.DSN).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "requeued 1 row") {
			t.Fatalf("outbox-relay requeue -id %d: %v\n%s", c, err, out)
		}
		later := enqueue("K", "K2")
		waitFor("the repaired C published", 30*time.Second, func() bool { return !present(c) })
		time.Sleep(3 * time.Second) // several more sweeps of K's bucket
		for _, id := range []int64{behind, later} {
			if !present(id) {
				t.Errorf("K's row %d behind the parked head %d was published (deleted from the table) after the requeue of C", id, head)
			}
		}
	})
}
