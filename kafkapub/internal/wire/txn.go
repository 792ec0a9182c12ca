package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"
)

// The transactional mode's requests, on the writer's transport, which looks
// the transaction coordinator up before each; a coordinator that moved
// answers NOT_COORDINATOR and the request is sent again.

// Backoff of the requests retried inside a call (coordinate's, and the
// publisher's resent produce requests).
const (
	RetryFirst = time.Millisecond
	RetryMax   = 250 * time.Millisecond
)

// CoordinatorRetriable reports whether a coordinator's answer (or the
// transport's error) asks for the same request again: a transaction still
// completing (CONCURRENT_TRANSACTIONS), a coordinator moving, loading or
// unreachable, a network error.
func CoordinatorRetriable(err error) bool {
	return retriable(err, kafka.ConcurrentTransactions,
		kafka.NotCoordinatorForGroup,       // NOT_COORDINATOR
		kafka.GroupCoordinatorNotAvailable, // COORDINATOR_NOT_AVAILABLE
		kafka.GroupLoadInProgress,          // COORDINATOR_LOAD_IN_PROGRESS
		kafka.TransactionCoordinatorFenced, kafka.BrokerNotAvailable, kafka.RequestTimedOut, kafka.NetworkException)
}

// ProducerFenced reports whether a broker error says that the producer's
// epoch is no longer the transactional id's: a newer producer initialised
// it, or the coordinator aborted its transaction and bumped the epoch.
func ProducerFenced(err error) bool {
	return Is(err, kafka.ProducerFenced, kafka.InvalidProducerEpoch, kafka.InvalidProducerIDMapping)
}

// ProduceRetriable reports whether a produce error may be resent in place,
// with the same bytes and sequence number (the broker appends a producer's
// batch once): a network error, REQUEST_TIMED_OUT, NETWORK_EXCEPTION,
// NOT_ENOUGH_REPLICAS(_AFTER_APPEND), CONCURRENT_TRANSACTIONS.
func ProduceRetriable(err error) bool {
	return retriable(err, kafka.RequestTimedOut, kafka.NetworkException, kafka.NotEnoughReplicas, kafka.NotEnoughReplicasAfterAppend, kafka.ConcurrentTransactions)
}

// Is reports whether err matches one of codes.
func Is(err error, codes ...kafka.Error) bool {
	return slices.ContainsFunc(codes, func(c kafka.Error) bool { return errors.Is(err, c) })
}

// retriable reports whether err is a network error or its first Kafka
// error is one of codes.
func retriable(err error, codes ...kafka.Error) bool {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	return slices.Contains(codes, ke)
}

// coordinate runs do until it succeeds, fails with an error that
// CoordinatorRetriable does not retry, or ctx ends (then the error wraps
// ctx's cause and the last error).
func coordinate(ctx context.Context, do func(context.Context) error) error {
	for wait := RetryFirst; ; {
		err := do(ctx)
		switch {
		case err == nil:
			return nil
		case ctx.Err() == nil && !CoordinatorRetriable(err):
			return err
		case ctx.Err() != nil || !Backoff(ctx, &wait):
			return fmt.Errorf("%w (last error: %w)", context.Cause(ctx), err)
		}
	}
}

// Backoff waits *wait, then doubles it up to RetryMax, and reports whether
// it did before ctx ended.
func Backoff(ctx context.Context, wait *time.Duration) bool {
	t := time.NewTimer(*wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		*wait = min(2**wait, RetryMax)
		return true
	}
}

// InitProducerID initialises transactional id txid with the transaction
// timeout txnTimeout: with pid and epoch -1 a new epoch (fencing every older
// producer of txid); with the producer's current pid and epoch, an epoch
// bump that the coordinator refuses (PRODUCER_FENCED) when they are no
// longer current (ProducerFenced then reports the error).
func (c Client) InitProducerID(ctx context.Context, txid string, txnTimeout time.Duration, pid int64, epoch int16) (int64, int16, error) {
	var res *initproducerid.Response
	err := coordinate(ctx, func(ctx context.Context) error {
		m, err := c.RoundTrip(ctx, &initproducerid.Request{
			TransactionalID:      txid,
			TransactionTimeoutMs: int32(txnTimeout / time.Millisecond),
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
		return Error(r.ErrorCode, nil)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("InitProducerId: %w", err)
	}
	return res.ProducerID, res.ProducerEpoch, nil
}

// AddPartitionsToTxn adds parts to the transaction of producer (txid, pid,
// epoch). A partition the coordinator refuses (unknown, not authorised) is
// returned in failed, with an error naming the first of them: none was
// added. An error with failed nil is the whole request's (ProducerFenced
// reports a fenced producer's).
func (c Client) AddPartitionsToTxn(ctx context.Context, txid string, pid int64, epoch int16, parts []TopicPartition) (failed []TopicPartition, err error) {
	req := &addpartitionstotxn.Request{
		TransactionalID: txid,
		ProducerID:      pid,
		ProducerEpoch:   epoch,
	}
	for _, tp := range parts {
		i := slices.IndexFunc(req.Topics, func(t addpartitionstotxn.RequestTopic) bool { return t.Name == tp.Topic })
		if i < 0 {
			i = len(req.Topics)
			req.Topics = append(req.Topics, addpartitionstotxn.RequestTopic{Name: tp.Topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, int32(tp.Partition))
	}
	var partErr error
	err = coordinate(ctx, func(ctx context.Context) error {
		failed, partErr = nil, nil
		m, err := c.RoundTrip(ctx, req)
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
				e := Error(rp.ErrorCode, nil)
				switch {
				case e == nil, errors.Is(e, kafka.Error(55)): // OPERATION_NOT_ATTEMPTED
				case CoordinatorRetriable(e), ProducerFenced(e):
					return e // the whole request's answer
				default:
					failed = append(failed, TopicPartition{t.Name, int(rp.PartitionIndex)})
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
	case err != nil:
		return nil, fmt.Errorf("AddPartitionsToTxn: %w", err)
	case partErr != nil:
		return failed, fmt.Errorf("AddPartitionsToTxn: %w", partErr)
	}
	return nil, nil
}

// EndTxn ends the transaction of producer (txid, pid, epoch): commit or
// abort. answered is false when no final answer arrived (the context ended,
// or the coordinator's last answer asked for the request again), so the
// coordinator may or may not have applied it; err is the coordinator's
// error or the transport's.
func (c Client) EndTxn(ctx context.Context, txid string, pid int64, epoch int16, commit bool) (answered bool, err error) {
	err = coordinate(ctx, func(ctx context.Context) error {
		m, err := c.RoundTrip(ctx, &endtxn.Request{
			TransactionalID: txid,
			ProducerID:      pid,
			ProducerEpoch:   epoch,
			Committed:       commit,
		})
		if err != nil {
			return err
		}
		r, ok := m.(*endtxn.Response)
		if !ok {
			return fmt.Errorf("unexpected response %T", m)
		}
		answered = !CoordinatorRetriable(Error(r.ErrorCode, nil))
		return Error(r.ErrorCode, nil)
	})
	return answered, err
}

// RecordSet is one partition's record batch (EncodeRecordBatch's output,
// size prefix included) in a produce request.
type RecordSet struct {
	TopicPartition
	Set []byte
}

// Produce sends sets in one produce request of transactional id txid, with
// acks=all and timeout as the broker's bound on waiting for the in-sync
// replicas. It returns each partition's answer (nil: appended); a partition
// absent from answers got none. When the request failed as a whole, err is
// its error and sent reports whether it may have reached the broker (false
// when the transport found no broker to route it to, e.g. no common leader
// for its partitions).
func (c Client) Produce(ctx context.Context, txid string, timeout time.Duration, sets []RecordSet) (answers map[TopicPartition]error, sent bool, err error) {
	req := &rawproduce.Request{
		TransactionalID: txid,
		Acks:            int16(kafka.RequireAll),
		Timeout:         int32(min(timeout, time.Duration(1<<31-1)*time.Millisecond) / time.Millisecond),
	}
	for _, s := range sets {
		i := slices.IndexFunc(req.Topics, func(t rawproduce.RequestTopic) bool { return t.Topic == s.Topic })
		if i < 0 {
			i = len(req.Topics)
			req.Topics = append(req.Topics, rawproduce.RequestTopic{Topic: s.Topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rawproduce.RequestPartition{
			Partition: int32(s.Partition),
			RecordSet: protocol.RawRecordSet{Reader: bytes.NewReader(s.Set)},
		})
	}
	m, err := c.RoundTrip(ctx, req)
	if err != nil {
		var re *rawproduce.Error // no route: never sent
		return nil, !errors.As(err, &re), err
	}
	r, ok := m.(*produce.Response)
	if !ok {
		return nil, true, fmt.Errorf("unexpected response %T", m)
	}
	answers = map[TopicPartition]error{}
	for _, t := range r.Topics {
		for _, rp := range t.Partitions {
			msg := rp.ErrorMessage
			answers[TopicPartition{t.Topic, int(rp.Partition)}] = Error(rp.ErrorCode, &msg)
		}
	}
	return answers, true, nil
}
