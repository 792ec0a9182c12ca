package chaos_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// Timing of the rebalance measurement's relays (the chaos harness's).
const (
	rebalanceLease   = 3 * time.Second
	rebalanceRenew   = time.Second
	rebalanceOutage  = 5 * time.Second // longer than the lease
	rebalanceRelays  = 3
	rebalanceBuckets = outbox.DefaultBucketCount
)

// ownership is one sample of the leases table: live leases per owner.
type ownership struct {
	at    time.Time
	owned map[string]int
}

// fair reports whether every one of n relays owns its fair share (the
// counts relay.Shares gives: 3, 3, 2 of 8 buckets among 3 relays).
func (o ownership) fair(n int) bool {
	if len(o.owned) != n {
		return false
	}
	held := map[string]int{}
	total := 0
	for id, c := range o.owned {
		held[id] = c
		total += c
	}
	if total != rebalanceBuckets {
		return false
	}
	want := relay.Shares(rebalanceBuckets, held)
	for id, c := range o.owned {
		if c != want[id] {
			return false
		}
	}
	return true
}

// most is the largest number of buckets one relay owns.
func (o ownership) most() int {
	m := 0
	for _, c := range o.owned {
		m = max(m, c)
	}
	return m
}

func (o ownership) String() string {
	ids := make([]string, 0, len(o.owned))
	for id := range o.owned {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%s=%d", id, o.owned[id])
	}
	return strings.Join(parts, " ")
}

// sampleOwnership reads the live leases (unexpired by this machine's
// clock, which the relays share) per owner.
func sampleOwnership(db *gorm.DB) (ownership, error) {
	o := ownership{at: time.Now(), owned: map[string]int{}}
	var rows []struct {
		Owner string
		N     int
	}
	err := db.Raw("SELECT owner, COUNT(*) AS n FROM outbox_leases WHERE owner IS NOT NULL AND expires_at_ms > ? GROUP BY owner", o.at.UnixMilli()).Scan(&rows).Error
	for _, r := range rows {
		o.owned[r.Owner] = r.N
	}
	return o, err
}

// TestRelayRecoversFairSharesAfterDatabaseOutage measures how the bucket
// ownership of 3 relays comes back after a database outage longer than the
// lease: a private PostgreSQL server is stopped (immediate shutdown) for 5
// s while the relays (lease 3 s, renewal every 1 s) run, then restarted.
// Every relay's leases and heartbeat expire during the outage; the first
// relay whose acquisition round succeeds sees no other live relay and
// claims every bucket, and gives back its excess only at its next round,
// one LeaseRenewInterval later, when the others' heartbeats are back. The
// test samples the leases table every 50 ms from the restart and reports how
// long until some relay owned buckets, until every relay owned at least
// one, how long one relay owned more than its fair share, and how long
// until every relay owned exactly its share
// (relay.Shares); it asserts only a generous bound (10 renewal intervals)
// and that nothing was lost or reordered.
func TestRelayRecoversFairSharesAfterDatabaseOutage(t *testing.T) {
	if v := os.Getenv(EnvChaos); v == "" || v == "0" {
		t.Skipf("set %s=1 to run the reliability harness", EnvChaos)
	}
	pg := startPrivatePostgres(t)
	hdb, err := chaos.Open(chaos.Postgres, pg.dsn, "rebalance-harness", 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(hdb, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(8))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	r := &outageRig{db: hdb, fake: fake, topic: "rebalance", logs: &syncBuffer{}, perKey: map[string][]string{}}
	if err := hdb.Use(outbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := chaos.CreateTopic(ctx, fake.ListenAddrs(), r.topic, 8); err != nil {
		t.Fatal(err)
	}
	r.consumer = chaos.StartConsumer(ctx, fake.ListenAddrs(), r.topic, 8)
	done := make(chan error, rebalanceRelays)
	var pubs []*kafkapub.Publisher
	for i := 1; i <= rebalanceRelays; i++ {
		db, err := chaos.Open(chaos.Postgres, pg.dsn, fmt.Sprintf("rebalance-relay-%d", i), 4)
		if err != nil {
			t.Fatal(err)
		}
		store, err := gormstore.New(db, gormstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kafkapub.New(kafkapub.Config{Brokers: fake.ListenAddrs(), Configure: func(w *kafka.Writer) {
			w.MaxAttempts, w.WriteTimeout, w.ReadTimeout = 3, 3*time.Second, 3*time.Second
		}})
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, pub)
		rl, err := relay.New(store, pub, relay.Options{
			RelayID:       fmt.Sprintf("relay-%d", i),
			LeaseDuration: rebalanceLease, LeaseRenewInterval: rebalanceRenew, PollInterval: 200 * time.Millisecond,
			ErrorBackoff: 250 * time.Millisecond, BatchSize: 100,
			Logger: slog.New(slog.NewTextHandler(r.logs, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() { done <- rl.Run(ctx) }()
	}
	r.stop = func() {
		cancel()
		for range rebalanceRelays {
			if err := <-done; err != nil {
				t.Errorf("Run = %v; want nil after a stop", err)
			}
		}
		for _, p := range pubs {
			p.Close()
		}
		r.consumer.Wait()
	}

	// Steady state first: every relay owns its share.
	waitFair := func(within time.Duration) (ownership, bool) {
		var o ownership
		for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if o, err = sampleOwnership(hdb); err == nil && o.fair(rebalanceRelays) {
				return o, true
			}
		}
		return o, false
	}
	if o, ok := waitFair(30 * time.Second); !ok {
		t.Fatalf("the relays never owned their fair shares before the outage: %v", o)
	}
	r.enqueue(t, 2000)
	r.waitRecords(t, 200)

	pg.ctl(t, "stop", "-m", "immediate")
	time.Sleep(rebalanceOutage)
	pg.ctl(t, "start", "-w")
	restarted := time.Now()

	// Sample until ownership has been fair for 3 renewal intervals, or 10
	// intervals have passed.
	var (
		first, overFrom, overTo, fairAt time.Time
		allOwnAt, fairSince             time.Time
		peak                            ownership
	)
	bound := 10 * rebalanceRenew
	for time.Since(restarted) < bound+3*rebalanceRenew {
		o, err := sampleOwnership(hdb)
		if err != nil || len(o.owned) == 0 {
			fairSince = time.Time{}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if first.IsZero() {
			first = o.at
		}
		if allOwnAt.IsZero() && len(o.owned) == rebalanceRelays {
			allOwnAt = o.at
		}
		if o.most() > peak.most() {
			peak = o
		}
		// more than the largest fair share: ceil(8/3) = 3
		if o.most() > (rebalanceBuckets+rebalanceRelays-1)/rebalanceRelays {
			if overFrom.IsZero() {
				overFrom = o.at
			}
			overTo = o.at
		}
		if o.fair(rebalanceRelays) {
			if fairSince.IsZero() {
				fairSince = o.at
			}
			if o.at.Sub(fairSince) >= 3*rebalanceRenew {
				fairAt = fairSince
				break
			}
		} else {
			fairSince = time.Time{}
		}
		time.Sleep(50 * time.Millisecond)
	}
	since := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return at.Sub(restarted).Round(10 * time.Millisecond).String()
	}
	over := time.Duration(0)
	if !overFrom.IsZero() {
		over = overTo.Sub(overFrom) + 50*time.Millisecond // to the next sample
	}
	t.Logf("rebalance after a %v database outage (lease %v, renew %v, %d relays, %d buckets): first lease after %s, every relay owning a bucket after %s, peak %v, over-share from %s for %v, fair shares after %s",
		rebalanceOutage, rebalanceLease, rebalanceRenew, rebalanceRelays, rebalanceBuckets, since(first), since(allOwnAt), peak, since(overFrom), over.Round(10*time.Millisecond), since(fairAt))
	if fairAt.IsZero() {
		t.Errorf("the relays did not own their fair shares within %v of the restart (%d renewal intervals); want them to", bound, bound/rebalanceRenew)
	}
	r.enqueue(t, 500)
	r.finish(t, storeBackoffLogs...)
}
