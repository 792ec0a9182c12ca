package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
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
	txnRetryFirst = time.Millisecond
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

// produceAll sends the rows of every partition of a transaction in rounds:
// round k carries the k-th chunk (at most batchBytes and maxRecords) of
// every partition that has one, as one produce request per leader broker,
// all leaders at once. A partition stops at its first failure. One request
// per broker matters beyond saving round trips: a partition leader verifies
// a transaction's first batch on it with the coordinator, and concurrent
// verifications of one transactional id on one broker fail all but one
// (NOT_ENOUGH_REPLICAS, "Unable to verify the partition has been added to
// the transaction", NETWORK_EXCEPTION).
func (p *KafkaPublisher) produceAll(ctx context.Context, prod *txnProducer, rows []row, parts []topicPartition, idx map[topicPartition][]int) []partitionOutcome {
	out := make([]partitionOutcome, len(parts))
	chunks := make([][][]int, len(parts))
	for i, tp := range parts {
		out[i] = partitionOutcome{tp: tp, seq: prod.seq[tp]}
		chunks[i] = p.chunk(rows, idx[tp])
	}
	leaders := p.leaders(ctx, parts)
	ts := p.txn.now().UnixMilli()
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
			set, err := encodeRecordBatch(producerBatch{
				producerID: prod.pid, producerEpoch: prod.epoch, baseSequence: o.seq, transactional: true,
			}, ts, p.w.Compression, msgs)
			if err != nil {
				o.failed, o.err = c, unpublishable(err)
				continue
			}
			leader := leaders[o.tp]
			if _, ok := groups[leader]; !ok {
				order = append(order, leader)
			}
			groups[leader] = append(groups[leader], &produceItem{out: o, rows: c, set: set})
		}
		if len(order) == 0 {
			break
		}
		var wg sync.WaitGroup
		for _, leader := range order {
			items := groups[leader]
			if leader < 0 { // leader unknown: each alone
				for _, it := range items {
					wg.Add(1)
					go func() {
						defer wg.Done()
						p.sendItems(ctx, prod, []*produceItem{it})
					}()
				}
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.sendItems(ctx, prod, items)
			}()
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
		if errors.Is(out[i].err, ErrFenced) && prod.fenced == nil {
			prod.fenced = p.fencedError(prod, out[i].err)
			out[i].err = prod.fenced
		}
	}
	return out
}

// chunk splits a partition's rows (indexes into rows, in order) into the
// rows of successive requests: at most maxRecords each, and at most
// batchBytes unless a single row is larger.
func (p *KafkaPublisher) chunk(rows []row, idx []int) [][]int {
	var out [][]int
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
		out = append(out, idx[start:end])
		start = end
	}
	return out
}

// leaders returns the leader broker of each partition from the transport's
// (cached) metadata; -1 where it does not know.
func (p *KafkaPublisher) leaders(ctx context.Context, parts []topicPartition) map[topicPartition]int32 {
	out := make(map[topicPartition]int32, len(parts))
	var topics []string
	for _, tp := range parts {
		out[tp] = -1
		if !slices.Contains(topics, tp.topic) {
			topics = append(topics, tp.topic)
		}
	}
	res, err := p.roundTrip(ctx, &metadataAPI.Request{TopicNames: topics})
	if err != nil {
		return out
	}
	meta, ok := res.(*metadataAPI.Response)
	if !ok {
		return out
	}
	for _, t := range meta.Topics {
		for _, pt := range t.Partitions {
			tp := topicPartition{t.Name, int(pt.PartitionIndex)}
			if _, ok := out[tp]; ok && pt.ErrorCode == 0 {
				out[tp] = pt.LeaderID
			}
		}
	}
	return out
}

// produceItem is one partition's record batch in a produce request.
type produceItem struct {
	out  *partitionOutcome
	rows []int
	set  []byte // the request's record set: size prefix, batch

	done bool  // settled: appended (err nil) or failed
	err  error // the failure, or the latest attempt's error while pending
	// maybeAppended: an attempt may have been appended (cut off, or
	// answered REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND or
	// NETWORK_EXCEPTION); unknown: the item failed so.
	maybeAppended bool
	unknown       bool
}

// sendItems sends items (partitions led by one broker) in one produce
// request and records each one's outcome. A failure that leaves a batch
// appended or not, as the broker's idempotence decides (a network error,
// REQUEST_TIMED_OUT, NETWORK_EXCEPTION, NOT_ENOUGH_REPLICAS,
// CONCURRENT_TRANSACTIONS), is retried with the same bytes and sequence
// number until ctx ends: the broker appends a producer's batch once and
// answers a resent one as the first. When the transport finds no common
// leader for the partitions (its metadata moved), they go one by one.
func (p *KafkaPublisher) sendItems(ctx context.Context, prod *txnProducer, items []*produceItem) {
	wait := txnRetryFirst
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
				go func() {
					defer wg.Done()
					p.sendItems(ctx, prod, []*produceItem{it})
				}()
			}
			wg.Wait()
			return
		}
		if !retry {
			continue // every pending item is done
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			for _, it := range items {
				if !it.done {
					it.done, it.unknown = true, it.maybeAppended
					it.err = fmt.Errorf("%w (last error: %w)", context.Cause(ctx), it.err)
				}
			}
			return
		case <-t.C:
		}
		wait = min(2*wait, txnRetryMax)
	}
}

// sendOnce sends pending in one request and settles the items it can;
// retry reports items left to resend, split a request the transport could
// not route as one (no common leader).
func (p *KafkaPublisher) sendOnce(ctx context.Context, prod *txnProducer, pending []*produceItem) (retry, split bool) {
	// The broker waits at most half the time left for the in-sync
	// replicas, as kafka-go's writer asks.
	wait := p.timeout / 2
	if d, ok := ctx.Deadline(); ok {
		wait = max(time.Until(d)/2, time.Millisecond)
	}
	req := &rawproduce.Request{
		TransactionalID: prod.id,
		Acks:            int16(kafka.RequireAll),
		Timeout:         int32(min(wait, time.Duration(1<<31-1)*time.Millisecond) / time.Millisecond),
	}
	byTopic := map[string]int{}
	for _, it := range pending {
		i, ok := byTopic[it.out.tp.topic]
		if !ok {
			i = len(req.Topics)
			byTopic[it.out.tp.topic] = i
			req.Topics = append(req.Topics, rawproduce.RequestTopic{Topic: it.out.tp.topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rawproduce.RequestPartition{
			Partition: int32(it.out.tp.partition),
			RecordSet: protocol.RawRecordSet{Reader: bytes.NewReader(it.set)},
		})
	}
	m, err := p.roundTrip(ctx, req)
	if err != nil {
		var re *rawproduce.Error // no route: never sent
		if errors.As(err, &re) && len(pending) > 1 {
			return false, true
		}
		sent := !errors.As(err, &re)
		for _, it := range pending {
			settle(it, err, false, sent)
		}
		return !pending[0].done, false
	}
	r, ok := m.(*produce.Response)
	if !ok {
		err := fmt.Errorf("unexpected response %T", m)
		for _, it := range pending {
			settle(it, err, false, true)
		}
		return !pending[0].done, false
	}
	codes := map[topicPartition]error{}
	for _, t := range r.Topics {
		for _, rp := range t.Partitions {
			msg := rp.ErrorMessage
			codes[topicPartition{t.Topic, int(rp.Partition)}] = kafkaError(rp.ErrorCode, &msg)
		}
	}
	for _, it := range pending {
		e, ok := codes[it.out.tp]
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
	case producerFenced(e), errors.Is(e, kafka.InvalidTransactionState):
		// INVALID_TXN_STATE: the partition is not in an ongoing
		// transaction of this epoch (the coordinator aborted it).
		it.done, it.err = true, fmt.Errorf("produce: %w: %w", e, ErrFenced)
	case errors.Is(e, kafka.OutOfOrderSequenceNumber), errors.Is(e, kafka.DuplicateSequenceNumber), errors.Is(e, kafka.UnknownProducerId):
		it.done, it.err, it.unknown = true, fmt.Errorf("produce: %w", e), true
	case produceRetriable(e):
		it.err = fmt.Errorf("produce: %w", e) // resent
		it.maybeAppended = it.maybeAppended || uncertain
	default:
		it.done, it.err = true, fmt.Errorf("produce: %w", e)
		it.unknown = it.maybeAppended || uncertain
	}
}

// produceRetriable reports whether a produce error is resent in place (see
// sendItems).
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
