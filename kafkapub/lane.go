package kafkapub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox/internal/failpoint"
	"github.com/gorm-outbox/outbox/kafkapub/internal/wire"
)

// Lanes: the rows that concurrent calls place on one partition are sent by
// the partition's lane's sender, one produce request at a time, in order of
// arrival, the rows of the calls that arrived while a request was in flight
// together in the next (see Publisher). So a later call never overtakes a
// request still in flight, even one whose caller stopped waiting. A lane
// lives while its sender does, so that idle partitions (dynamic topic
// names) leave nothing behind.

// lane is one partition's queue of calls.
type lane struct {
	key     topicPartition
	mu      sync.Mutex // guards gone, waiting, the turns' state and their rows' outcomes
	gone    bool       // its sender removed it from the publisher's lanes
	waiting []*turn    // calls not yet taken by the sender, in order of arrival
}

// turn is one call's rows on a partition: indexes into rows, in submission
// order. The sender writes the rows' outcomes (sent, acked, err) under the
// lane's mutex until it closes done, and never once the caller left.
type turn struct {
	ctx     context.Context
	rows    []row
	idx     []int
	next    int  // idx[next:] are not sent yet
	stopped bool // a row failed, or the caller left: no more rows are sent
	left    bool // the caller stopped waiting (its ctx ended)
	done    chan struct{}
}

// part is a turn's rows in one produce request.
type part struct {
	t   *turn
	idx []int
}

// lane returns key's lane, locked, starting it and its sender when the
// partition has none.
func (p *Publisher) lane(key topicPartition) *lane {
	for {
		p.mu.Lock()
		l := p.lanes[key]
		if l == nil {
			l = &lane{key: key}
			l.mu.Lock() // the sender waits for the caller's turn
			p.lanes[key] = l
			p.mu.Unlock()
			p.wg.Add(1) // the calling Publish holds one: Close is not waiting yet
			go p.serve(l)
			return l
		}
		p.mu.Unlock()
		l.mu.Lock()
		if !l.gone {
			return l
		}
		l.mu.Unlock() // its sender removed it after the look-up: take the next
	}
}

// publishPartition sends one partition's rows (indexes into rows, in
// submission order) through the partition's lane and waits until they are
// all acknowledged, one of them failed (it gets the error, and no later row
// is sent), or ctx ends (a request in flight then still ends, and its rows
// may land).
func (p *Publisher) publishPartition(ctx context.Context, key topicPartition, rows []row, idx []int) {
	t := &turn{ctx: ctx, rows: rows, idx: idx, done: make(chan struct{})}
	l := p.lane(key)
	l.waiting = append(l.waiting, t)
	l.mu.Unlock()
	select {
	case <-t.done:
	case <-ctx.Done():
		l.mu.Lock()
		t.left, t.stopped = true, true
		l.mu.Unlock()
	}
}

// serve is a lane's sender: it sends the rows of the waiting calls, those
// waiting together in shared requests, until none waits, and removes the
// lane before its last calls return.
func (p *Publisher) serve(l *lane) {
	defer p.wg.Done()
	l.mu.Lock()
	for len(l.waiting) > 0 {
		ts := l.waiting
		l.waiting = nil
		l.mu.Unlock()
		for p.sendRequest(l, ts) {
		}
		l.mu.Lock()
		if len(l.waiting) == 0 {
			p.mu.Lock()
			delete(p.lanes, l.key)
			p.mu.Unlock()
			l.gone = true
		}
		for _, t := range ts {
			close(t.done)
		}
	}
	l.mu.Unlock()
}

// sendRequest sends the next request of turns ts, records its outcome and
// reports whether it sent one.
func (p *Publisher) sendRequest(l *lane, ts []*turn) bool {
	l.mu.Lock()
	parts, n := p.pack(ts)
	msgs := make([]kafka.Message, 0, n)
	for _, pt := range parts {
		for _, i := range pt.idx {
			pt.t.rows[i].sent = true
			msgs = append(msgs, pt.t.rows[i].msg)
		}
	}
	l.mu.Unlock()
	if n == 0 {
		return false
	}
	err := p.write(parts[0].t.ctx, msgs)

	l.mu.Lock()
	switch {
	case err == nil:
		for _, pt := range parts {
			if !pt.t.left {
				for _, i := range pt.idx {
					pt.t.rows[i].acked = true
				}
			}
		}
	case n > 1 && recordError(err):
		// One record's fault, nothing appended: each call's rows are sent
		// again, in halves down to the culprit, so that the rows before it
		// are still acknowledged.
		l.mu.Unlock()
		for _, pt := range parts {
			if len(parts) == 1 {
				p.split(l, pt.t, pt.idx) // as a whole it just failed
			} else {
				p.resend(l, pt.t, pt.idx)
			}
		}
		return true
	default:
		for _, pt := range parts {
			if !pt.t.left {
				pt.t.rows[pt.idx[0]].err = classify(err, n == 1)
				pt.t.stopped = true
			}
		}
	}
	l.mu.Unlock()
	return true
}

// resend sends idx, rows of turn t that failed in a shared request for one
// record's fault, as one request, then in halves while the broker rejects
// them so (split): the culprit gets the error and stops t. It reports
// whether every row was acknowledged.
func (p *Publisher) resend(l *lane, t *turn, idx []int) bool {
	l.mu.Lock()
	stopped := t.stopped
	l.mu.Unlock()
	if stopped {
		return false
	}
	msgs := make([]kafka.Message, len(idx))
	for j, i := range idx {
		msgs[j] = t.rows[i].msg
	}
	err := p.write(t.ctx, msgs)
	l.mu.Lock()
	left := t.left
	switch {
	case left:
	case err == nil:
		for _, i := range idx {
			t.rows[i].acked = true
		}
	case len(idx) > 1 && recordError(err):
		l.mu.Unlock()
		return p.split(l, t, idx)
	default:
		t.rows[idx[0]].err = classify(err, len(idx) == 1)
		t.stopped = true
	}
	l.mu.Unlock()
	return !left && err == nil
}

// split resends idx in halves, in order (see resend).
func (p *Publisher) split(l *lane, t *turn, idx []int) bool {
	half := len(idx) / 2
	return p.resend(l, t, idx[:half]) && p.resend(l, t, idx[half:])
}

// pack takes the next request's rows from turns ts, in order: each turn's
// unsent rows while the request holds fewer than MaxBatchRecords rows and
// BatchBytes bytes, skipping turns that stopped or whose ctx ended. A row
// larger than BatchBytes fails (and stops its turn) once the rows before it
// were sent. It returns the request's parts and rows; called with l.mu held.
func (p *Publisher) pack(ts []*turn) (parts []part, n int) {
	var size int64
	for _, t := range ts {
		if !t.stopped && t.ctx.Err() != nil {
			t.stopped = true // nobody waits for its rows: none is sent
		}
		first := t.next
		for !t.stopped && t.next < len(t.idx) && n < p.maxRecords {
			i := t.idx[t.next]
			rs := int64(wire.RecordSize(&t.rows[i].msg))
			if rs > p.batchBytes {
				if t.next > first {
					break // sent first; the row fails once they are acknowledged
				}
				t.rows[i].err = p.tooLarge(rs)
				t.stopped = true
				break
			}
			if size+rs > p.batchBytes {
				break
			}
			size += rs
			n++
			t.next++
		}
		if t.next > first {
			parts = append(parts, part{t, t.idx[first:t.next]})
		}
		if t.next < len(t.idx) && !t.stopped {
			break // the request is full: later turns wait for the next
		}
	}
	return parts, n
}

// write sends msgs, one partition's rows, in one produce request, as the
// writer's partition writer sends a batch: kafka-go's Client.Produce on the
// writer's Addr and Transport, with its RequiredAcks (all) and Compression,
// its WriteTimeout as the bound of the request (one attempt), its Logger,
// ErrorLogger and Completion told of the write. Not Writer.WriteMessages,
// whose batching (a timer, goroutines, a BatchSize slice per call) costs a
// publish far more than a lane that already holds one request's rows. The
// callers' contexts do not cancel the write: a request in flight stays one
// unit that the partition's next request cannot overtake.
func (p *Publisher) write(ctx context.Context, msgs []kafka.Message) error {
	w, topic, partition := p.w, msgs[0].Topic, msgs[0].Partition
	if w.Logger != nil {
		w.Logger.Printf("writing %d messages to %s (partition: %d)", len(msgs), topic, partition)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.WriteTimeout)
	c := &kafka.Client{Addr: w.Addr, Transport: w.Transport, Timeout: w.WriteTimeout}
	res, err := c.Produce(wctx, &kafka.ProduceRequest{
		Topic:        topic,
		Partition:    partition,
		RequiredAcks: w.RequiredAcks,
		Compression:  w.Compression,
		Records:      &records{msgs: msgs},
	})
	cancel()
	if res != nil {
		err = res.Error
	}
	if err != nil && w.ErrorLogger != nil {
		w.ErrorLogger.Printf("error writing messages to %s (partition %d, attempt 0): %s", topic, partition, err)
	}
	if w.Completion != nil {
		w.Completion(msgs, err)
	}
	failpoint.Inject("relay/during-publish")
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		// The write's deadline (WriteTimeout, at most PublishTimeout) fired:
		// the error names the timeout and wraps context.DeadlineExceeded.
		return fmt.Errorf("no answer from the broker within Config.PublishTimeout (%v): %w (%w)", p.timeout, context.DeadlineExceeded, err)
	}
	return err
}

// records reads msgs as a produce request's records, as the writer's own
// (unexported) reader does: a nil key or value is null, and one reader
// serves every record's key and value in turn, where kafka.NewRecordReader
// of kafka.NewBytes would allocate two per record.
type records struct {
	msgs  []kafka.Message
	next  int
	rec   kafka.Record
	key   bytesRecord
	value bytesRecord
}

func (r *records) ReadRecord() (*kafka.Record, error) {
	if r.next >= len(r.msgs) {
		return nil, io.EOF
	}
	m := &r.msgs[r.next]
	r.next++
	r.rec = kafka.Record{Time: m.Time, Headers: m.Headers}
	if m.Key != nil {
		r.key.Reset(m.Key)
		r.rec.Key = &r.key
	}
	if m.Value != nil {
		r.value.Reset(m.Value)
		r.rec.Value = &r.value
	}
	return &r.rec, nil
}

// bytesRecord is a record's key or value.
type bytesRecord struct{ bytes.Reader }

func (*bytesRecord) Close() error { return nil }
