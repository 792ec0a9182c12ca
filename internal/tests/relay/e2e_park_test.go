package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// TestOversizedRowParksItsKeyWhileTheBucketFlows is the containment scenario
// an operator meets, on every database with the in-process broker and, on
// PostgreSQL, the real one: keys A and B share a bucket; A's first row is
// larger than the topic's max.message.bytes. After ParkAfter attempts A's
// row is parked with the broker's reason and A's later rows (already there,
// and committed after the parking) are held behind it, while B's rows are
// published; the relay stays healthy. A relay started afterwards (restart,
// takeover) holds A's next row too. Once the operator shrinks the row and
// requeues key A, a deduplicating consumer reads A's rows in commit order
// and the table is empty.
func TestOversizedRowParksItsKeyWhileTheBucketFlows(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, dbo testenv.Opener, b testenv.Broker) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const limit = 4096
		topic := testenv.Unique("park-")
		b.CreateTopic(t, topic, 1, map[string]string{"max.message.bytes": fmt.Sprint(limit)})

		db := dbo.Open(t, nil)
		n := relay.NewNotifier()
		store := e2eStore(t, db, n)
		keyA, keyB := sameBucketKeys(4)

		logs := &testenv.Logs{}
		reader := metrictest.NewReader()
		pub, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		r, err := relay.New(store, pub, relay.Options{
			Notifier: n, PollInterval: 50 * time.Millisecond, ErrorBackoff: 50 * time.Millisecond,
			Logger: logs.Logger(), MeterProvider: reader.MeterProvider(), SingleWriter: db.Dialector.Name() == "sqlite",
		})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()

		enqueue := func(msgs ...*outbox.Message) time.Time {
			t.Helper()
			if err := outbox.Enqueue(db.WithContext(ctx), msgs...); err != nil {
				t.Fatal(err)
			}
			return time.Now()
		}
		a := func(i int, size int) *outbox.Message {
			return outbox.NewMessage(topic, []byte(keyA), []byte(fmt.Sprintf("A%d:%s", i, strings.Repeat("x", size))))
		}
		bm := func(i int) *outbox.Message {
			return outbox.NewMessage(topic, []byte(keyB), []byte(fmt.Sprintf("B%d", i)))
		}
		enqueue(a(1, 2*limit), a(2, 0))
		committedB := enqueue(bm(1), bm(2), bm(3))

		recs := dedupe(b.ReadAll(t, topic, 3, time.Minute))
		for i, rec := range recs {
			if string(rec.Key) != keyB {
				t.Fatalf("record %d has key %q while A's head row is rejected; want only B's rows", i, rec.Key)
			}
		}
		t.Logf("key B's first row reached the broker %v after its commit, while key A's head row was being rejected", recs[0].Time.Sub(committedB).Round(time.Millisecond))

		parked := waitParked(ctx, t, store, 1)
		if !strings.Contains(strings.ToLower(parked[0].Reason), "too large") || parked[0].Key == nil || string(parked[0].Key) != keyA {
			t.Fatalf("parked head = key %q reason %q; want key A rejected as too large", parked[0].Key, parked[0].Reason)
		}
		// Committed after the parking: A's row is held, B's flows.
		enqueue(a(3, 0), bm(4))
		if got := dedupe(b.ReadAll(t, topic, 4, time.Minute)); len(valuesOf(got, keyB)) != 4 || len(got) != 4 {
			t.Fatalf("records = %d (%d of key B); want B1..B4 and none of key A", len(got), len(valuesOf(got, keyB)))
		}
		parked = waitParked(ctx, t, store, 1)
		if err := r.Health(); err != nil {
			t.Fatalf("Health() = %v while a key is parked; want nil (parking is containment, not an outage)", err)
		}
		if lines := logs.Matching("row parked"); len(lines) != 1 {
			t.Fatalf("%d 'row parked' log lines; want exactly 1:\n%s", len(lines), strings.Join(lines, ""))
		} else {
			t.Logf("operator sees: %s", strings.TrimSpace(lines[0]))
		}
		byReason := reader.SumBy(t, relay.MetricParked, relay.AttrParkReason)
		if byReason[relay.ParkReasonUnpublishable] != 1 || byReason[relay.ParkReasonHeld] != 0 {
			t.Fatalf("%s by reason = %v; want 1 unpublishable (the rows behind it are held by the store's read)", relay.MetricParked, byReason)
		}

		// A new relay (a restart, a takeover) loads the parked key and
		// holds A's next row too, while B's flows.
		stopRelay(t, stop, done)
		store2, err := gormstore.New(db, gormstore.Options{Config: outbox.Config{BucketCount: 4}})
		if err != nil {
			t.Fatal(err)
		}
		r2, err := relay.New(store2, pub, relay.Options{PollInterval: 50 * time.Millisecond, ErrorBackoff: 50 * time.Millisecond, Logger: logs.Logger(), SingleWriter: db.Dialector.Name() == "sqlite"})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop = context.WithCancel(ctx)
		go func() { done <- r2.Run(rctx) }()
		enqueue(a(4, 0), bm(5))
		if got := dedupe(b.ReadAll(t, topic, 5, time.Minute)); len(valuesOf(got, keyB)) != 5 || len(got) != 5 {
			t.Fatalf("records after the restart = %d (%d of key B); want B1..B5 and none of key A", len(got), len(valuesOf(got, keyB)))
		}
		waitParked(ctx, t, store, 1)

		// The operator shrinks the row, then requeues the key.
		if err := db.Table(outbox.DefaultMessagesTable).Where("id = ?", parked[0].ID).Update("record_value", []byte("A1:shrunk")).Error; err != nil {
			t.Fatal(err)
		}
		if n, err := store.RequeueParked(ctx, relay.ParkedSelector{Key: []byte(keyA)}); err != nil || n != 1 {
			t.Fatalf("RequeueParked(key A) = %d, %v; want 1 row", n, err)
		}
		all := b.ReadAll(t, topic, 9, time.Minute)
		if got, want := valuesOf(dedupe(all), keyA), []string{"A1:shrunk", "A2:", "A3:", "A4:"}; strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("key A after requeue = %v; want %v in commit order", got, want)
		}
		waitOutboxEmpty(ctx, t, db)
		if rows, err := store.ListParked(ctx, 0); err != nil || len(rows) != 0 {
			t.Fatalf("ListParked after requeue = %d rows, %v; want none", len(rows), err)
		}
		stopRelay(t, stop, done)
	})
}

// sameBucketKeys returns two keys that the outbox hashes to one bucket of n.
func sameBucketKeys(n int) (string, string) {
	a := "A"
	want := outbox.BucketOf([]byte(a), nil, outbox.UUID{}, n)
	for i := 0; ; i++ {
		b := fmt.Sprintf("B%d", i)
		if outbox.BucketOf([]byte(b), nil, outbox.UUID{}, n) == want {
			return a, b
		}
	}
}

// waitParked waits until store lists n parked rows and returns them.
func waitParked(ctx context.Context, t *testing.T, store *gormstore.Store, n int) []relay.ParkedRow {
	t.Helper()
	for {
		rows, err := store.ListParked(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == n {
			return rows
		}
		if ctx.Err() != nil || len(rows) > n {
			t.Fatalf("%d parked rows; want %d", len(rows), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dedupe keeps the first record of each message id, in order.
func dedupe(recs []kafka.Message) []kafka.Message {
	seen := map[string]bool{}
	var out []kafka.Message
	for _, rec := range recs {
		var id string
		for _, h := range rec.Headers {
			if h.Key == kafkapub.DefaultMessageIDHeader {
				id = string(h.Value)
			}
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, rec)
		}
	}
	return out
}

// valuesOf returns the values of key's records, in order.
func valuesOf(recs []kafka.Message, key string) []string {
	var out []string
	for _, rec := range recs {
		if string(rec.Key) == key {
			out = append(out, string(rec.Value))
		}
	}
	return out
}

// rejecting is a Publisher that rejects the rows whose message id is
// poisoned as unpublishable, publishing the rows before the first of them.
type rejecting struct {
	relay.Publisher
	mu     sync.Mutex
	poison map[outbox.UUID]bool
}

func (p *rejecting) set(id outbox.UUID, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.poison[id] = on
}

func (p *rejecting) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := make([]relay.Result, len(batches))
	for i, batch := range batches {
		results[i] = p.publish(ctx, batch)
	}
	return results
}

func (p *rejecting) publish(ctx context.Context, batch []*outbox.Message) relay.Result {
	p.mu.Lock()
	cut := -1
	for i, m := range batch {
		if p.poison[m.MessageID] {
			cut = i
			break
		}
	}
	p.mu.Unlock()
	if cut < 0 {
		return p.Publisher.Publish(ctx, [][]*outbox.Message{batch})[0]
	}
	res := relay.Result{}
	if cut > 0 {
		if res = p.Publisher.Publish(ctx, [][]*outbox.Message{batch[:cut]})[0]; res.Err != nil {
			return res
		}
	}
	res.Err = fmt.Errorf("test broker rejects %s: %w", batch[cut].MessageID, relay.ErrUnpublishable)
	return res
}

// TestRequeueWhileTheKeyKeepsArrivingKeepsItsOrder races an operator's
// requeue against a relay that is parking and holding new rows of the same
// key, on every database: a writer commits rows of keys A and B one
// transaction at a time while two of A's rows are rejected (parked after
// one attempt); a requeuer lifts each rejection and requeues key A as soon
// as it sees it parked, and also requeues while nothing is parked. A
// deduplicating consumer must read both keys in commit order, and at the
// end nothing is parked and the table is empty.
func TestRequeueWhileTheKeyKeepsArrivingKeepsItsOrder(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		b := testenv.NewFake(t)
		topic := testenv.Unique("requeue-")
		b.CreateTopic(t, topic, 1, nil)
		n := relay.NewNotifier()
		store := e2eStore(t, db, n)
		keyA, keyB := sameBucketKeys(4)

		kp, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kp.Close() })
		pub := &rejecting{Publisher: kp, poison: map[outbox.UUID]bool{}}
		r, err := relay.New(store, pub, relay.Options{Notifier: n, PollInterval: 20 * time.Millisecond, ErrorBackoff: 5 * time.Millisecond, ParkAfter: 1, SingleWriter: db.Dialector.Name() == "sqlite"})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()

		const rows = 200
		var (
			wrote  = make(chan struct{})
			want   = map[string][]string{}
			wantMu sync.Mutex
		)
		go func() {
			defer close(wrote)
			for i := range rows {
				ma := outbox.NewMessage(topic, []byte(keyA), []byte(fmt.Sprint("A", i)))
				mb := outbox.NewMessage(topic, []byte(keyB), []byte(fmt.Sprint("B", i)))
				if i == 20 || i == 120 {
					ma.MessageID = outbox.NewUUID()
					pub.set(ma.MessageID, true)
				}
				if err := outbox.Enqueue(db.WithContext(ctx), ma, mb); err != nil {
					t.Error(err)
					return
				}
				wantMu.Lock()
				want[keyA] = append(want[keyA], string(ma.Value))
				want[keyB] = append(want[keyB], string(mb.Value))
				wantMu.Unlock()
				time.Sleep(time.Millisecond)
			}
		}()

		// fix lifts the rejection of every parked head: the operator fixed
		// the cause.
		fix := func() {
			parked, err := store.ListParked(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range parked {
				if !strings.HasPrefix(p.Reason, relay.HeldReasonPrefix) {
					id, err := outbox.ParseUUID(p.MessageID)
					if err != nil {
						t.Fatal(err)
					}
					pub.set(id, false)
				}
			}
		}
		requeued, idle := 0, 0
		for finished := false; !finished; {
			select {
			case <-wrote:
				finished = true
			case <-time.After(3 * time.Millisecond):
			}
			fix()
			if n, err := store.RequeueParked(ctx, relay.ParkedSelector{Key: []byte(keyA)}); err != nil {
				t.Fatal(err)
			} else if n > 0 {
				requeued++
			} else {
				idle++
			}
			if finished {
				// Requeue until the relay has nothing left to park.
				for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					var left int64
					if err := db.Table(outbox.DefaultMessagesTable).Count(&left).Error; err != nil {
						t.Fatal(err)
					}
					if left == 0 {
						break
					}
					fix()
					if _, err := store.RequeueParked(ctx, relay.ParkedSelector{All: true}); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if requeued < 2 {
			t.Fatalf("requeued parked rows %d times; want at least 2 (two rejected rows)", requeued)
		}
		recs := dedupe(b.ReadAll(t, topic, 2*rows, time.Minute))
		for _, k := range []string{keyA, keyB} {
			if got := valuesOf(recs, k); strings.Join(got, ",") != strings.Join(want[k], ",") {
				t.Fatalf("key %s: consumed %d records %v\nwant %d in commit order %v", k, len(got), got, len(want[k]), want[k])
			}
		}
		waitOutboxEmpty(ctx, t, db)
		t.Logf("requeues that moved rows: %d, requeues that found nothing parked: %d", requeued, idle)
		stopRelay(t, cancel, done)
	})
}
