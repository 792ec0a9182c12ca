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
	"github.com/gorm-outbox/outbox/relay"
)

// Defaults of ConsumerOptions' zero fields.
const (
	// DefaultRetryBackoff is the first wait after a failed attempt.
	DefaultRetryBackoff = 500 * time.Millisecond
	// DefaultMaxRetryBackoff caps the doubling waits between attempts.
	DefaultMaxRetryBackoff = 30 * time.Second
	// DefaultMaxAttempts is the number of failed attempts after which a
	// Consumer with a DeadLetter writer dead-letters a message.
	DefaultMaxAttempts = 5
	// DefaultCommitTimeout bounds the offset commit at a stop.
	DefaultCommitTimeout = 5 * time.Second
)

// Headers a Consumer adds to a dead-lettered record, after the original
// record's (its message id among them).
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

// Reader is what a Consumer reads: a *kafka.Reader with a GroupID.
type Reader interface {
	// FetchMessage returns the next record without committing its offset,
	// blocking until one arrives or ctx is done.
	FetchMessage(ctx context.Context) (kafka.Message, error)
	// CommitMessages commits the group's offsets past msgs.
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Writer is where a Consumer dead-letters records: a *kafka.Writer.
type Writer interface {
	// WriteMessages returns once msgs are written (acknowledged), or with
	// an error.
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

var (
	_ Reader = (*kafka.Reader)(nil)
	_ Writer = (*kafka.Writer)(nil)
)

// MarkerFreeReader is a Reader whose client never returns transaction
// markers (franz-go's): a Consumer then handles every record it fetches.
type MarkerFreeReader interface {
	Reader
	// ReturnsNoTransactionMarkers reports whether FetchMessage never
	// returns a transaction marker.
	ReturnsNoTransactionMarkers() bool
}

// HandlerFunc applies a message's effect in tx, the transaction that
// records its id, bound to the Consumer's context. An error rolls the
// transaction back and makes the Consumer try the message again.
type HandlerFunc func(tx *gorm.DB, m kafka.Message) error

// ConsumerOptions configures a Consumer; NewConsumer rejects invalid values.
// The zero value retries a failed message until it succeeds.
type ConsumerOptions struct {
	// RetryBackoff is the wait after a message's first failed attempt,
	// doubled after each further one. Zero means DefaultRetryBackoff.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the wait. Zero means DefaultMaxRetryBackoff.
	MaxRetryBackoff time.Duration
	// DeadLetter, when non-nil, receives a message that failed MaxAttempts
	// handler attempts (a record without a usable message id at its first),
	// with the original headers and the Header* ones; database outages never
	// count as attempts (see docs/consuming.md). Nil: a failing message is
	// retried until it succeeds, and a record without a usable id stops Run.
	DeadLetter Writer
	// DeadLetterTopic is the topic of dead-lettered records; empty means
	// the DeadLetter writer's own (exactly one of them names it).
	DeadLetterTopic string
	// MaxAttempts is the number of failed attempts after which a message
	// goes to DeadLetter. Zero means DefaultMaxAttempts with DeadLetter.
	MaxAttempts int
	// CommitTimeout bounds the offset commit that follows a committed
	// transaction after a stop. Zero means DefaultCommitTimeout.
	CommitTimeout time.Duration
}

// Validate reports every invalid field of o, each error naming its field.
func (o ConsumerOptions) Validate() error {
	_, err := o.withDefaults()
	return err
}

func (o ConsumerOptions) withDefaults() (ConsumerOptions, error) {
	var errs problems
	bad := errs.add
	errs.durations("ConsumerOptions", []duration{
		{"RetryBackoff", &o.RetryBackoff, DefaultRetryBackoff},
		{"MaxRetryBackoff", &o.MaxRetryBackoff, DefaultMaxRetryBackoff},
		{"CommitTimeout", &o.CommitTimeout, DefaultCommitTimeout},
	})
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

// problems collects the invalid fields of options.
type problems []error

func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Errorf("inbox: "+format, args...))
}

type duration struct {
	name     string
	v        *time.Duration
	fallback time.Duration
}

// durations replaces zero durations with their defaults and reports
// negative ones.
func (p *problems) durations(options string, ds []duration) {
	for _, d := range ds {
		switch {
		case *d.v < 0:
			p.add("%s.%s %v is negative", options, d.name, *d.v)
		case *d.v == 0:
			*d.v = d.fallback
		}
	}
}

// Consumer runs a handler over a consumer group's records, one at a time:
// fetch, Handle, and commit the offset only after the transaction committed.
// A record is never skipped: a failed one is retried with backoff (or
// dead-lettered) before the next is fetched (see docs/consuming.md).
//
// kafka-go's Reader returns transaction markers as messages and exposes no
// control flag, so a Consumer skips, and commits, the records shaped like
// one (no headers, a 4-byte key of version 0 and type 0 or 1, a 6-byte value
// of version 0). Records of aborted transactions are handled like any other.
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

// NewConsumer returns a Consumer that handles r's records (a *kafka.Reader
// with a GroupID) with fn under the name handler, recording their ids in ib.
// Close r and the DeadLetter writer after Run returned.
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
	mf, ok := r.(MarkerFreeReader)
	markers := !ok || !mf.ReturnsNoTransactionMarkers()
	return &Consumer{ib: ib, r: r, handler: handler, fn: fn, opts: opts, log: log, dlTopic: dlTopic, markers: markers}, nil
}

// Run consumes until ctx is done and returns nil then; else the reader's
// error (io.EOF when closed) or, without DeadLetter, an error wrapping
// ErrNoMessageID or ErrInvalidMessageID. A stop rolls back a transaction in
// flight; a committed record's offset is still committed within
// CommitTimeout. Run must not be called twice at once.
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
// marker as kafka-go's Reader returns it (see Consumer).
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
// retrying with backoff; it reports false when ctx ended first.
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
		if !isOutage(err) { // the database's failures do not count
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
		if !c.retry(ctx, &backoff, level, "handling failed; retrying the message", m, err, "failures", failures, "attempts", attempts) {
			return false, nil
		}
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
		if ctx.Err() != nil || !c.retry(ctx, &backoff, slog.LevelWarn, "dead-letter write failed; retrying", m, err) {
			return false
		}
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
		if ctx.Err() == nil { // else the last attempt above
			c.retry(ctx, &backoff, slog.LevelWarn, "offset commit failed; retrying", m, err)
		}
	}
}

// retry logs a failure about m (args after its position), waits a jittered
// backoff on the inbox's clock and doubles it up to MaxRetryBackoff; it
// reports false when ctx ended first.
func (c *Consumer) retry(ctx context.Context, backoff *time.Duration, level slog.Level, msg string, m kafka.Message, err error, args ...any) bool {
	wait := jitter(*backoff)
	args = append([]any{"topic", m.Topic, "partition", m.Partition, "offset", m.Offset}, args...)
	c.log.Log(ctx, level, msg, append(args, "backoff", wait, "error", err)...)
	if !sleep(ctx, c.ib.clock, wait) {
		return false
	}
	*backoff = min(2**backoff, c.opts.MaxRetryBackoff)
	return true
}

// sleep waits d on clock; it reports false when ctx ended first.
func sleep(ctx context.Context, clock relay.Clock, d time.Duration) bool {
	tc, stop := clock.NewTimer(d)
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
