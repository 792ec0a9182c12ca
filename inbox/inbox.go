package inbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/relay"
)

// Outcome says what Handle did with a message.
type Outcome int

const (
	// Processed: the handler's transaction committed, the id recorded.
	Processed Outcome = iota + 1
	// Duplicate: the id was already recorded for the handler; the handler
	// was not called and nothing was written.
	Duplicate
)

// String returns "processed", "duplicate" or, for the zero Outcome that
// comes with an error, "failed".
func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	default:
		return "failed"
	}
}

// Inbox records the ids of processed messages in one table, in the
// transaction of their effects, so that a redelivered message is skipped.
// It is safe for concurrent use by any number of handlers and consumers.
type Inbox struct {
	db    *gorm.DB
	opts  Options
	table string // Config.TableName()
	sql   statements
	clock relay.Clock
	log   *slog.Logger
	m     *instruments
}

// New returns an Inbox on db's processed-messages table (opts.Config; create
// it with AutoMigrate or migrations.InboxSQL). db must be a *gorm.DB of
// PostgreSQL, MySQL/MariaDB or SQLite, not a transaction.
func New(db *gorm.DB, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("inbox: New: nil *gorm.DB")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	table := opts.Config.TableName()
	st, err := buildStatements(db, table, opts.PurgeBatchSize)
	if err != nil {
		return nil, err
	}
	m, err := newInstruments(opts.MeterProvider, table)
	if err != nil {
		return nil, fmt.Errorf("inbox: create instruments: %w", err)
	}
	return &Inbox{
		db:    db,
		opts:  opts,
		table: table,
		sql:   st,
		clock: opts.Clock,
		log:   opts.Logger.With("inbox", table),
		m:     m,
	}, nil
}

// Handle runs fn and records m's message id (see MessageID) for handler
// (1 to MaxHandlerLength bytes) in one database transaction, or returns
// Duplicate without calling fn when the id is already recorded. It returns
// Processed once the transaction committed, else the first error with
// nothing recorded. The id is recorded first, so of concurrent deliveries
// exactly one fn's effects commit (see docs/consuming.md for isolation
// levels). fn must write its effect through tx, bound to ctx, and must not
// commit or roll it back; a panic in fn rolls back and propagates.
func (ib *Inbox) Handle(ctx context.Context, handler string, m kafka.Message, fn func(tx *gorm.DB) error) (Outcome, error) {
	start := ib.clock.Now()
	out, err := ib.handle(ctx, handler, m, fn)
	ib.m.handled(ctx, handler, out, err, ib.clock.Now().Sub(start))
	return out, err
}

func (ib *Inbox) handle(ctx context.Context, handler string, m kafka.Message, fn func(tx *gorm.DB) error) (Outcome, error) {
	if err := checkHandler(handler); err != nil {
		return 0, err
	}
	if fn == nil {
		return 0, fmt.Errorf("inbox: handler %s: nil function", handler)
	}
	id, err := ib.MessageID(m)
	if err != nil {
		return 0, fmt.Errorf("inbox: handler %s: %w", handler, err)
	}
	tx := ib.db.WithContext(ctx).Begin()
	if err := tx.Error; err != nil {
		return 0, outage{fmt.Errorf("inbox: handler %s: message %s: begin: %w", handler, id, err)}
	}
	done := false
	defer func() {
		if !done {
			tx.Rollback() // fn panicked
		}
	}()
	inserted, err := ib.record(tx, handler, id)
	switch {
	case err != nil:
		return 0, outage{fmt.Errorf("inbox: handler %s: message %s: record: %w", handler, id, err)}
	case !inserted:
		ib.log.Debug("duplicate skipped", "handler", handler, "message_id", id, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset)
		return Duplicate, nil
	}
	if err := fn(tx); err != nil {
		done = true
		err = fmt.Errorf("inbox: handler %s: message %s: %w", handler, id, err)
		if rb := rollback(tx); rb != nil { // the connection is gone
			return 0, outage{fmt.Errorf("%w (rollback: %w)", err, rb)}
		}
		return 0, err
	}
	done = true
	if err := tx.Commit().Error; err != nil {
		return 0, outage{fmt.Errorf("inbox: handler %s: message %s: commit: %w", handler, id, err)}
	}
	return Processed, nil
}

// outage marks an error of the database rather than of the message: one of
// Handle's own statements failed, or the rollback after a failed fn did. A
// Consumer retries an outage without counting an attempt.
type outage struct{ error }

func (o outage) Unwrap() error { return o.error }

// isOutage reports whether err, from Handle, is an outage.
func isOutage(err error) bool {
	var o outage
	return errors.As(err, &o)
}

// rollback rolls tx back and returns its error, nil also when fn had ended
// the transaction itself (sql.ErrTxDone: misuse, not an outage).
func rollback(tx *gorm.DB) error {
	c, ok := tx.Statement.ConnPool.(gorm.TxCommitter)
	if !ok {
		return nil
	}
	if err := c.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// checkHandler returns an error naming what is wrong with handler, or nil.
func checkHandler(handler string) error {
	if handler == "" || len(handler) > MaxHandlerLength {
		return fmt.Errorf("inbox: handler name %q: must be 1 to %d bytes", handler, MaxHandlerLength)
	}
	if !utf8.ValidString(handler) || strings.IndexByte(handler, 0) >= 0 {
		return fmt.Errorf("inbox: handler name %q: must be UTF-8 without NUL", handler)
	}
	return nil
}

// MessageID returns the id Handle records for m: the value of its last
// Options.MessageIDHeader header or, without one (or with an empty one)
// and with Options.IDFromOffset, "<topic>/<partition>/<offset>". It fails
// with an error wrapping ErrNoMessageID or ErrInvalidMessageID.
func (ib *Inbox) MessageID(m kafka.Message) (string, error) {
	var id []byte
	found := false
	for _, h := range m.Headers {
		if h.Key == ib.opts.MessageIDHeader {
			id, found = h.Value, true
		}
	}
	switch {
	case len(id) > 0:
	case ib.opts.IDFromOffset:
		return m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10), nil
	case found:
		return "", fmt.Errorf("%s[%d]@%d: header %s is empty: %w", m.Topic, m.Partition, m.Offset, ib.opts.MessageIDHeader, ErrNoMessageID)
	default:
		return "", fmt.Errorf("%s[%d]@%d: no header %s: %w", m.Topic, m.Partition, m.Offset, ib.opts.MessageIDHeader, ErrNoMessageID)
	}
	switch {
	case len(id) > MaxMessageIDLength:
		return "", fmt.Errorf("%s[%d]@%d: header %s is %d bytes long, above %d: %w", m.Topic, m.Partition, m.Offset, ib.opts.MessageIDHeader, len(id), MaxMessageIDLength, ErrInvalidMessageID)
	case !utf8.Valid(id) || bytes.IndexByte(id, 0) >= 0:
		return "", fmt.Errorf("%s[%d]@%d: header %s %q is not UTF-8 without NUL: %w", m.Topic, m.Partition, m.Offset, ib.opts.MessageIDHeader, id, ErrInvalidMessageID)
	}
	return string(id), nil
}
