package kafkapub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/failpoint"
	"github.com/gorm-outbox/outbox/kafkapub/internal/wire"
	"github.com/gorm-outbox/outbox/relay"
)

// Transactional publishing defaults (see Transactions).
const (
	// DefaultTransactionalIDPrefix starts every transactional.id of a
	// transactional Publisher.
	DefaultTransactionalIDPrefix = "outbox-"
	// DefaultTransactionTimeout is the default transaction timeout a
	// transactional Publisher asks its coordinator for, the Java
	// producer's default.
	DefaultTransactionTimeout = time.Minute
)

// Transactions makes a Publisher transactional (Config.Transactions):
// fenced publishing. The publisher keeps one Kafka transactional producer
// per bucket its relay owns (transactional.id TransactionalID(bucket)) and
// publishes each batch in one Kafka transaction, reported acknowledged only
// once its commit succeeded.
//
// When the relay acquires a bucket (relay.Publisher.OwnedBuckets) the
// publisher initialises its transactional.id, which aborts a previous
// owner's open transaction and fences every later request of that owner;
// a Publish whose producer was fenced, or whose transaction the coordinator
// aborted, fails with an error wrapping relay.ErrFenced and acknowledges
// nothing. A record the broker rejects aborts the transaction; the rows
// before it are published again alone, so that Publish acknowledges exactly
// the prefix before the culprit.
//
// It needs WRITE and DESCRIBE on the transactional ids (prefix IDPrefix)
// and read_committed consumers, costs three more coordinator round trips
// per Publish, and serves one relay whose store sets Message.Bucket.
// docs/fenced-publishing.md gives the retries, the duplicates and the costs
// in full.
type Transactions struct {
	// Outbox names the outbox in its transactional ids. Required: the ids
	// must be unique to this outbox across the Kafka cluster, since two
	// outboxes sharing them fence each other.
	Outbox string

	// IDPrefix starts every transactional id. Empty means
	// DefaultTransactionalIDPrefix ("outbox-").
	IDPrefix string

	// Timeout is the transaction timeout the publisher asks for
	// (transaction.timeout.ms): the coordinator aborts a transaction open
	// longer and fences its producer. It must exceed
	// Config.PublishTimeout and be at most the brokers'
	// transaction.max.timeout.ms (15 min by default). Zero means
	// DefaultTransactionTimeout (1 min); negative fails
	// New.
	Timeout time.Duration
}

// TransactionalID returns the transactional.id of bucket: IDPrefix (or
// DefaultTransactionalIDPrefix), Outbox, "-" and the bucket number, e.g.
// "outbox-orders-3".
func (t Transactions) TransactionalID(bucket int) string {
	return cmp.Or(t.IDPrefix, DefaultTransactionalIDPrefix) + t.Outbox + "-" + strconv.Itoa(bucket)
}

// check validates t for a publisher whose PublishTimeout is publishTimeout
// and returns it with its defaults.
func (t Transactions) check(publishTimeout time.Duration) (Transactions, error) {
	if strings.TrimSpace(t.Outbox) == "" {
		return t, errors.New("kafkapub: Transactions.Outbox is empty")
	}
	if t.Timeout < 0 {
		return t, fmt.Errorf("kafkapub: Transactions.Timeout is negative (%v)", t.Timeout)
	}
	t.Timeout = cmp.Or(t.Timeout, DefaultTransactionTimeout)
	if t.Timeout <= publishTimeout {
		return t, fmt.Errorf("kafkapub: Transactions.Timeout %v is not longer than Config.PublishTimeout %v", t.Timeout, publishTimeout)
	}
	if t.Timeout/time.Millisecond > math.MaxInt32 {
		return t, fmt.Errorf("kafkapub: Transactions.Timeout %v is too long", t.Timeout)
	}
	t.IDPrefix = cmp.Or(t.IDPrefix, DefaultTransactionalIDPrefix)
	return t, nil
}

// txnProducer is the transactional producer of one bucket. Its fields but
// ready and initErr belong to the holder of turn.
type txnProducer struct {
	bucket int
	id     string // transactional.id

	ready   chan struct{} // closed when the initialisation ended
	initErr error         // set before ready is closed; wraps relay.ErrFenced

	turn chan struct{} // one Publish (or abort) at a time

	pid   int64
	epoch int16
	seq   map[topicPartition]int32 // next sequence number per partition, this epoch

	open   bool  // a transaction may be open on the coordinator (partitions added, no EndTxn answered)
	bump   bool  // a produce of unknown outcome left the sequence numbers unknown: bump the epoch first
	fenced error // fenced for good (wraps relay.ErrFenced)

	inDoubt   []outbox.UUID // the rows of a transaction whose commit was sent but not answered
	committed []outbox.UUID // those of such a transaction found committed, not yet acknowledged to the relay
}

// OwnedBuckets implements relay.Publisher. In the transactional mode it
// starts, in the background, the initialisation of a producer for each
// bucket new to the set (InitProducerId, which fences the bucket's previous
// owner), bounded by PublishTimeout; a Publish of the bucket waits for it.
// A bucket that leaves the set loses its producer, and a transaction it
// left open (or a commit whose answer was lost) is aborted in the
// background. A bucket whose initialisation failed keeps its failed
// producer, so that its Publish fails with relay.ErrFenced and the relay
// drops the bucket and acquires it again. In the default mode it does
// nothing.
func (p *Publisher) OwnedBuckets(buckets []int) {
	if p.txn == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	owned := buckets // ascending, from the relay: O(p log n) lookups
	if !slices.IsSorted(owned) {
		owned = slices.Sorted(slices.Values(buckets))
	}
	p.retireProducers(func(b int) bool {
		_, ok := slices.BinarySearch(owned, b)
		return !ok
	})
	for _, b := range buckets {
		if _, ok := p.producers[b]; ok {
			continue
		}
		prod := &txnProducer{
			bucket: b,
			id:     p.txn.TransactionalID(b),
			ready:  make(chan struct{}),
			turn:   make(chan struct{}, 1),
		}
		p.producers[b] = prod
		p.wg.Go(func() { p.initProducer(prod) })
	}
}

// initProducer initialises prod (InitProducerId without a producer id:
// a new epoch that fences every older one) and closes prod.ready.
func (p *Publisher) initProducer(prod *txnProducer) {
	defer close(prod.ready)
	ctx, cancel := p.withTimeout(context.Background(), "coordinator")
	defer cancel()
	pid, epoch, err := p.initProducerID(ctx, prod.id, -1, -1)
	if err != nil {
		prod.initErr = fmt.Errorf("bucket %d: init transactional producer %s: %w: %w", prod.bucket, prod.id, err, relay.ErrFenced)
		return
	}
	prod.pid, prod.epoch = pid, epoch
	prod.seq = map[topicPartition]int32{}
}

// retire aborts, within PublishTimeout, a transaction that a producer the
// relay no longer owns left open or in doubt, so that read_committed
// consumers of its partitions are not held back until the next owner's
// initialisation or the transaction timeout.
func (p *Publisher) retire(prod *txnProducer) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	if !prod.take(ctx) {
		return
	}
	defer func() { <-prod.turn }()
	if prod.initErr != nil || prod.fenced != nil || (!prod.open && prod.inDoubt == nil) {
		return
	}
	_, _ = p.endTxn(ctx, prod, false)
}

// take waits for prod's initialisation, then takes its turn, and reports
// whether it did before ctx ended.
func (prod *txnProducer) take(ctx context.Context) bool {
	select {
	case <-prod.ready:
	case <-ctx.Done():
		return false
	}
	select {
	case prod.turn <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// producer returns the producer of bucket, nil when the relay did not
// report owning it.
func (p *Publisher) producer(bucket int) *txnProducer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.producers[bucket]
}

// publishTxnBatch publishes one bucket's batch in a transaction of its own
// (see Transactions).
func (p *Publisher) publishTxnBatch(ctx context.Context, batch []*outbox.Message) relay.Result {
	bucket := int(batch[0].Bucket)
	for _, m := range batch[1:] {
		if int(m.Bucket) != bucket {
			return relay.Result{Err: fmt.Errorf("kafkapub: transactional publish: the batch mixes buckets %d and %d", bucket, m.Bucket)}
		}
	}
	prod := p.producer(bucket)
	if prod == nil {
		return relay.Result{Err: fmt.Errorf("kafkapub: bucket %d: no transactional producer (the relay does not own the bucket, see relay.Publisher.OwnedBuckets): %w", bucket, relay.ErrFenced)}
	}
	ctx, span := p.tracing.start(ctx, batch)
	ctx, cancel := p.withTimeout(ctx, "broker")
	defer cancel()

	rows := make([]row, len(batch))
	for i, m := range batch {
		rows[i] = row{msg: p.record(m), id: m.MessageID, partition: -1}
	}
	if prod.take(ctx) {
		p.runTxns(ctx, prod, batch, rows)
		<-prod.turn
	}
	res := outcome(ctx, rows)
	p.tracing.end(span, rows, res.Err)
	return res
}

// publishTxn is Publish in the transactional mode: each batch (not empty)
// by publishTxnBatch, the batches of different buckets concurrently, those
// of one bucket in order; a batch after one of its bucket that failed is
// not sent, so that the bucket's order holds.
func (p *Publisher) publishTxn(ctx context.Context, batches [][]*outbox.Message, results []relay.Result) {
	if len(batches) == 1 { // nothing to group
		results[0] = p.publishTxnBatch(ctx, batches[0])
		return
	}
	byBucket := map[int32][]int{}
	var buckets []int32
	for i, b := range batches {
		if len(b) == 0 {
			continue
		}
		buckets = appendGroup(byBucket, buckets, b[0].Bucket, i)
	}
	run := func(bucket int32, idx []int) {
		var failed outbox.UUID // the row that stopped the bucket
		stopped := false
		for _, i := range idx {
			if stopped {
				results[i].Err = fmt.Errorf("kafkapub: bucket %d: batch not sent: message %s of an earlier batch of the bucket failed", bucket, failed)
				continue
			}
			results[i] = p.publishTxnBatch(ctx, batches[i])
			if results[i].Err != nil {
				stopped = true
				failed = batches[i][results[i].Acknowledged].MessageID
			}
		}
	}
	var wg sync.WaitGroup
	for _, b := range buckets[1:] {
		wg.Add(1)
		go func() { defer wg.Done(); run(b, byBucket[b]) }()
	}
	run(buckets[0], byBucket[buckets[0]]) // on this goroutine
	wg.Wait()
}

// runTxns publishes rows (batch's) under prod's turn: it acknowledges the
// rows a lost-then-resolved commit already published, then publishes the
// others in transactions (see txnRange).
func (p *Publisher) runTxns(ctx context.Context, prod *txnProducer, batch []*outbox.Message, rows []row) {
	if err := cmp.Or(prod.initErr, prod.fenced); err != nil {
		rows[0].err = err
		return
	}
	if prod.inDoubt != nil {
		if err := p.resolveInDoubt(ctx, prod); err != nil {
			rows[0].err = err
			return
		}
	}
	skip := 0
	for skip < len(batch) && skip < len(prod.committed) && batch[skip].MessageID == prod.committed[skip] {
		rows[skip].acked = true
		skip++
	}
	prod.committed = prod.committed[skip:]
	if skip == 0 || len(prod.committed) == 0 {
		prod.committed = nil // none left, or the relay moved on (or never saw them fail)
	}
	if skip == len(rows) {
		return
	}

	p.place(ctx, batch, rows)
	hi := len(rows)
	for i := skip; i < len(rows); i++ {
		if rows[i].err != nil {
			hi = i
			break
		}
		if n := int64(wire.RecordSize(&rows[i].msg)); n > p.batchBytes {
			rows[i].err = p.tooLarge(n)
			hi = i
			break
		}
	}
	p.txnRange(ctx, prod, rows, skip, hi)
}

// resolveInDoubt sends the commit whose answer was lost again: a commit
// that was applied is acknowledged again, an open transaction is committed
// now (every record of it was appended). Its rows become prod.committed.
func (p *Publisher) resolveInDoubt(ctx context.Context, prod *txnProducer) error {
	if _, err := p.endTxn(ctx, prod, true); err != nil {
		if prod.fenced != nil {
			prod.inDoubt = nil // the next owner publishes them again
		}
		return err
	}
	prod.committed = append(prod.committed, prod.inDoubt...)
	prod.inDoubt = nil
	return nil
}

// txnRange publishes rows[lo:hi] (placed, none too large) in one
// transaction and reports whether it committed. On failure the first row
// that was not acknowledged has the error: rows[lo] for a transient
// failure or a fenced producer; for a record the broker rejected, the
// rows before it are published in transactions of their own first (see
// Transactions) and the culprit gets the error.
func (p *Publisher) txnRange(ctx context.Context, prod *txnProducer, rows []row, lo, hi int) bool {
	if lo >= hi {
		return true
	}
	// stop fails the range at row at: the rows before it go alone.
	stop := func(at int, err error) bool {
		rows[at].err = err
		p.txnRange(ctx, prod, rows, lo, at)
		return false
	}
	if err := p.readyTxn(ctx, prod); err != nil {
		return stop(lo, err)
	}

	// The range's partitions, in the order of their first row.
	idx := map[topicPartition][]int{}
	var parts []topicPartition
	for i := lo; i < hi; i++ {
		parts = appendGroup(idx, parts, topicPartition{Topic: rows[i].msg.Topic, Partition: rows[i].partition}, i)
	}

	failed, err := p.addPartitions(ctx, prod, parts)
	if err != nil {
		if failed == nil {
			return stop(lo, err)
		}
		// Partitions the coordinator refused: the range stops at their
		// first row.
		cut := hi
		for _, tp := range failed {
			cut = min(cut, idx[tp][0])
		}
		return stop(cut, classify(err, false))
	}
	out := p.produceAll(ctx, prod, rows, parts, idx)
	if prod.fenced != nil {
		return stop(lo, prod.fenced)
	}
	var first *partitionOutcome
	unknown := false
	for i := range out {
		o := &out[i]
		unknown = unknown || o.unknown
		if o.err != nil && (first == nil || o.failed[0] < first.failed[0]) {
			first = o
		}
	}
	if first == nil {
		failpoint.Inject("relay/during-publish")
		failpoint.Inject("kafkapub/before-commit") // a zombie stalls here (CHAOS.md)
		if err := p.commit(ctx, prod, rows[lo:hi]); err != nil {
			return stop(lo, err)
		}
		for i := lo; i < hi; i++ {
			rows[i].acked = true
		}
		return true
	}

	// A produce failed: the transaction is aborted.
	if unknown {
		prod.bump = true
	}
	if _, err := p.endTxn(ctx, prod, false); err != nil && prod.fenced != nil {
		return stop(lo, err)
	}
	switch c := first.failed; {
	case first.unknown:
		return stop(lo, first.err)
	case recordError(first.err) && len(c) == 1:
		return stop(c[0], classify(first.err, true))
	case recordError(first.err):
		mid := c[len(c)/2]
		return p.txnRange(ctx, prod, rows, lo, mid) && p.txnRange(ctx, prod, rows, mid, hi)
	case errors.Is(classify(first.err, false), relay.ErrUnpublishable):
		// About the topic (not writable, invalid): every row of the
		// partition fails.
		return stop(idx[first.tp][0], classify(first.err, false))
	default:
		return stop(lo, fmt.Errorf("transaction aborted: %s[%d]: %w", first.tp.Topic, first.tp.Partition, first.err))
	}
}

// readyTxn prepares prod for a new transaction: it aborts one that may be
// open and, when a produce of unknown outcome left the sequence numbers
// unknown, bumps the epoch (after the abort, which also tells whether the
// producer was fenced meanwhile: a bump is only ever asked for by a
// producer whose epoch the coordinator just accepted).
func (p *Publisher) readyTxn(ctx context.Context, prod *txnProducer) error {
	if prod.fenced != nil {
		return prod.fenced
	}
	if prod.open || prod.bump {
		if _, err := p.endTxn(ctx, prod, false); err != nil {
			return err
		}
	}
	if prod.bump {
		pid, epoch, err := p.initProducerID(ctx, prod.id, prod.pid, prod.epoch)
		if err != nil {
			if errors.Is(err, relay.ErrFenced) {
				prod.fenced = p.fencedError(prod, err)
				return prod.fenced
			}
			return fmt.Errorf("bump the producer epoch: %w", err)
		}
		prod.pid, prod.epoch = pid, epoch
		clear(prod.seq)
		prod.bump = false
	}
	return nil
}

// commit ends prod's transaction with a commit. When the answer is lost
// (the call's context ended first), the rows are in doubt: the next
// Publish of the bucket resolves them (see resolveInDoubt).
func (p *Publisher) commit(ctx context.Context, prod *txnProducer, rows []row) error {
	definite, err := p.endTxn(ctx, prod, true)
	if err == nil {
		return nil
	}
	if !definite && prod.fenced == nil {
		prod.inDoubt = make([]outbox.UUID, len(rows))
		for i := range rows {
			prod.inDoubt[i] = rows[i].id
		}
		return fmt.Errorf("commit (outcome unknown, resolved by the next publish of the bucket): %w", err)
	}
	return err
}

// fencedError is the sticky error of a fenced producer.
func (p *Publisher) fencedError(prod *txnProducer, err error) error {
	if !errors.Is(err, relay.ErrFenced) {
		err = fmt.Errorf("%w: %w", err, relay.ErrFenced)
	}
	return fmt.Errorf("transactional producer %s (epoch %d): %w", prod.id, prod.epoch, err)
}

// nextSequence returns the sequence number after n records from seq;
// sequence numbers wrap at math.MaxInt32 to 0, as Kafka's do.
func nextSequence(seq int32, n int) int32 {
	return int32((int64(seq) + int64(n)) % (math.MaxInt32 + 1))
}

// retireProducers drops the producers of the buckets that gone reports
// and retires them in the background (p.wg); called with p.mu held.
func (p *Publisher) retireProducers(gone func(bucket int) bool) {
	for b, prod := range p.producers {
		if gone(b) {
			delete(p.producers, b)
			p.wg.Go(func() { p.retire(prod) })
		}
	}
}
