package consumertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// RunEffects is the effects audit, end to end: writers commit business rows
// with outbox messages (every seventh transaction rolled back), relays
// publish them (in the default mode through a publisher that loses every
// third acknowledgement; in fenced mode in Kafka transactions), and
// consumers of c apply one effect per message (a per-key counter and log
// row), while a relay stops and a consumer leaves the group. Every
// committed row must have exactly one effect, no rolled-back row one, each
// key's effects in commit order and counter right. It is the in-process
// variant of cmd/internal/chaos's effects run (CHAOS.md), on every database
// and broker.
func RunEffects(t *testing.T, c Client) {
	ForEachPairing(t, true, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		for _, fenced := range []bool{false, true} {
			name := "default_mode"
			if fenced {
				name = "fenced_mode"
			}
			t.Run(name, func(t *testing.T) { effectsRun(t, c, o, b, fenced) })
		}
	})
}

// order is the writers' business row.
type order struct {
	ID  uint   `gorm:"primaryKey"`
	Key string `gorm:"size:64"`
	Seq int
}

func (order) TableName() string { return "consumertest_orders" }

// effectLog is one applied effect, in the consumer's database.
type effectLog struct {
	ID        uint   `gorm:"primaryKey"`
	Key       string `gorm:"size:64"`
	Seq       int
	MessageID string `gorm:"size:64"`
}

func (effectLog) TableName() string { return "consumertest_effect_log" }

// effectCounter counts a key's applied effects.
type effectCounter struct {
	Key string `gorm:"primaryKey;size:64"`
	N   int
}

func (effectCounter) TableName() string { return "consumertest_effect_counters" }

// lossyPublisher loses every third acknowledgement of a publish that
// landed: the relay publishes those rows again.
type lossyPublisher struct {
	relay.Publisher
	calls atomic.Int64
	lost  *atomic.Int64 // shared by the relays
}

func (p *lossyPublisher) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := p.Publisher.Publish(ctx, batches)
	for i, res := range results {
		if p.calls.Add(1)%3 == 0 && res.Acknowledged > 0 {
			p.lost.Add(int64(res.Acknowledged))
			results[i] = relay.Result{Err: errors.New("acknowledgement lost (injected)")}
		}
	}
	return results
}

func effectsRun(t *testing.T, c Client, o testenv.Opener, b testenv.Broker, fenced bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const partitions, keys, perKey = 4, 8, 30
	topic, group := newTopic(t, b, "inbox-effects-", partitions), testenv.Unique("g-")
	quiet := slog.New(slog.DiscardHandler)

	// The producing service's database.
	odb := o.Open(t, nil)
	cfg := outbox.Config{BucketCount: 8}
	must(t, odb.Use(outbox.Plugin{Config: cfg}))
	must(t, outbox.AutoMigrate(odb, cfg))
	must(t, odb.AutoMigrate(&order{}))
	var lost atomic.Int64 // acknowledgements lost, in the default mode
	startRelay := func(id string) (stop func()) {
		store, err := gormstore.New(odb, gormstore.Options{Config: cfg})
		must(t, err)
		kc := kafkapub.Config{Brokers: b.Addrs, PublishTimeout: 5 * time.Second}
		if fenced {
			kc.Transactions = &kafkapub.Transactions{Outbox: topic}
		}
		kp, err := kafkapub.New(kc)
		must(t, err)
		t.Cleanup(func() { _ = kp.Close() })
		var pub relay.Publisher = kp
		if !fenced {
			pub = &lossyPublisher{Publisher: kp, lost: &lost}
		}
		rl, err := relay.New(store, pub, relay.Options{
			RelayID: id, BucketCount: cfg.BucketCount, LeaseDuration: 2 * time.Second,
			LeaseRenewInterval: 500 * time.Millisecond, PollInterval: 50 * time.Millisecond,
			ErrorBackoff: 20 * time.Millisecond, Logger: quiet, SingleWriter: odb.Dialector.Name() == "sqlite",
		})
		must(t, err)
		return Start(t, ctx, id, rl.Run)
	}

	// The consuming service's database.
	cdb := o.Open(t, nil)
	must(t, cdb.AutoMigrate(&effectLog{}, &effectCounter{}))
	for k := range keys {
		must(t, cdb.Create(&effectCounter{Key: fmt.Sprintf("key-%d", k)}).Error)
	}
	ib, metrics := setup(t, cdb, inbox.Options{Logger: quiet})
	apply := func(tx *gorm.DB, r Record) error {
		id, _ := header(r.Headers, kafkapub.DefaultMessageIDHeader)
		key, s, _ := strings.Cut(string(r.Value), ":")
		seq, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("value %q: %w", r.Value, err)
		}
		if err := tx.Create(&effectLog{Key: key, Seq: seq, MessageID: id}).Error; err != nil {
			return err
		}
		return tx.Model(&effectCounter{Key: key}).Update("n", gorm.Expr("n + 1")).Error // by primary key
	}
	opts := inbox.ConsumerOptions{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond}
	startConsumer := func() (stop func()) {
		cons := c.New(t, b, ib, group, topic, "effects", apply, opts)
		stopRun := runConsumer(t, cons)
		return func() {
			stopRun()
			cons.Close()
		}
	}

	stopRelay1 := startRelay("relay-1")
	startRelay("relay-2")
	stopConsumer1 := startConsumer()
	startConsumer()

	// Writers: one per key, each transaction a business row and its
	// message; a key's commit order is its sequence numbers' order.
	var (
		mu                    sync.Mutex
		committed             = map[string][]int{}
		committedIDs, rolledB = map[string]bool{}, map[string]bool{}
		written               atomic.Int64
		wg                    sync.WaitGroup
	)
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("key-%d", k)
			for seq := 1; seq <= perKey; seq++ {
				m := outbox.NewStringMessage(topic, key, fmt.Sprintf("%s:%d", key, seq))
				fail := (k+seq)%7 == 0
				err := odb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&order{Key: key, Seq: seq}).Error; err != nil {
						return err
					}
					if err := outbox.Enqueue(tx, m); err != nil || !fail {
						return err
					}
					return errors.New("rolled back on purpose")
				})
				if (err != nil) != fail {
					t.Errorf("writer %s seq %d: %v", key, seq, err)
					return
				}
				mu.Lock()
				if fail {
					rolledB[m.MessageID.String()] = true
				} else {
					committed[key] = append(committed[key], seq)
					committedIDs[m.MessageID.String()] = true
				}
				mu.Unlock()
				written.Add(1)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	total := int64(keys * perKey)
	waitWritten := func(n int64) {
		for written.Load() < n && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitWritten(total / 3)
	stopRelay1() // its buckets go to relay-2 and relay-3
	startRelay("relay-3")
	waitWritten(2 * total / 3)
	stopConsumer1() // a rebalance: its partitions go to the others
	startConsumer()
	wg.Wait()
	if t.Failed() {
		return
	}

	// Every committed row applied: wait for as many effects.
	want := int64(len(committedIDs))
	for {
		var n int64
		must(t, cdb.Model(&effectLog{}).Count(&n).Error)
		if n >= want {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d effects; want %d", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // room for a late duplicate effect to show

	var logs []effectLog
	must(t, cdb.Order("id").Find(&logs).Error)
	perID := map[string]int{}
	applied := map[string][]int{}
	var dup, ghost, inversions int
	for _, l := range logs {
		perID[l.MessageID]++
		switch {
		case perID[l.MessageID] > 1:
			dup++
		case !committedIDs[l.MessageID]: // rolled back, or never written
			ghost++
		}
		if s := applied[l.Key]; len(s) > 0 && s[len(s)-1] >= l.Seq {
			inversions++
		}
		applied[l.Key] = append(applied[l.Key], l.Seq)
	}
	lostEffects := 0
	for id := range committedIDs {
		if perID[id] == 0 {
			lostEffects++
		}
	}
	var counters []effectCounter
	must(t, cdb.Find(&counters).Error)
	badCounters := 0
	for _, ct := range counters {
		if ct.N != len(committed[ct.Key]) {
			badCounters++
		}
	}
	r := Collect(t, metrics)
	t.Logf("%s: %d committed rows, %d rolled back, %d acknowledgements lost; %d processed, %d duplicates skipped; audit: %d lost effects, %d duplicate effects, %d effects of rolled-back rows, %d per-key order violations, %d wrong counters",
		c.Name, len(committedIDs), len(rolledB), lost.Load(), r[inbox.MetricProcessed], r[inbox.MetricDuplicates], lostEffects, dup, ghost, inversions, badCounters)
	if lostEffects+dup+ghost+inversions+badCounters > 0 {
		t.Fatalf("the effects audit failed (see above); effects per key: %v; committed: %v", applied, committed)
	}
	if !fenced && lost.Load() == 0 {
		t.Errorf("no acknowledgement was lost: the default mode published nothing twice")
	}
}
