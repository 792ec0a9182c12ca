package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"
)

// The Kafka protocol steps of the transactional mode, on the writer's
// transport. Requests to the transaction coordinator (InitProducerId,
// AddPartitionsToTxn, EndTxn) are routed by kafka-go's transport, which
// looks the coordinator up (FindCoordinator, transaction key type) before
// each; a coordinator that moved answers NOT_COORDINATOR and the request is
// sent again.

// Backoff of the requests retried inside a call (see coordinate).
const (
	txnRetryFirst = 5 * time.Millisecond
	txnRetryMax   = 250 * time.Millisecond
)

// coordinatorRetriable reports whether a coordinator's answer (or the
// transport's error) asks for the same request again: a transaction still
// completing (CONCURRENT_TRANSACTIONS), a coordinator moving, loading or
// unreachable, a network error.
func coordinatorRetriable(err error) bool {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	switch ke {
	case kafka.ConcurrentTransactions,
		kafka.NotCoordinatorForGroup,       // NOT_COORDINATOR
		kafka.GroupCoordinatorNotAvailable, // COORDINATOR_NOT_AVAILABLE
		kafka.GroupLoadInProgress,          // COORDINATOR_LOAD_IN_PROGRESS
		kafka.TransactionCoordinatorFenced,
		kafka.BrokerNotAvailable,
		kafka.RequestTimedOut,
		kafka.NetworkException:
		return true
	}
	return false
}

// producerFenced reports whether a broker error says that the producer's
// epoch is no longer the transactional id's: a newer producer initialised
// it, or the coordinator aborted its transaction and bumped the epoch.
func producerFenced(err error) bool {
	for _, e := range []kafka.Error{kafka.ProducerFenced, kafka.InvalidProducerEpoch, kafka.InvalidProducerIDMapping} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// coordinate runs do until it succeeds, fails with an error that
// coordinatorRetriable does not retry, or ctx ends (then the error wraps
// ctx's cause and the last error).
func coordinate(ctx context.Context, do func(context.Context) error) error {
	wait := txnRetryFirst
	for {
		err := do(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %w)", context.Cause(ctx), err)
		}
		if !coordinatorRetriable(err) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %w)", context.Cause(ctx), err)
		case <-t.C:
		}
		wait = min(2*wait, txnRetryMax)
	}
}

func (p *KafkaPublisher) roundTrip(ctx context.Context, req kafka.Request) (kafka.Response, error) {
	return p.w.Transport.RoundTrip(ctx, p.w.Addr, req)
}

// kafkaError is the error of a response's error code and message.
func kafkaError(code int16, msg *string) error {
	if code == 0 {
		return nil
	}
	if msg != nil && *msg != "" {
		return fmt.Errorf("%w: %s", kafka.Error(code), *msg)
	}
	return kafka.Error(code)
}

// initProducerID initialises transactional id txid: with pid and epoch -1
// a new epoch (fencing every older producer of txid); with the producer's
// current pid and epoch, an epoch bump that the coordinator refuses
// (PRODUCER_FENCED) when they are no longer current. A fenced answer wraps
// ErrFenced.
func (p *KafkaPublisher) initProducerID(ctx context.Context, txid string, pid int64, epoch int16) (int64, int16, error) {
	var res *initproducerid.Response
	err := coordinate(ctx, func(ctx context.Context) error {
		m, err := p.roundTrip(ctx, &initproducerid.Request{
			TransactionalID:      txid,
			TransactionTimeoutMs: int32(p.txn.cfg.Timeout / time.Millisecond),
			ProducerID:           pid,
			ProducerEpoch:        epoch,
		})
		if err != nil {
			return err
		}
		r, ok := m.(*initproducerid.Response)
		if !ok {
			return fmt.Errorf("unexpected response %T", m)
		}
		res = r
		return kafkaError(r.ErrorCode, nil)
	})
	if err != nil {
		if producerFenced(err) {
			err = fmt.Errorf("%w: %w", err, ErrFenced)
		}
		return 0, 0, fmt.Errorf("InitProducerId: %w", err)
	}
	return res.ProducerID, res.ProducerEpoch, nil
}

// addPartitions adds parts to prod's transaction. A partition the
// coordinator refuses (unknown, not authorised) is returned in failed with
// its error: none was added. A fenced producer's error wraps ErrFenced and
// is sticky (prod.fenced).
func (p *KafkaPublisher) addPartitions(ctx context.Context, prod *txnProducer, parts []topicPartition) (failed []topicPartition, err error) {
	req := &addpartitionstotxn.Request{
		TransactionalID: prod.id,
		ProducerID:      prod.pid,
		ProducerEpoch:   prod.epoch,
	}
	byTopic := map[string]int{}
	for _, tp := range parts {
		i, ok := byTopic[tp.topic]
		if !ok {
			i = len(req.Topics)
			byTopic[tp.topic] = i
			req.Topics = append(req.Topics, addpartitionstotxn.RequestTopic{Name: tp.topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, int32(tp.partition))
	}
	prod.open = true
	var partErr error
	err = coordinate(ctx, func(ctx context.Context) error {
		failed, partErr = nil, nil
		m, err := p.roundTrip(ctx, req)
		if err != nil {
			return err
		}
		r, ok := m.(*addpartitionstotxn.Response)
		if !ok {
			return fmt.Errorf("unexpected response %T", m)
		}
		answered := 0
		for _, t := range r.Results {
			for _, rp := range t.Results {
				answered++
				e := kafkaError(rp.ErrorCode, nil)
				switch {
				case e == nil, errors.Is(e, kafka.Error(55)): // OPERATION_NOT_ATTEMPTED
				case coordinatorRetriable(e), producerFenced(e):
					return e // the whole request's answer
				default:
					failed = append(failed, topicPartition{t.Name, int(rp.PartitionIndex)})
					if partErr == nil {
						partErr = fmt.Errorf("%s[%d]: %w", t.Name, rp.PartitionIndex, e)
					}
				}
			}
		}
		if answered < len(parts) {
			// Retried: every partition needs its answer.
			return fmt.Errorf("answer for %d of %d partitions", answered, len(parts))
		}
		return nil
	})
	switch {
	case err != nil && producerFenced(err):
		prod.fenced = p.fencedError(prod, fmt.Errorf("AddPartitionsToTxn: %w", err))
		return nil, prod.fenced
	case err != nil:
		return nil, fmt.Errorf("AddPartitionsToTxn: %w", err)
	case partErr != nil:
		return failed, fmt.Errorf("AddPartitionsToTxn: %w", partErr)
	}
	return nil, nil
}

// endTxn ends prod's transaction: commit or abort. definite is false when
// the answer did not arrive (the context ended), so the coordinator may or
// may not have applied it. An abort with no open transaction
// (INVALID_TXN_STATE) succeeds; a commit answered INVALID_TXN_STATE (the
// coordinator aborted the transaction: it timed out) and a fenced answer
// make the producer fenced (prod.fenced, wrapping ErrFenced).
func (p *KafkaPublisher) endTxn(ctx context.Context, prod *txnProducer, commit bool) (definite bool, err error) {
	what := "EndTxn (abort)"
	if commit {
		what = "EndTxn (commit)"
	}
	answered := false
	err = coordinate(ctx, func(ctx context.Context) error {
		m, err := p.roundTrip(ctx, &endtxn.Request{
			TransactionalID: prod.id,
			ProducerID:      prod.pid,
			ProducerEpoch:   prod.epoch,
			Committed:       commit,
		})
		if err != nil {
			return err
		}
		r, ok := m.(*endtxn.Response)
		if !ok {
			return fmt.Errorf("unexpected response %T", m)
		}
		answered = !coordinatorRetriable(kafkaError(r.ErrorCode, nil))
		return kafkaError(r.ErrorCode, nil)
	})
	switch {
	case err == nil:
	case !commit && answered && errors.Is(err, kafka.InvalidTransactionState):
		err = nil // nothing open
	case producerFenced(err) || (commit && answered && errors.Is(err, kafka.InvalidTransactionState)):
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
	tp  topicPartition
	seq int32 // the partition's next sequence number after the requests
	// failed holds the rows of the failed request (nil: all appended); err
	// is its error; unknown says that the request's outcome is unknown (or
	// the broker's sequence state is), so that the epoch must be bumped.
	failed  []int
	err     error
	unknown bool
}

// produceAll sends the rows of every partition of a transaction, all
// partitions at once, each as requests of at most batchBytes and maxRecords
// in order, stopping a partition at its first failure.
func (p *KafkaPublisher) produceAll(ctx context.Context, prod *txnProducer, rows []row, parts []topicPartition, idx map[topicPartition][]int) []partitionOutcome {
	out := make([]partitionOutcome, len(parts))
	var wg sync.WaitGroup
	for i, tp := range parts {
		out[i] = partitionOutcome{tp: tp, seq: prod.seq[tp]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.producePartition(ctx, prod, rows, idx[tp], &out[i])
		}()
	}
	wg.Wait()
	for i := range out {
		prod.seq[out[i].tp] = out[i].seq
		if errors.Is(out[i].err, ErrFenced) && prod.fenced == nil {
			prod.fenced = p.fencedError(prod, out[i].err)
			out[i].err = prod.fenced
		}
	}
	return out
}

// producePartition sends one partition's rows (indexes into rows, in
// order) and records the outcome in o.
func (p *KafkaPublisher) producePartition(ctx context.Context, prod *txnProducer, rows []row, idx []int, o *partitionOutcome) {
	msgs := make([]kafka.Message, 0, min(len(idx), p.maxRecords))
	ts := p.txn.now().UnixMilli()
	for start := 0; start < len(idx); {
		var size int64
		end := start
		for end < len(idx) && end-start < p.maxRecords {
			n := int64(recordSize(&rows[idx[end]].msg))
			if end > start && size+n > p.batchBytes {
				break
			}
			size += n
			end++
		}
		msgs = msgs[:0]
		for _, i := range idx[start:end] {
			msgs = append(msgs, rows[i].msg)
		}
		err, unknown := p.produceBatch(ctx, prod, o.tp, o.seq, ts, msgs)
		if err != nil {
			o.failed, o.err, o.unknown = idx[start:end], err, unknown
			return
		}
		o.seq = nextSequence(o.seq, end-start)
		start = end
	}
}

// produceBatch sends msgs to tp as one record batch of prod's with base
// sequence seq. A failure that leaves the batch appended or not, as the
// broker's idempotence decides (a network error, REQUEST_TIMED_OUT,
// NETWORK_EXCEPTION, NOT_ENOUGH_REPLICAS (the leader could not verify the
// transaction with its coordinator), CONCURRENT_TRANSACTIONS), is retried
// with the same bytes and sequence number until ctx ends: the broker
// appends a producer's batch once, and answers a resent one with its first
// append. unknown reports that the batch may have been appended, or that
// the broker's sequence state is no longer the producer's.
func (p *KafkaPublisher) produceBatch(ctx context.Context, prod *txnProducer, tp topicPartition, seq int32, ts int64, msgs []kafka.Message) (err error, unknown bool) {
	set, err := encodeRecordBatch(producerBatch{
		producerID:    prod.pid,
		producerEpoch: prod.epoch,
		baseSequence:  seq,
		transactional: true,
	}, ts, p.w.Compression, msgs)
	if err != nil {
		return unpublishable(err), false
	}
	wait := txnRetryFirst
	resent := false
	for {
		e, sent := p.sendBatch(ctx, prod, tp, set)
		switch {
		case e == nil:
			return nil, false
		case resent && errors.Is(e, kafka.DuplicateSequenceNumber):
			return nil, false // the first attempt was appended
		case producerFenced(e), errors.Is(e, kafka.InvalidTransactionState):
			// INVALID_TXN_STATE: the partition is not in an ongoing
			// transaction of this epoch (the coordinator aborted it).
			return fmt.Errorf("produce: %w: %w", e, ErrFenced), false
		case errors.Is(e, kafka.OutOfOrderSequenceNumber), errors.Is(e, kafka.DuplicateSequenceNumber), errors.Is(e, kafka.UnknownProducerId):
			return fmt.Errorf("produce: %w", e), true
		case !produceRetriable(e):
			// A broker's answer leaves nothing appended, unless an
			// earlier attempt was; a request cut off (its context ended)
			// may have been.
			var ke kafka.Error
			return fmt.Errorf("produce: %w", e), resent || (sent && !errors.As(e, &ke))
		}
		resent = resent || sent
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("produce: %w (last error: %w)", context.Cause(ctx), e), true
		case <-t.C:
		}
		wait = min(2*wait, txnRetryMax)
	}
}

// produceRetriable reports whether a produce error is resent in place (see
// produceBatch).
func produceRetriable(err error) bool {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	switch ke {
	case kafka.RequestTimedOut, kafka.NetworkException, kafka.NotEnoughReplicas, kafka.NotEnoughReplicasAfterAppend, kafka.ConcurrentTransactions:
		return true
	}
	return false
}

// sendBatch sends one produce request of set to tp. sent is false when the
// request certainly did not reach the broker.
func (p *KafkaPublisher) sendBatch(ctx context.Context, prod *txnProducer, tp topicPartition, set []byte) (err error, sent bool) {
	// The broker waits at most half the time left for the in-sync
	// replicas, as kafka-go's writer asks.
	wait := p.timeout / 2
	if d, ok := ctx.Deadline(); ok {
		wait = max(time.Until(d)/2, time.Millisecond)
	}
	m, err := p.roundTrip(ctx, &rawproduce.Request{
		TransactionalID: prod.id,
		Acks:            int16(kafka.RequireAll),
		Timeout:         int32(min(wait, time.Duration(1<<31-1)*time.Millisecond) / time.Millisecond),
		Topics: []rawproduce.RequestTopic{{
			Topic: tp.topic,
			Partitions: []rawproduce.RequestPartition{{
				Partition: int32(tp.partition),
				RecordSet: protocol.RawRecordSet{Reader: bytes.NewReader(set)},
			}},
		}},
	})
	if err != nil {
		var re *rawproduce.Error // no route to the leader: never sent
		return err, !errors.As(err, &re)
	}
	r, ok := m.(*produce.Response)
	if !ok || len(r.Topics) == 0 || len(r.Topics[0].Partitions) == 0 {
		return fmt.Errorf("unexpected response %T", m), true
	}
	rp := r.Topics[0].Partitions[0]
	msg := rp.ErrorMessage
	return kafkaError(rp.ErrorCode, &msg), true
}
