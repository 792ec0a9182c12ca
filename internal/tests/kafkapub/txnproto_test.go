package kafkapub_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/rawproduce"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// Protocol edge cases of the transactional mode: errors the coordinator
// answers, answers that never come, a coordinator that moves, a
// transaction that times out, a broker that restarts.

// faultyTransport passes requests to a kafka.Transport; lose, when it
// returns true for a request, makes the request's answer get lost: the
// request is sent (and applied by the broker), then the call waits for its
// context to end and fails with its error, like a broker whose answer
// never arrives.
type faultyTransport struct {
	inner    *kafka.Transport
	lose     func(req kafka.Request) bool
	cut      bool         // a lost answer fails at once (a cut connection), not when the context ends
	produces atomic.Int64 // produce requests passed on
}

func newFaultyTransport(t testing.TB, lose func(kafka.Request) bool) *faultyTransport {
	ft := &faultyTransport{inner: &kafka.Transport{}, lose: lose}
	t.Cleanup(ft.inner.CloseIdleConnections)
	return ft
}

func (f *faultyTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if _, ok := req.(*rawproduce.Request); ok {
		f.produces.Add(1)
	}
	res, err := f.inner.RoundTrip(ctx, addr, req)
	if err == nil && f.lose != nil && f.lose(req) {
		if f.cut {
			return nil, errors.New("connection reset after the request was sent")
		}
		<-ctx.Done()
		return nil, fmt.Errorf("answer lost: %w", ctx.Err())
	}
	return res, err
}

// once returns a predicate true for the first request that match accepts.
func once(match func(kafka.Request) bool) func(kafka.Request) bool {
	var done atomic.Bool
	return func(req kafka.Request) bool {
		return match(req) && done.CompareAndSwap(false, true)
	}
}

func values(recs []*kgo.Record) string {
	var vs []string
	for _, r := range recs {
		vs = append(vs, string(r.Value))
	}
	return strings.Join(vs, ",")
}

// CONCURRENT_TRANSACTIONS (the previous transaction still completing) and
// a coordinator that moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
// COORDINATOR_LOAD_IN_PROGRESS) are retried inside the call, on every
// coordinator request: the publish succeeds once the coordinator answers.
func TestTxnPublisher_retries_coordinator_errors(t *testing.T) {
	for _, tc := range []struct {
		key kmsg.Key
		err *kerr.Error
	}{
		{kmsg.AddPartitionsToTxn, kerr.ConcurrentTransactions},
		{kmsg.EndTxn, kerr.ConcurrentTransactions},
		{kmsg.AddPartitionsToTxn, kerr.NotCoordinator},
		{kmsg.EndTxn, kerr.NotCoordinator},
		{kmsg.EndTxn, kerr.CoordinatorNotAvailable},
		{kmsg.InitProducerID, kerr.CoordinatorLoadInProgress},
		{kmsg.InitProducerID, kerr.ConcurrentTransactions},
	} {
		t.Run(fmt.Sprintf("%s_%s", tc.key.Name(), tc.err.Message), func(t *testing.T) {
			b := testenv.NewFake(t)
			topic := newTopic(t, b, 2, nil)
			p := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
			// AddPartitionsToTxn answers per partition (before v4).
			top := tc.key != kmsg.AddPartitionsToTxn
			h := b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{tc.key}, TopLevel: top, Err: tc.err, Count: 3})
			own(t, p, 0)
			res := p.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "a", "1"), bucketMsg(0, topic, "b", "2")}})[0]
			if res.Acknowledged != 2 || res.Err != nil {
				t.Fatalf("Publish = %d, %v; want 2, nil", res.Acknowledged, res.Err)
			}
			if n := h.Hits(); n != 3 {
				t.Fatalf("%s answered %s %d times; want 3", tc.key.Name(), tc.err.Message, n)
			}
			if got := values(readIsolated(t, b, topic, kgo.ReadCommitted(), 2, 200*time.Millisecond)); len(got) != 3 {
				t.Fatalf("read_committed = %s; want the 2 rows once", got)
			}
		})
	}
}

// The transaction coordinator moves to another broker between publishes
// (kfake rehashes its coordinators): kafka-go's transport looks it up
// before each request, a request that reached the old one is answered
// NOT_COORDINATOR and sent again, and the publisher carries on with the
// same producer.
func TestTxnPublisher_follows_a_coordinator_that_moved(t *testing.T) {
	b := testenv.NewFake(t, kfake.NumBrokers(3))
	topic := newTopic(t, b, 3, nil)
	p := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
	own(t, p, 0)
	txid := kafkapub.Transactions{Outbox: topic}.TransactionalID(0)
	var want []string
	moved := 0
	for i := range 6 {
		before := b.Fake.CoordinatorFor(txid)
		for range 20 {
			b.Fake.RehashCoordinators()
			if b.Fake.CoordinatorFor(txid) != before {
				moved++
				break
			}
		}
		v := fmt.Sprint(i)
		want = append(want, v)
		if res := p.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", v)}})[0]; res.Err != nil {
			t.Fatalf("Publish %d after the coordinator moved from node %d to %d: %v", i, before, b.Fake.CoordinatorFor(txid), res.Err)
		}
	}
	if moved == 0 {
		t.Fatal("the coordinator never moved")
	}
	if got := values(readIsolated(t, b, topic, kgo.ReadCommitted(), len(want), 200*time.Millisecond)); got != strings.Join(want, ",") {
		t.Fatalf("read_committed = %s; want %s", got, strings.Join(want, ","))
	}
}

// A commit whose answer is lost leaves the rows in doubt; the next publish
// of the bucket sends the commit again, finds it applied, and acknowledges
// those rows without sending them again: read_committed consumers see each
// row once, in order.
func TestTxnPublisher_resolves_a_commit_whose_answer_was_lost(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		topic := newTopic(t, b, 2, nil)
		ft := newFaultyTransport(t, once(func(req kafka.Request) bool {
			r, ok := req.(*endtxn.Request)
			return ok && r.Committed
		}))
		p := newTestTxnPublisher(t, b, topic, kafkapub.Config{Transport: ft, PublishTimeout: time.Second})
		own(t, p, 0)
		batch := []*outbox.Message{bucketMsg(0, topic, "k", "1"), bucketMsg(0, topic, "k", "2"), bucketMsg(0, topic, "j", "3")}
		res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
		if res.Acknowledged != 0 || !errors.Is(res.Err, context.DeadlineExceeded) || errors.Is(res.Err, relay.ErrFenced) {
			t.Fatalf("Publish with the commit answer lost = %d, %v; want 0, DeadlineExceeded (not fenced)", res.Acknowledged, res.Err)
		}
		produced := ft.produces.Load()
		// The relay retries the head row alone, then the rest with a new row.
		if res := p.Publish(context.Background(), [][]*outbox.Message{batch[:1]})[0]; res.Acknowledged != 1 || res.Err != nil {
			t.Fatalf("retry of the head row = %d, %v; want 1, nil", res.Acknowledged, res.Err)
		}
		more := append(batch[1:], bucketMsg(0, topic, "k", "4"))
		if res := p.Publish(context.Background(), [][]*outbox.Message{more})[0]; res.Acknowledged != 3 || res.Err != nil {
			t.Fatalf("next batch = %d, %v; want 3, nil", res.Acknowledged, res.Err)
		}
		if n := ft.produces.Load() - produced; n != 1 {
			t.Fatalf("produce requests after the lost commit = %d; want 1 (row 4 only)", n)
		}
		got := readIsolated(t, b, topic, kgo.ReadCommitted(), 4, 300*time.Millisecond)
		if len(got) != 4 {
			t.Fatalf("read_committed = %s; want 1,2,3,4 once each", values(got))
		}
	})
}

// A produce whose answer is lost (the broker appended the batch) leaves
// the sequence numbers unknown: the publisher aborts the transaction and
// bumps its epoch (InitProducerId with its producer id and epoch) before
// the next one. The aborted copy stays invisible to read_committed
// consumers, and the rows come once, in order.
func TestTxnPublisher_bumps_the_epoch_after_a_produce_of_unknown_outcome(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		topic := newTopic(t, b, 1, nil)
		ft := newFaultyTransport(t, once(func(req kafka.Request) bool {
			_, ok := req.(*rawproduce.Request)
			return ok
		}))
		p := newTestTxnPublisher(t, b, topic, kafkapub.Config{Transport: ft, PublishTimeout: time.Second})
		own(t, p, 0)
		epoch := producerEpoch(t, p, 0)
		batch := []*outbox.Message{bucketMsg(0, topic, "k", "1"), bucketMsg(0, topic, "k", "2")}
		res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
		if res.Acknowledged != 0 || res.Err == nil || errors.Is(res.Err, relay.ErrFenced) {
			t.Fatalf("Publish with the produce answer lost = %d, %v; want 0 and a transient error", res.Acknowledged, res.Err)
		}
		if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Acknowledged != 2 || res.Err != nil {
			t.Fatalf("retry = %d, %v; want 2, nil", res.Acknowledged, res.Err)
		}
		if got := producerEpoch(t, p, 0); got <= epoch {
			t.Fatalf("producer epoch %d after the retry; want above %d (bumped)", got, epoch)
		}
		if got := values(readIsolated(t, b, topic, kgo.ReadCommitted(), 2, 300*time.Millisecond)); got != "1,2" {
			t.Fatalf("read_committed = %s; want 1,2", got)
		}
		if got := values(readIsolated(t, b, topic, kgo.ReadUncommitted(), 4, 300*time.Millisecond)); got != "1,2,1,2" {
			t.Fatalf("read_uncommitted = %s; want 1,2,1,2 (the aborted copy first)", got)
		}
	})
}

// A produce whose answer is lost to a cut connection, or that the broker
// refuses without appending it (NOT_ENOUGH_REPLICAS: the leader could not
// verify the transaction with its coordinator), is resent in place with
// the same sequence number: the broker appends it once, so even a
// read_uncommitted consumer sees each row once, and the epoch stays.
func TestTxnPublisher_resends_a_produce_in_place(t *testing.T) {
	check := func(t *testing.T, b testenv.Broker, p *kafkapub.Publisher, topic string) {
		t.Helper()
		own(t, p, 0)
		epoch := producerEpoch(t, p, 0)
		batch := []*outbox.Message{bucketMsg(0, topic, "k", "1"), bucketMsg(0, topic, "k", "2")}
		if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Acknowledged != 2 || res.Err != nil {
			t.Fatalf("Publish = %d, %v; want 2, nil", res.Acknowledged, res.Err)
		}
		if got := producerEpoch(t, p, 0); got != epoch {
			t.Fatalf("epoch %d after the publish; want %d (no bump)", got, epoch)
		}
		if got := values(readIsolated(t, b, topic, kgo.ReadUncommitted(), 2, 300*time.Millisecond)); got != "1,2" {
			t.Fatalf("read_uncommitted = %s; want 1,2 (appended once)", got)
		}
	}
	t.Run("answer_lost_to_a_cut_connection", func(t *testing.T) {
		testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
			topic := newTopic(t, b, 1, nil)
			ft := newFaultyTransport(t, once(func(req kafka.Request) bool {
				_, ok := req.(*rawproduce.Request)
				return ok
			}))
			ft.cut = true
			p := newTestTxnPublisher(t, b, topic, kafkapub.Config{Transport: ft})
			check(t, b, p, topic)
			if n := ft.produces.Load(); n != 2 {
				t.Fatalf("produce requests = %d; want 2 (one resent)", n)
			}
		})
	})
	t.Run("not_enough_replicas", func(t *testing.T) {
		b := testenv.NewFake(t)
		topic := newTopic(t, b, 1, nil)
		p := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
		h := b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: 3})
		check(t, b, p, topic)
		if n := h.Hits(); n != 3 {
			t.Fatalf("produce answered NOT_ENOUGH_REPLICAS %d times; want 3", n)
		}
	})
}

// A transaction open longer than Transactions.Timeout is aborted by
// the coordinator, which bumps the epoch: the stalled producer's next
// request is fenced, its publish fails with relay.ErrFenced, and nothing of it
// becomes visible. The real broker looks for timed-out transactions every
// 10 s (transaction.abort.timed.out.transaction.cleanup.interval.ms), so its
// stall is longer.
func TestTxnPublisher_transaction_timeout_fences_the_producer(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		stall, steps := 1500*time.Millisecond, []string{"added", "produced"}
		if b.Fake == nil {
			stall, steps = 12*time.Second, []string{"produced"}
		}
		for _, step := range steps {
			t.Run("stalled_after_"+step, func(t *testing.T) {
				topic := newTopic(t, b, 1, nil)
				p := newTestTxnPublisher(t, b, topic, kafkapub.Config{
					PublishTimeout: 300 * time.Millisecond,
					Transactions:   &kafkapub.Transactions{Timeout: time.Second},
				})
				own(t, p, 0)
				setTxnHook(t, p, func(_ int, s string) {
					if s == step {
						time.Sleep(stall) // past the transaction timeout
					}
				})
				res := p.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "1")}})[0]
				if res.Acknowledged != 0 || res.Err == nil {
					t.Fatalf("stalled Publish = %d, %v; want 0 and an error", res.Acknowledged, res.Err)
				}
				setTxnHook(t, p, nil)
				// The relay retries: the producer is found fenced.
				res = p.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "1")}})[0]
				if res.Acknowledged != 0 || !errors.Is(res.Err, relay.ErrFenced) {
					t.Fatalf("retry = %d, %v; want 0, relay.ErrFenced", res.Acknowledged, res.Err)
				}
				t.Logf("retry after the timeout: %v", res.Err)
				if got := readIsolated(t, b, topic, kgo.ReadCommitted(), 0, 300*time.Millisecond); len(got) != 0 {
					t.Fatalf("read_committed = %s; want nothing", values(got))
				}
				// A new acquisition initialises a new producer, which publishes.
				p.OwnedBuckets(nil)
				own(t, p, 0)
				if res := p.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "1")}})[0]; res.Err != nil {
					t.Fatalf("Publish after re-initialisation = %v", res.Err)
				}
				if got := values(readIsolated(t, b, topic, kgo.ReadCommitted(), 1, 300*time.Millisecond)); got != "1" {
					t.Fatalf("read_committed = %s; want 1", got)
				}
			})
		}
	})
}

// The in-process broker restarts (its state persisted in a directory)
// while a transaction is open, its records appended: the publish fails or
// commits, never half-way; after the restart the relay's next steps
// publish every row exactly once for read_committed consumers.
func TestTxnPublisher_survives_a_broker_restart_mid_transaction(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	start := func() *kfake.Cluster {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir), kfake.SyncWrites(), kfake.DefaultNumPartitions(1))
		if err != nil {
			t.Fatalf("start kfake: %v", err)
		}
		return c
	}
	c := start()
	var mu sync.Mutex
	defer func() {
		mu.Lock()
		c.Close()
		mu.Unlock()
	}()
	b := testenv.Broker{Name: testenv.InProcess, Addrs: c.ListenAddrs(), Fake: c}
	topic := newTopic(t, b, 1, nil)
	p := newTestTxnPublisher(t, b, topic, kafkapub.Config{PublishTimeout: 3 * time.Second})
	own(t, p, 0)
	if res := p.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "0")}})[0]; res.Err != nil {
		t.Fatalf("first Publish = %v", res.Err)
	}
	restarted := false
	setTxnHook(t, p, func(_ int, s string) {
		if s != "produced" || restarted {
			return
		}
		restarted = true
		mu.Lock()
		c.Close()
		c = start()
		mu.Unlock()
	})
	batch := []*outbox.Message{bucketMsg(0, topic, "k", "1"), bucketMsg(0, topic, "k", "2")}
	res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
	t.Logf("Publish across the restart = %d, %v", res.Acknowledged, res.Err)
	if !restarted {
		t.Fatal("the broker was not restarted")
	}
	setTxnHook(t, p, nil)
	acked := res.Acknowledged
	for attempt := 0; acked < len(batch); attempt++ {
		if attempt == 20 {
			t.Fatalf("rows still unacknowledged after %d attempts: %v", attempt, res.Err)
		}
		if errors.Is(res.Err, relay.ErrFenced) {
			// What the relay does: drop the bucket, acquire it again.
			p.OwnedBuckets(nil)
			own(t, p, 0)
		} else if res.Err != nil {
			time.Sleep(200 * time.Millisecond)
		}
		res = p.Publish(context.Background(), [][]*outbox.Message{batch[acked:]})[0]
		acked += res.Acknowledged
		t.Logf("retry %d = %d, %v", attempt, res.Acknowledged, res.Err)
	}
	mu.Lock()
	b.Addrs = c.ListenAddrs()
	mu.Unlock()
	if got := values(readIsolated(t, b, topic, kgo.ReadCommitted(), 3, 500*time.Millisecond)); got != "0,1,2" {
		t.Fatalf("read_committed = %s; want 0,1,2", got)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
