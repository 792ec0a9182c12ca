package kafkapub_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// Helpers of the transactional mode's tests.
//
// A transactional publisher of the tests carries its requests through a
// txnWatch (its Config.Transport, around the one the test gave): what the
// coordinator answered to InitProducerId tells when a bucket's producer is
// initialised and its epoch, and the requests that follow a transaction's
// steps let a test act at those steps (setTxnHook).

// newTestTxnPublisher returns a transactional publisher on b for outbox name,
// closed at cleanup.
func newTestTxnPublisher(t testing.TB, b testenv.Broker, outboxName string, cfg kafkapub.Config) *kafkapub.Publisher {
	t.Helper()
	if cfg.Transactions == nil {
		cfg.Transactions = &kafkapub.Transactions{}
	}
	tc := *cfg.Transactions
	tc.Outbox = outboxName
	cfg.Transactions = &tc
	inner := cfg.Transport
	if inner == nil {
		tr := &kafka.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		inner = tr
	}
	w := &txnWatch{inner: inner, cfg: tc, inits: map[string]*initState{}, txns: map[string]*txnState{}}
	cfg.Transport = w
	p := newPublisher(t, b, cfg)
	watches.Store(p, w)
	t.Cleanup(func() { watches.Delete(p) })
	return p
}

// watches maps the publishers of newTestTxnPublisher to their txnWatch.
var watches sync.Map

func watchOf(t testing.TB, p *kafkapub.Publisher) *txnWatch {
	t.Helper()
	w, ok := watches.Load(p)
	if !ok {
		t.Fatal("not a publisher of newTestTxnPublisher")
	}
	return w.(*txnWatch)
}

// txnWatch passes a transactional publisher's requests on to inner and
// watches them.
type txnWatch struct {
	inner kafka.RoundTripper
	cfg   kafkapub.Transactions

	mu    sync.Mutex
	inits map[string]*initState // by transactional id
	txns  map[string]*txnState  // by transactional id
	hook  func(bucket int, step string)
}

// initState is what the coordinator last granted a transactional id.
type initState struct {
	granted chan struct{} // closed at the first epoch granted after reset
	epoch   int16
}

// txnState is a transactional id's current transaction, as its requests
// tell: added once its partitions were added (run by the first produce
// that follows), produced once a produce went out since (reset by the
// EndTxn that follows).
type txnState struct {
	added    *sync.Once
	produced bool
}

// init returns txid's initState, under w.mu.
func (w *txnWatch) init(txid string) *initState {
	s, ok := w.inits[txid]
	if !ok {
		s = &initState{granted: make(chan struct{})}
		w.inits[txid] = s
	}
	return s
}

func (w *txnWatch) txn(txid string) *txnState {
	s, ok := w.txns[txid]
	if !ok {
		s = &txnState{}
		w.txns[txid] = s
	}
	return s
}

// bucketOf returns the bucket of txid (the number after its last "-").
func bucketOf(txid string) int {
	n, _ := strconv.Atoi(txid[strings.LastIndexByte(txid, '-')+1:])
	return n
}

// step calls the hook, if any, at step of txid's transaction.
func (w *txnWatch) step(txid, step string) {
	w.mu.Lock()
	hook := w.hook
	w.mu.Unlock()
	if hook != nil {
		hook(bucketOf(txid), step)
	}
}

func (w *txnWatch) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	switch r := req.(type) {
	case *rawproduce.Request:
		if r.TransactionalID != "" {
			w.mu.Lock()
			s := w.txn(r.TransactionalID)
			added := s.added
			s.produced = true
			w.mu.Unlock()
			if added != nil {
				// Every produce of the transaction waits for the hook.
				added.Do(func() { w.step(r.TransactionalID, "added") })
			}
		}
	case *endtxn.Request:
		w.mu.Lock()
		s := w.txn(r.TransactionalID)
		produced := s.produced && r.Committed
		s.added, s.produced = nil, false
		w.mu.Unlock()
		if produced {
			w.step(r.TransactionalID, "produced")
		}
	}
	res, err := w.inner.RoundTrip(ctx, addr, req)
	if err != nil {
		return res, err
	}
	switch r := res.(type) {
	case *initproducerid.Response:
		if r.ErrorCode == 0 {
			txid := req.(*initproducerid.Request).TransactionalID
			w.mu.Lock()
			s := w.init(txid)
			s.epoch = r.ProducerEpoch
			select {
			case <-s.granted:
			default:
				close(s.granted)
			}
			w.mu.Unlock()
		}
	case *addpartitionstotxn.Response:
		ok := true
		for _, tp := range r.Results {
			for _, pp := range tp.Results {
				ok = ok && pp.ErrorCode == 0
			}
		}
		if ok {
			w.mu.Lock()
			w.txn(req.(*addpartitionstotxn.Request).TransactionalID).added = new(sync.Once)
			w.mu.Unlock()
		}
	}
	return res, err
}

// setTxnHook makes the transactional publisher p (of newTestTxnPublisher)
// call f at the steps of each transaction ("added": partitions added,
// nothing produced; "produced": every record appended, not committed),
// before the request that follows the step (its first produce, its
// commit); nil removes it.
func setTxnHook(t testing.TB, p *kafkapub.Publisher, f func(bucket int, step string)) {
	t.Helper()
	w := watchOf(t, p)
	w.mu.Lock()
	w.hook = f
	w.mu.Unlock()
}

// producerEpoch returns the epoch the coordinator last granted bucket's
// producer of p (of newTestTxnPublisher).
func producerEpoch(t testing.TB, p *kafkapub.Publisher, bucket int) int16 {
	t.Helper()
	w := watchOf(t, p)
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.inits[w.cfg.TransactionalID(bucket)]
	if !ok {
		t.Fatalf("bucket %d: no producer initialised", bucket)
	}
	return s.epoch
}

// own tells p that its relay owns buckets and waits (at most 30 s) until
// their producers are initialised (the coordinator granted each an epoch
// from now on); it fails t if one could not be.
func own(t testing.TB, p *kafkapub.Publisher, buckets ...int) {
	t.Helper()
	w := watchOf(t, p)
	w.mu.Lock()
	granted := make([]chan struct{}, len(buckets))
	for i, b := range buckets {
		s := w.init(w.cfg.TransactionalID(b))
		s.granted = make(chan struct{})
		granted[i] = s.granted
	}
	w.mu.Unlock()
	p.OwnedBuckets(buckets)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, b := range buckets {
		select {
		case <-granted[i]:
		case <-ctx.Done():
			t.Fatalf("bucket %d: producer not initialised after 30s", b)
		}
	}
}
