package kafkapub_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/rawproduce"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// recordingPublisher passes calls to a Publisher (ownership included)
// and counts the publishes that failed with ErrFenced.
type recordingPublisher struct {
	*kafkapub.Publisher
	fenced atomic.Int64
}

func (p *recordingPublisher) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := p.Publisher.Publish(ctx, batches)
	for _, res := range results {
		if errors.Is(res.Err, relay.ErrFenced) {
			p.fenced.Add(1)
		}
	}
	return results
}

// TestZombieRelayIsFenced: relay A stalls in the middle of a transaction
// (its records appended, not committed) and its database calls hang, past
// its lease; relay B takes its buckets over, which initialises their
// transactional ids and fences A, and publishes the same rows and newer
// ones; then A resumes. A's commit is refused, it deletes nothing and drops
// the buckets, and rejoins. A read_committed consumer sees every committed
// row exactly once and each key's rows in commit order, with no
// deduplication; a read_uncommitted consumer shows what the zombie wrote:
// its aborted copies, ahead of the new owner's (duplicates, and inversions
// where its batch held a key twice).
func TestZombieRelayIsFenced(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		for _, step := range []string{"produced", "added"} {
			t.Run("stalled_after_"+step, func(t *testing.T) { runZombie(t, o, b, step) })
		}
	})
}

func runZombie(t *testing.T, o testenv.Opener, b testenv.Broker, step string) {
	db := o.Open(t, nil)
	cfg := outbox.Config{BucketCount: 4}
	if err := db.Use(outbox.Plugin{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatal(err)
	}
	newStore := func() *gormstore.Store {
		s, err := gormstore.New(db, gormstore.Options{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	topic := fmt.Sprintf("zombie-%s-%s-%d", o.Name, step, time.Now().UnixNano())
	b.CreateTopic(t, topic, 3, nil)
	outboxName := topic // unique transactional ids per run

	newPub := func(transport kafka.RoundTripper) *recordingPublisher {
		p, err := kafkapub.New(kafkapub.Config{
			Brokers:        b.Addrs,
			Transport:      transport,
			PublishTimeout: 5 * time.Second,
			Transactions:   &kafkapub.Transactions{Outbox: outboxName},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return &recordingPublisher{Publisher: p}
	}
	opts := func(id string) relay.Options {
		return relay.Options{
			RelayID:            id,
			BucketCount:        cfg.BucketCount,
			LeaseDuration:      2 * time.Second,
			LeaseRenewInterval: 500 * time.Millisecond,
			PollInterval:       50 * time.Millisecond,
			ErrorBackoff:       100 * time.Millisecond,
			Logger:             slog.New(slog.DiscardHandler),
			SingleWriter:       db.Dialector.Name() == "sqlite",
		}
	}

	// A's transactions stall at step once armed, until released: its
	// transport holds the request that follows the step (the first
	// produce after the partitions were added, or the commit after every
	// record was appended) from the Publish goroutine.
	var armed atomic.Bool
	stalled := make(chan struct{})
	release := make(chan struct{})
	var stallOnce sync.Once
	tr := &kafka.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	pubA := newPub(stallingTransport{RoundTripper: tr, step: step, stall: func() {
		if !armed.Load() {
			return
		}
		stallOnce.Do(func() { close(stalled) })
		<-release
	}})
	storeA := &relaytest.Pausable{Store: newStore()}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runA, err := relay.New(storeA, pubA, opts("relay-a"))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { errs <- runA.Run(ctx) }()

	// The writer: one row per transaction, keys k0..k11, value = commit
	// sequence number, so a key's commit order is its values' order.
	var seq int
	var committed []*outbox.Message
	write := func(n int) {
		t.Helper()
		for range n {
			m := outbox.NewStringMessage(topic, fmt.Sprintf("k%d", seq%12), strconv.Itoa(seq))
			if err := db.Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, m) }); err != nil {
				t.Fatal(err)
			}
			committed = append(committed, m)
			seq++
		}
	}
	waitEmpty := func(what string) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		defer wcancel()
		for {
			var n int64
			if err := db.Model(&outbox.Message{}).Count(&n).Error; err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
			if wctx.Err() != nil {
				t.Fatalf("%s: %d rows still pending after 60s", what, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	write(40)
	waitEmpty("A alone")

	// A stalls in a transaction, then its database calls hang too: it
	// stops renewing and its leases expire.
	armed.Store(true)
	write(40)
	select {
	case <-stalled:
	case <-time.After(30 * time.Second):
		t.Fatal("relay A never stalled")
	}
	storeA.Pause()

	pubB := newPub(nil)
	runB, err := relay.New(newStore(), pubB, opts("relay-b"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { errs <- runB.Run(ctx) }()
	waitEmpty("B takes over")
	write(40) // newer rows, for the keys the zombie holds
	waitEmpty("B publishes newer rows")

	// A resumes: its transaction is fenced, it deletes nothing, drops its
	// buckets and rejoins with a share of them.
	close(release)
	storeA.Resume()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	for pubA.fenced.Load() == 0 && wctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	wcancel()
	if pubA.fenced.Load() == 0 {
		t.Fatal("relay A's publish was never fenced")
	}
	armed.Store(false)
	time.Sleep(3 * time.Second) // a few acquisition rounds: A takes its share back
	write(40)
	waitEmpty("both relays")
	cancel()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("Run = %v; want nil", err)
		}
	}

	// read_committed: each row once, every key in commit order.
	wantByKey := map[string][]int{}
	ids := map[string]bool{}
	for _, m := range committed {
		v, _ := strconv.Atoi(string(m.Value))
		wantByKey[string(m.Key)] = append(wantByKey[string(m.Key)], v)
		ids[m.MessageID.String()] = true
	}
	rc := readLevel(t, b, topic, kgo.ReadCommitted(), len(committed))
	gotByKey, dups, unknown := byKey(rc, ids)
	if len(rc) != len(committed) || dups != 0 || unknown != 0 {
		t.Fatalf("read_committed: %d records (%d duplicates, %d unknown); want %d, each once", len(rc), dups, unknown, len(committed))
	}
	for k, want := range wantByKey {
		if got := gotByKey[k]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("read_committed key %s = %v; want %v (commit order)", k, got, want)
		}
	}

	// read_uncommitted: the zombie's aborted records are in the log.
	ru := readLevel(t, b, topic, kgo.ReadUncommitted(), len(committed))
	_, dupsRU, _ := byKey(ru, ids)
	inversions := 0
	for _, vs := range byKeyAll(ru) {
		for i := 1; i < len(vs); i++ {
			if vs[i] < vs[i-1] {
				inversions++
			}
		}
	}
	t.Logf("%d rows; relay A fenced %d times; read_committed %d records, 0 duplicates, order kept; read_uncommitted %d records, %d duplicates, %d per-key inversions",
		len(committed), pubA.fenced.Load(), len(rc), len(ru), dupsRU, inversions)
	if step == "produced" && dupsRU == 0 {
		t.Fatalf("read_uncommitted: no duplicate; want the zombie's aborted copies (its batch was appended)")
	}
}

// stallingTransport passes requests on, calling stall first for the
// request that follows a transaction's step: "added" (partitions added,
// nothing produced): a transactional produce; "produced" (every record
// appended, not committed): an EndTxn that commits.
type stallingTransport struct {
	kafka.RoundTripper
	step  string
	stall func()
}

func (s stallingTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	switch r := req.(type) {
	case *rawproduce.Request:
		if s.step == "added" && r.TransactionalID != "" {
			s.stall()
		}
	case *endtxn.Request:
		if s.step == "produced" && r.Committed {
			s.stall()
		}
	}
	return s.RoundTripper.RoundTrip(ctx, addr, req)
}

// readLevel reads topic at level until it has at least want records
// and a second passed without a new one.
func readLevel(t *testing.T, b testenv.Broker, topic string, level kgo.IsolationLevel, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(level), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	deadline := time.Now().Add(30 * time.Second)
	last := time.Now()
	for len(out) < want || time.Since(last) < time.Second {
		if time.Now().After(deadline) {
			t.Fatalf("read %d records in 30s; want at least %d", len(out), want)
		}
		pctx, pcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		n := len(out)
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
		pcancel()
		if len(out) > n {
			last = time.Now()
		}
	}
	return out
}

// byKey groups recs' values by key, in partition order, skipping repeated
// message ids (counted in dups) and counting ids not in ids.
func byKey(recs []*kgo.Record, ids map[string]bool) (vals map[string][]int, dups, unknown int) {
	vals = map[string][]int{}
	seen := map[string]bool{}
	sortByPartitionOffset(recs)
	for _, r := range recs {
		id := ""
		for _, h := range r.Headers {
			if h.Key == kafkapub.DefaultMessageIDHeader {
				id = string(h.Value)
			}
		}
		if !ids[id] {
			unknown++
			continue
		}
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		v, _ := strconv.Atoi(string(r.Value))
		vals[string(r.Key)] = append(vals[string(r.Key)], v)
	}
	return vals, dups, unknown
}

// byKeyAll groups every record's value by key, in partition order,
// duplicates included.
func byKeyAll(recs []*kgo.Record) map[string][]int {
	sortByPartitionOffset(recs)
	out := map[string][]int{}
	for _, r := range recs {
		v, _ := strconv.Atoi(string(r.Value))
		out[string(r.Key)] = append(out[string(r.Key)], v)
	}
	return out
}

func sortByPartitionOffset(recs []*kgo.Record) {
	sort.SliceStable(recs, func(i, j int) bool {
		if recs[i].Partition != recs[j].Partition {
			return recs[i].Partition < recs[j].Partition
		}
		return recs[i].Offset < recs[j].Offset
	})
}
