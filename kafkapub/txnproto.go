package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox/kafkapub/internal/wire"
	"github.com/gorm-outbox/outbox/relay"
)

// The transactional mode's protocol steps: package wire sends the requests;
// here each answer becomes the producer's state and the relay's errors.

// initProducerID is wire's InitProducerID with the configured transaction
// timeout; a fenced answer wraps relay.ErrFenced.
func (p *Publisher) initProducerID(ctx context.Context, txid string, pid int64, epoch int16) (int64, int16, error) {
	pid, epoch, err := p.client().InitProducerID(ctx, txid, p.txn.Timeout, pid, epoch)
	if err != nil {
		if wire.ProducerFenced(err) {
			err = fmt.Errorf("%w: %w", err, relay.ErrFenced)
		}
		return 0, 0, err
	}
	return pid, epoch, nil
}

// addPartitions adds parts to prod's transaction. A partition the
// coordinator refuses (unknown, not authorised) is returned in failed with
// its error: none was added. A fenced producer's error wraps
// relay.ErrFenced and is sticky (prod.fenced).
func (p *Publisher) addPartitions(ctx context.Context, prod *txnProducer, parts []topicPartition) (failed []topicPartition, err error) {
	prod.open = true
	failed, err = p.client().AddPartitionsToTxn(ctx, prod.id, prod.pid, prod.epoch, parts)
	if err != nil && failed == nil && wire.ProducerFenced(err) {
		prod.fenced = p.fencedError(prod, err)
		return nil, prod.fenced
	}
	return failed, err
}

// endTxn ends prod's transaction: commit or abort. definite is false when
// the answer did not arrive (the context ended), so the coordinator may or
// may not have applied it. An abort with no open transaction
// (INVALID_TXN_STATE) succeeds; a commit answered INVALID_TXN_STATE (the
// coordinator aborted the transaction: it timed out) and a fenced answer
// make the producer fenced (prod.fenced, wrapping relay.ErrFenced).
func (p *Publisher) endTxn(ctx context.Context, prod *txnProducer, commit bool) (definite bool, err error) {
	what := "EndTxn (abort)"
	if commit {
		what = "EndTxn (commit)"
	}
	answered, err := p.client().EndTxn(ctx, prod.id, prod.pid, prod.epoch, commit)
	switch {
	case err == nil:
	case !commit && answered && errors.Is(err, kafka.InvalidTransactionState):
		err = nil // nothing open
	case wire.ProducerFenced(err) || (commit && answered && errors.Is(err, kafka.InvalidTransactionState)):
		prod.open = false
		prod.fenced = p.fencedError(prod, fmt.Errorf("%s: %w", what, err))
		return true, prod.fenced
	default:
		return answered, fmt.Errorf("%s: %w", what, err)
	}
	prod.open = false
	return true, nil
}

// partitionOutcome is the outcome of one partition's produce requests in a
// transaction.
type partitionOutcome struct {
	tp      topicPartition
	seq     int32 // the partition's next sequence number after the requests
	failed  []int // the rows of the failed request; nil: all appended
	err     error // its error
	unknown bool  // its outcome (or the broker's sequence state) is unknown: bump the epoch
}

// produceAll sends the rows of every partition of a transaction in rounds:
// round k carries the k-th chunk of every partition that has one, as one
// produce request per leader broker, all leaders at once. A partition stops
// at its first failure. One request per broker matters beyond saving round
// trips: a leader verifies a transaction's first batch on it with the
// coordinator, and concurrent verifications of one transactional id on one
// broker fail all but one (NOT_ENOUGH_REPLICAS, NETWORK_EXCEPTION).
func (p *Publisher) produceAll(ctx context.Context, prod *txnProducer, rows []row, parts []topicPartition, idx map[topicPartition][]int) []partitionOutcome {
	out := make([]partitionOutcome, len(parts))
	chunks := make([][][]int, len(parts))
	for i, tp := range parts {
		out[i] = partitionOutcome{tp: tp, seq: prod.seq[tp]}
		chunks[i] = p.chunk(rows, idx[tp])
	}
	leaders := p.client().Leaders(ctx, parts)
	ts := time.Now().UnixMilli()
	for round := 0; ; round++ {
		groups := map[int32][]*produceItem{}
		var order []int32
		for i := range parts {
			o := &out[i]
			if o.err != nil || round >= len(chunks[i]) {
				continue
			}
			c := chunks[i][round]
			msgs := make([]kafka.Message, len(c))
			for j, r := range c {
				msgs[j] = rows[r].msg
			}
			set, err := wire.EncodeRecordBatch(wire.ProducerBatch{
				ProducerID: prod.pid, ProducerEpoch: prod.epoch, BaseSequence: o.seq, Transactional: true,
			}, ts, p.w.Compression, msgs)
			if err != nil {
				o.failed, o.err = c, unpublishable(err)
				continue
			}
			leader := leaders[o.tp]
			if leader < 0 {
				leader = -1 - int32(i) // leader unknown: a request of its own
			}
			order = appendGroup(groups, order, leader, &produceItem{out: o, rows: c, set: set})
		}
		if len(order) == 0 {
			break
		}
		var wg sync.WaitGroup
		for _, leader := range order {
			wg.Add(1)
			go func() { defer wg.Done(); p.sendItems(ctx, prod, groups[leader]) }()
		}
		wg.Wait()
		for _, leader := range order {
			for _, it := range groups[leader] {
				if it.err != nil {
					it.out.failed, it.out.err, it.out.unknown = it.rows, it.err, it.unknown
				} else {
					it.out.seq = nextSequence(it.out.seq, len(it.rows))
				}
			}
		}
	}
	for i := range out {
		prod.seq[out[i].tp] = out[i].seq
		if errors.Is(out[i].err, relay.ErrFenced) && prod.fenced == nil {
			prod.fenced = p.fencedError(prod, out[i].err)
			out[i].err = prod.fenced
		}
	}
	return out
}

// chunk splits a partition's rows (indexes into rows, in order) into the
// rows of successive requests: at most maxRecords each, and at most
// batchBytes unless a single row is larger.
func (p *Publisher) chunk(rows []row, idx []int) [][]int {
	var out [][]int
	for start := 0; start < len(idx); {
		var size int64
		end := start
		for end < len(idx) && end-start < p.maxRecords {
			n := int64(wire.RecordSize(&rows[idx[end]].msg))
			if end > start && size+n > p.batchBytes {
				break
			}
			size += n
			end++
		}
		out = append(out, idx[start:end])
		start = end
	}
	return out
}

// produceItem is one partition's record batch in a produce request.
type produceItem struct {
	out  *partitionOutcome
	rows []int
	set  []byte // the request's record set: size prefix, batch

	done          bool  // settled: appended (err nil) or failed
	err           error // the failure, or the latest attempt's error while pending
	maybeAppended bool  // an attempt may have been appended (cut off, or an uncertain answer)
	unknown       bool  // it failed after such an attempt
}

// sendItems sends items (partitions led by one broker) in one produce
// request and records each one's outcome. A failure that leaves a batch
// appended or not (see wire.ProduceRetriable) is retried with the same
// bytes and sequence number until ctx ends: the broker appends a
// producer's batch once and answers a resent one as the first. When the
// transport finds no common leader for the partitions, they go one by one.
func (p *Publisher) sendItems(ctx context.Context, prod *txnProducer, items []*produceItem) {
	wait := wire.RetryFirst
	for {
		var pending []*produceItem
		for _, it := range items {
			if !it.done {
				pending = append(pending, it)
			}
		}
		if len(pending) == 0 {
			return
		}
		retry, split := p.sendOnce(ctx, prod, pending)
		if split {
			var wg sync.WaitGroup
			for _, it := range pending {
				wg.Add(1)
				go func() { defer wg.Done(); p.sendItems(ctx, prod, []*produceItem{it}) }()
			}
			wg.Wait()
			return
		}
		if retry && !wire.Backoff(ctx, &wait) {
			for _, it := range items {
				if !it.done {
					it.done, it.unknown = true, it.maybeAppended
					it.err = fmt.Errorf("%w (last error: %w)", context.Cause(ctx), it.err)
				}
			}
			return
		}
	}
}

// sendOnce sends pending in one request and settles the items it can;
// retry reports items left to resend, split a request the transport could
// not route as one.
func (p *Publisher) sendOnce(ctx context.Context, prod *txnProducer, pending []*produceItem) (retry, split bool) {
	// The broker waits at most half the time left for the in-sync
	// replicas, as kafka-go's writer asks.
	wait := p.timeout / 2
	if d, ok := ctx.Deadline(); ok {
		wait = max(time.Until(d)/2, time.Millisecond)
	}
	sets := make([]wire.RecordSet, len(pending))
	for i, it := range pending {
		sets[i] = wire.RecordSet{TopicPartition: it.out.tp, Set: it.set}
	}
	answers, sent, err := p.client().Produce(ctx, prod.id, wait, sets)
	if err != nil {
		if !sent && len(pending) > 1 { // no route: never sent
			return false, true
		}
		for _, it := range pending {
			settle(it, err, false, sent)
		}
		return !pending[0].done, false
	}
	for _, it := range pending {
		e, ok := answers[it.out.tp]
		if !ok {
			settle(it, errors.New("no answer for the partition"), false, true)
		} else {
			settle(it, e, true, true)
		}
		retry = retry || !it.done
	}
	return retry, false
}

// settle records the outcome of one attempt of it: e (nil: appended),
// answered when e is the broker's code for it, sent when the request
// reached the broker. It leaves it pending when the attempt is to be
// resent.
func settle(it *produceItem, e error, answered, sent bool) {
	uncertain := sent && (!answered || errors.Is(e, kafka.RequestTimedOut) ||
		errors.Is(e, kafka.NotEnoughReplicasAfterAppend) || errors.Is(e, kafka.NetworkException))
	switch {
	case e == nil:
		it.done, it.err = true, nil
	case it.maybeAppended && errors.Is(e, kafka.DuplicateSequenceNumber):
		it.done, it.err = true, nil // an earlier attempt was appended
	case wire.ProducerFenced(e), errors.Is(e, kafka.InvalidTransactionState):
		// INVALID_TXN_STATE: the partition is not in an ongoing
		// transaction of this epoch (the coordinator aborted it).
		it.done, it.err = true, fmt.Errorf("produce: %w: %w", e, relay.ErrFenced)
	case errors.Is(e, kafka.OutOfOrderSequenceNumber), errors.Is(e, kafka.DuplicateSequenceNumber), errors.Is(e, kafka.UnknownProducerId):
		it.done, it.err, it.unknown = true, fmt.Errorf("produce: %w", e), true
	case wire.ProduceRetriable(e):
		it.err = fmt.Errorf("produce: %w", e) // resent
		it.maybeAppended = it.maybeAppended || uncertain
	default:
		it.done, it.err = true, fmt.Errorf("produce: %w", e)
		it.unknown = it.maybeAppended || uncertain
	}
}
