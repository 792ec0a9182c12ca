package franz

import (
	"context"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
)

// MaxPollRecords is the most records a Consumer takes from one poll. The
// group cannot rebalance while they are handled (kgo.BlockRebalanceOnPoll),
// so it bounds how long a rebalance waits for this member.
const MaxPollRecords = 100

// HandlerFunc applies a record's effect in tx, as inbox.HandlerFunc does.
type HandlerFunc func(tx *gorm.DB, r *kgo.Record) error

// Consumer runs a handler over a consumer group's records with the
// contract of inbox.Consumer. A member thrown out of its group drops the
// rest of its poll and rejoins; the records redelivered are duplicates.
type Consumer struct {
	c  *inbox.Consumer
	cl *kgo.Client
	r  *reader
}

// NewConsumer returns a Consumer whose new client is built from opts (the
// brokers, kgo.ConsumerGroup and its topics), reading with read_committed
// unless opts say otherwise; it always sets kgo.DisableAutoCommit and
// kgo.BlockRebalanceOnPoll. With copts.DeadLetterTopic and no DeadLetter
// writer, the client produces the dead letters. Close it after Run returned.
func NewConsumer(ib *inbox.Inbox, handler string, fn HandlerFunc, copts inbox.ConsumerOptions, opts ...kgo.Opt) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("franz: NewConsumer: nil HandlerFunc")
	}
	opts = append([]kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}, opts...)
	opts = append(opts, kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("franz: NewConsumer: %w", err)
	}
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		cl.Close()
		return nil, errors.New("franz: NewConsumer: no kgo.ConsumerGroup: offsets cannot be committed")
	}
	r := &reader{cl: cl}
	if copts.DeadLetterTopic != "" && copts.DeadLetter == nil {
		copts.DeadLetter = writer{cl: cl}
	}
	c, err := inbox.NewConsumer(ib, r, handler, func(tx *gorm.DB, m kafka.Message) error {
		return fn(tx, m.WriterData.(*kgo.Record))
	}, copts)
	if err != nil {
		cl.Close()
		return nil, err
	}
	return &Consumer{c: c, cl: cl, r: r}, nil
}

// Run consumes until ctx is done and returns nil then, or an error as
// inbox.Consumer.Run does (kgo.ErrClientClosed after Close). Run must not
// be called twice at once.
func (c *Consumer) Run(ctx context.Context) error { return c.c.Run(ctx) }

// Client returns the Consumer's client, for its metrics and hooks; do not
// poll or commit with it.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Close leaves the group and closes the client, after Run returned.
func (c *Consumer) Close() {
	c.cl.AllowRebalance()
	c.cl.Close()
}

// reader is an inbox.Reader over a group client that blocks rebalances
// while a poll's records are handled; each message holds its *kgo.Record in
// WriterData.
type reader struct {
	cl     *kgo.Client
	buf    []*kgo.Record
	polled bool // a poll's records are being handled: the rebalance is blocked
}

var _ inbox.MarkerFreeReader = (*reader)(nil)

// ReturnsNoTransactionMarkers: franz-go drops control records.
func (*reader) ReturnsNoTransactionMarkers() bool { return true }

func (r *reader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	for len(r.buf) == 0 {
		if r.polled {
			r.cl.AllowRebalance()
			r.polled = false
		}
		fs := r.cl.PollRecords(ctx, MaxPollRecords)
		r.polled = true
		if fs.IsClientClosed() {
			return kafka.Message{}, kgo.ErrClientClosed
		}
		if err := ctx.Err(); err != nil {
			return kafka.Message{}, err
		}
		// Fetch errors are the client's to retry; the records are good.
		if l, ok := r.cl.OptValue(kgo.WithLogger).(kgo.Logger); ok {
			fs.EachError(func(topic string, partition int32, err error) {
				l.Log(kgo.LogLevelWarn, "inbox: fetch error", "topic", topic, "partition", partition, "err", err)
			})
		}
		r.buf = fs.Records()
	}
	rec := r.buf[0]
	r.buf[0] = nil
	r.buf = r.buf[1:]
	return message(rec), nil
}

// CommitMessages commits the offsets past msgs. A commit refused because
// this member left the group is dropped, with the rest of the poll, so that
// the client may rejoin.
func (r *reader) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = m.WriterData.(*kgo.Record)
	}
	err := r.cl.CommitRecords(ctx, recs...)
	if !outOfGroup(err) {
		return err
	}
	if l, ok := r.cl.OptValue(kgo.WithLogger).(kgo.Logger); ok {
		l.Log(kgo.LogLevelWarn, "inbox: this member left the group; dropping its polled records and rejoining (they are redelivered, and the handled ones skipped as duplicates)", "records", len(r.buf), "err", err)
	}
	clear(r.buf)
	r.buf = nil
	if r.polled {
		r.cl.AllowRebalance()
		r.polled = false
	}
	return nil
}

// outOfGroup reports whether err, from a commit, says that this member is
// no longer in the group's current generation.
func outOfGroup(err error) bool {
	return errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.IllegalGeneration) ||
		errors.Is(err, kerr.FencedInstanceID) || errors.Is(err, kerr.RebalanceInProgress)
}

// message returns rec as Handle reads it, rec itself in WriterData.
func message(rec *kgo.Record) kafka.Message {
	m := kafka.Message{
		Topic:      rec.Topic,
		Partition:  int(rec.Partition),
		Offset:     rec.Offset,
		Key:        rec.Key,
		Value:      rec.Value,
		Time:       rec.Timestamp,
		WriterData: rec,
	}
	if len(rec.Headers) > 0 {
		m.Headers = make([]kafka.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			m.Headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
		}
	}
	return m
}

// writer produces dead letters with the Consumer's client.
type writer struct{ cl *kgo.Client }

func (w writer) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		rec := &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: make([]kgo.RecordHeader, len(m.Headers))}
		for j, h := range m.Headers {
			rec.Headers[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
		recs[i] = rec
	}
	return w.cl.ProduceSync(ctx, recs...).FirstErr()
}
