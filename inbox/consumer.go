package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/internal/failpoint"
)

// Defaults of ConsumerOptions. A zero ConsumerOptions field takes the
// matching default.
const (
	// DefaultRetryBackoff is the first wait after a failed attempt.
	DefaultRetryBackoff = 500 * time.Millisecond
	// DefaultMaxRetryBackoff caps the doubling waits between attempts.
	DefaultMaxRetryBackoff = 30 * time.Second
	// DefaultMaxAttempts is the number of failed attempts after which a
	// Consumer with a DeadLetter writer dead-letters a message.
	DefaultMaxAttempts = 5
	// DefaultCommitTimeout bounds the offset commit that follows a
	// committed transaction once Run's context is done.
	DefaultCommitTimeout = 5 * time.Second
)

// Headers a Consumer adds to a dead-lettered record, after the original
// record's headers (its message id among them, so that a dead-letter
// consumer can deduplicate too).
const (
	// HeaderError holds the last attempt's error text (at most 4 KiB).
	HeaderError = "x-inbox-error"
	// HeaderHandler holds the handler name.
	HeaderHandler = "x-inbox-handler"
	// HeaderAttempts holds the number of failed attempts, in decimal.
	HeaderAttempts = "x-inbox-attempts"
	// HeaderTopic, HeaderPartition and HeaderOffset hold the original
	// record's position (partition and offset in decimal).
	HeaderTopic     = "x-inbox-topic"
	HeaderPartition = "x-inbox-partition"
	HeaderOffset    = "x-inbox-offset"
)

// maxErrorHeader bounds the HeaderError value.
const maxErrorHeader = 4 << 10

// Reader is what a Consumer reads: a *kafka.Reader with a GroupID, whose
// FetchMessage does not commit and whose CommitMessages commits the offset
// after a message.
type Reader interface {
	// FetchMessage returns the next record without committing its offset,
	// blocking until one arrives or ctx is done.
	FetchMessage(ctx context.Context) (kafka.Message, error)
	// CommitMessages commits the group's offsets past msgs.
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Writer is where a Consumer dead-letters records: a *kafka.Writer.
type Writer interface {
	// WriteMessages returns once msgs are written (acknowledged, with the
	// writer's RequiredAcks), or with an error.
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

var (
	_ Reader = (*kafka.Reader)(nil)
	_ Writer = (*kafka.Writer)(nil)
)

// MarkerFreeReader is implemented by a Reader whose client never returns
// transaction markers (franz-go's, which drops control records itself). A
// Consumer then handles every record it fetches; with any other Reader it
// skips the records shaped like a transaction marker (see Consumer).
type MarkerFreeReader interface {
	Reader
	// ReturnsNoTransactionMarkers reports whether FetchMessage never
	// returns a transaction marker.
	ReturnsNoTransactionMarkers() bool
}

// HandlerFunc applies a message's effect in tx, the transaction that
// records its id. tx is bound to the Consumer's context
// (tx.Statement.Context). An error rolls the transaction back and makes the
// Consumer try the message again.
type HandlerFunc func(tx *gorm.DB, m kafka.Message) error

// ConsumerOptions configures a Consumer. A zero ConsumerOptions consists
// entirely of default values: retry every failed message until it
// succeeds, with no dead-letter topic.
type ConsumerOptions struct {
	// RetryBackoff is the wait after a message's first failed attempt,
	// doubled after each further one (jittered to [d/2, d]) up to
	// MaxRetryBackoff. Zero means DefaultRetryBackoff (500ms); a negative
	// value fails NewConsumer.
	RetryBackoff time.Duration

	// MaxRetryBackoff caps the wait between two attempts. Zero means
	// DefaultMaxRetryBackoff (30s); a negative value, or one below
	// RetryBackoff, fails NewConsumer.
	MaxRetryBackoff time.Duration

	// DeadLetter, when non-nil, receives a message that failed MaxAttempts
	// times (a record without a usable message id at its first failure:
	// no retry can give it one): the original key, value and headers,
	// followed by HeaderError, HeaderHandler, HeaderAttempts, HeaderTopic,
	// HeaderPartition and HeaderOffset; its offset is committed once the
	// write succeeded (a failed write is retried with the same backoff,
	// never skipped). Only the message's own failures count as attempts
	// (the handler's errors), so a database that cannot begin, record or
	// commit (an outage) dead-letters nothing: it is retried forever. A
	// handler error counts unless the transaction's connection was lost
	// under it (the rollback that follows fails too: a dropped connection,
	// a killed session, a restarted server), which is an outage as well.
	// Nil means no dead-letter topic: a failing message is retried until
	// it succeeds, holding back the messages behind it (every partition of
	// the reader, as one Consumer handles one message at a time), and a
	// record without a usable message id stops Run with an error. A crash
	// between the write and the offset commit writes the message again on
	// restart.
	DeadLetter Writer

	// DeadLetterTopic is the topic of dead-lettered records. Empty means
	// the DeadLetter writer's own (kafka.Writer.Topic); a *kafka.Writer
	// must then have one, and with DeadLetterTopic set it must have none.
	DeadLetterTopic string

	// MaxAttempts is the number of failed attempts after which a message
	// goes to DeadLetter. Zero means DefaultMaxAttempts (5) with a
	// DeadLetter writer, and no limit without one; a negative value, or a
	// positive one without DeadLetter (it would skip the message), fails
	// NewConsumer.
	MaxAttempts int

	// CommitTimeout bounds the offset commit that follows a committed
	// transaction when Run's context is done meanwhile: the commit still
	// runs (on a context without ctx's cancellation) so that a stop does
	// not leave a processed message to be redelivered. Zero means
	// DefaultCommitTimeout (5s); a negative value fails NewConsumer.
	CommitTimeout time.Duration
}

// Validate reports every invalid field of o, each error naming its field.
func (o ConsumerOptions) Validate() error {
	_, err := o.withDefaults()
	return err
}

func (o ConsumerOptions) withDefaults() (ConsumerOptions, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("inbox: "+format, args...))
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"RetryBackoff", &o.RetryBackoff, DefaultRetryBackoff},
		{"MaxRetryBackoff", &o.MaxRetryBackoff, DefaultMaxRetryBackoff},
		{"CommitTimeout", &o.CommitTimeout, DefaultCommitTimeout},
	} {
		switch {
		case *d.v < 0:
			bad("ConsumerOptions.%s %v is negative", d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if o.MaxRetryBackoff < o.RetryBackoff {
		bad("ConsumerOptions.MaxRetryBackoff %v is below ConsumerOptions.RetryBackoff %v", o.MaxRetryBackoff, o.RetryBackoff)
	}
	switch {
	case o.MaxAttempts < 0:
		bad("ConsumerOptions.MaxAttempts %d is negative", o.MaxAttempts)
	case o.MaxAttempts > 0 && o.DeadLetter == nil:
		bad("ConsumerOptions.MaxAttempts %d needs ConsumerOptions.DeadLetter: a message is never skipped", o.MaxAttempts)
	case o.MaxAttempts == 0 && o.DeadLetter != nil:
		o.MaxAttempts = DefaultMaxAttempts
	}
	if w, ok := o.DeadLetter.(*kafka.Writer); ok {
		switch {
		case w.Topic == "" && o.DeadLetterTopic == "":
			bad("ConsumerOptions.DeadLetterTopic is empty and the DeadLetter writer has no Topic")
		case w.Topic != "" && o.DeadLetterTopic != "":
			bad("ConsumerOptions.DeadLetterTopic %q is set and the DeadLetter writer has Topic %q: set one", o.DeadLetterTopic, w.Topic)
		}
	}
	if o.DeadLetter == nil && o.DeadLetterTopic != "" {
		bad("ConsumerOptions.DeadLetterTopic %q needs ConsumerOptions.DeadLetter", o.DeadLetterTopic)
	}
	return o, errors.Join(errs...)
}

// Consumer runs a handler over a consumer group's records: fetch, Handle,
// and commit the offset only after the transaction committed. A record is
// never skipped: a failed one is retried with backoff (or dead-lettered,
// see ConsumerOptions.DeadLetter) before the next is fetched, a
// duplicate's offset is committed like a processed record's, and a crash
// anywhere leaves the record to be redelivered and, if its transaction
// had committed, skipped as a duplicate.
//
// A Consumer handles one record at a time, in the reader's order (each
// partition's records in offset order). Run several Consumers, each with
// its own Reader in the same group, to handle partitions in parallel.
//
// A record without a usable message id (ErrNoMessageID,
// ErrInvalidMessageID) cannot succeed on a retry: with a DeadLetter writer
// it is dead-lettered at its first failure; without one Run stops with an
// error wrapping the cause, its offset uncommitted (set
// Options.IDFromOffset to consume topics whose producers set no id).
//
// Transactional topics: kafka-go's Reader returns a transaction's commit
// or abort marker (a control record) as a message, and it does not drop
// the records of aborted transactions, even with IsolationLevel
// kafka.ReadCommitted. A Consumer skips the markers: a record without
// headers whose key is a marker's (4 bytes: version 0, type 0 for abort
// or 1 for commit) and whose value is a marker's (6 bytes, version 0) is
// never handled, counted or dead-lettered; its offset is committed. (The
// Reader exposes no control flag, so the shape decides: with
// IDFromOffset, a data record without headers shaped exactly so is
// skipped too.) Records of aborted transactions are handled like any
// other: see the README's "Consuming" for what that means on a topic the
// relay publishes with fenced publishing.
type Consumer struct {
	ib      *Inbox
	r       Reader
	handler string
	fn      HandlerFunc
	opts    ConsumerOptions
	log     *slog.Logger
	dlTopic string // the dead-letter topic, for logs
	markers bool   // skip the records shaped like transaction markers
}

// NewConsumer returns a Consumer that handles r's records with fn under the
// name handler, recording their ids in ib. r is typically a *kafka.Reader
// configured with a GroupID (one without fails: it cannot commit offsets);
// the Consumer owns neither r nor the DeadLetter writer: close them after
// Run returned.
func NewConsumer(ib *Inbox, r Reader, handler string, fn HandlerFunc, opts ConsumerOptions) (*Consumer, error) {
	var errs []error
	if ib == nil {
		errs = append(errs, errors.New("inbox: NewConsumer: nil *Inbox"))
	}
	if r == nil {
		errs = append(errs, errors.New("inbox: NewConsumer: nil Reader"))
	} else if kr, ok := r.(*kafka.Reader); ok && kr.Config().GroupID == "" {
		errs = append(errs, errors.New("inbox: NewConsumer: the kafka.Reader has no GroupID, so its offsets cannot be committed"))
	}
	if fn == nil {
		errs = append(errs, errors.New("inbox: NewConsumer: nil HandlerFunc"))
	}
	if err := checkHandler(handler); err != nil {
		errs = append(errs, err)
	}
	opts, err := opts.withDefaults()
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	log := ib.log.With("handler", handler)
	if kr, ok := r.(*kafka.Reader); ok {
		cfg := kr.Config()
		topics := cfg.GroupTopics
		if cfg.Topic != "" {
			topics = append([]string{cfg.Topic}, topics...)
		}
		log = log.With("group", cfg.GroupID, "topics", topics)
	}
	dlTopic := opts.DeadLetterTopic
	if w, ok := opts.DeadLetter.(*kafka.Writer); ok && dlTopic == "" {
		dlTopic = w.Topic
	}
	markers := true
	if mf, ok := r.(MarkerFreeReader); ok && mf.ReturnsNoTransactionMarkers() {
		markers = false
	}
	return &Consumer{ib: ib, r: r, handler: handler, fn: fn, opts: opts, log: log, dlTopic: dlTopic, markers: markers}, nil
}

// Run consumes until ctx is done and returns nil then, or returns the
// reader's error when FetchMessage fails otherwise (a closed reader
// returns io.EOF), or, without a DeadLetter writer, an error wrapping
// ErrNoMessageID or ErrInvalidMessageID for a record without a usable
// message id (its offset is not committed). A stop interrupts a transaction in flight (it is rolled
// back, and its record redelivered later) and a retry's wait; a record
// whose transaction committed still has its offset committed, within
// ConsumerOptions.CommitTimeout. Run must not be called twice at once.
func (c *Consumer) Run(ctx context.Context) error {
	if c.opts.DeadLetter != nil {
		c.log.Info("consumer starting", "dead_letter_topic", c.dlTopic, "max_attempts", c.opts.MaxAttempts)
	} else {
		c.log.Info("consumer starting; a failing record is retried until it succeeds (no dead-letter topic)")
	}
	defer c.log.Info("consumer stopped")
	for {
		m, err := c.r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("inbox: handler %s: fetch: %w", c.handler, err)
		}
		if c.markers && isTransactionMarker(m) {
			c.log.Debug("transaction marker skipped", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset)
		} else {
			ok, err := c.settle(ctx, m)
			if err != nil {
				return err
			}
			if !ok {
				return nil
			}
		}
		if !c.commit(ctx, m) {
			return nil
		}
	}
}

// isTransactionMarker reports whether m has the shape of a transaction
// marker as kafka-go's Reader returns it: no headers, the control record
// key of an abort or a commit (version 0, type 0 or 1) and the end-marker
// value (version 0, then the coordinator epoch).
func isTransactionMarker(m kafka.Message) bool {
	k, v := m.Key, m.Value
	return len(m.Headers) == 0 &&
		len(k) == 4 && k[0] == 0 && k[1] == 0 && k[2] == 0 && k[3] <= 1 &&
		len(v) == 6 && v[0] == 0 && v[1] == 0
}

// permanent reports whether err, from Handle, fails m on every attempt: m
// has no usable message id.
func permanent(err error) bool {
	return errors.Is(err, ErrNoMessageID) || errors.Is(err, ErrInvalidMessageID)
}

// settle handles m until it is processed, a duplicate or dead-lettered,
// retrying with backoff; it reports false when ctx ended first, and an
// error for a record without a usable message id and no DeadLetter.
func (c *Consumer) settle(ctx context.Context, m kafka.Message) (bool, error) {
	backoff := c.opts.RetryBackoff
	attempts, failures := 0, 0
	var lastLogged time.Time
	var lastErr string
	for {
		out, err := c.ib.Handle(ctx, c.handler, m, func(tx *gorm.DB) error {
			return c.fn(tx, m)
		})
		if err == nil {
			if out == Processed {
				// Committed, the offset not yet: a crash here redelivers
				// the message, and Handle skips it as a duplicate.
				failpoint.Inject("inbox/after-commit")
			}
			if out == Processed && c.log.Enabled(ctx, slog.LevelDebug) {
				id, _ := c.ib.MessageID(m) // Handle succeeded: the id is valid
				c.log.Debug("message processed", "message_id", id, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset)
			}
			return true, nil
		}
		if ctx.Err() != nil {
			return false, nil
		}
		failures++
		// The message's own failures count; the database's (see outage)
		// are retried without counting.
		if !isOutage(err) {
			attempts++
		}
		if permanent(err) {
			if c.opts.DeadLetter == nil {
				c.log.Error("record without a usable message id; stopping (no dead-letter topic)", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "error", err)
				return false, err
			}
			return c.deadLetter(ctx, m, attempts, err, backoff), nil
		}
		if c.opts.DeadLetter != nil && attempts >= c.opts.MaxAttempts {
			return c.deadLetter(ctx, m, attempts, err, backoff), nil
		}
		// Logged at WARN on the first failure, when the error changes and
		// at most once a minute; DEBUG otherwise.
		now := c.ib.clock.Now()
		level := slog.LevelDebug
		if lastLogged.IsZero() || err.Error() != lastErr || now.Sub(lastLogged) >= time.Minute {
			level, lastLogged, lastErr = slog.LevelWarn, now, err.Error()
		}
		wait := jitter(backoff)
		c.log.Log(ctx, level, "handling failed; retrying the message", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "failures", failures, "attempts", attempts, "backoff", wait, "error", err)
		if !c.sleep(ctx, wait) {
			return false, nil
		}
		backoff = min(2*backoff, c.opts.MaxRetryBackoff)
	}
}

// deadLetter writes m to the dead-letter topic, retrying with backoff
// until it succeeds; it reports false when ctx ended first.
func (c *Consumer) deadLetter(ctx context.Context, m kafka.Message, attempts int, cause error, backoff time.Duration) bool {
	text := cause.Error()
	if len(text) > maxErrorHeader {
		text = text[:maxErrorHeader]
	}
	dl := kafka.Message{
		Topic: c.opts.DeadLetterTopic,
		Key:   m.Key,
		Value: m.Value,
		Headers: append(slices.Clip(m.Headers),
			kafka.Header{Key: HeaderError, Value: []byte(text)},
			kafka.Header{Key: HeaderHandler, Value: []byte(c.handler)},
			kafka.Header{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
			kafka.Header{Key: HeaderTopic, Value: []byte(m.Topic)},
			kafka.Header{Key: HeaderPartition, Value: strconv.AppendInt(nil, int64(m.Partition), 10)},
			kafka.Header{Key: HeaderOffset, Value: strconv.AppendInt(nil, m.Offset, 10)},
		),
	}
	for {
		err := c.opts.DeadLetter.WriteMessages(ctx, dl)
		if err == nil {
			c.ib.m.deadLettered.Add(context.WithoutCancel(ctx), 1, c.ib.m.attrs(c.handler))
			c.log.Warn("message dead-lettered", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempts", attempts, "dead_letter_topic", c.dlTopic, "error", cause)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		wait := jitter(backoff)
		c.log.Warn("dead-letter write failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "backoff", wait, "error", err)
		if !c.sleep(ctx, wait) {
			return false
		}
		backoff = min(2*backoff, c.opts.MaxRetryBackoff)
	}
}

// commit commits m's offset, retrying with backoff; after ctx is done it
// makes one last attempt within CommitTimeout. It reports false when ctx
// ended.
func (c *Consumer) commit(ctx context.Context, m kafka.Message) bool {
	backoff := c.opts.RetryBackoff
	for {
		if ctx.Err() != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CommitTimeout)
			err := c.r.CommitMessages(cctx, m)
			cancel()
			if err != nil {
				c.log.Warn("offset commit at stop failed; the message will be redelivered and skipped as a duplicate", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "error", err)
			}
			return false
		}
		err := c.r.CommitMessages(ctx, m)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			continue // the last attempt above
		}
		wait := jitter(backoff)
		c.log.Warn("offset commit failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "backoff", wait, "error", err)
		if !c.sleep(ctx, wait) {
			continue
		}
		backoff = min(2*backoff, c.opts.MaxRetryBackoff)
	}
}

// sleep waits d on the inbox's clock; it reports false when ctx ended
// first.
func (c *Consumer) sleep(ctx context.Context, d time.Duration) bool {
	tc, stop := c.ib.clock.NewTimer(d)
	select {
	case <-ctx.Done():
		stop()
		return false
	case <-tc:
		return true
	}
}

// jitter returns a random duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
