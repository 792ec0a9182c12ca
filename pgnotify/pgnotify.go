// Package pgnotify is a cross-pod notification transport for the relay built
// on PostgreSQL LISTEN/NOTIFY: a commit in one process wakes the relay that
// owns the bucket in another, well before its poll interval, with no extra
// infrastructure.
//
// Payloads carry bucket ids only ("3,5", or "-1" for an unknown bucket),
// never message contents. The outbox itself may live in any database; the
// transport only needs a PostgreSQL connection string.
//
// PgBouncer caveat: LISTEN needs a session that stays on one server
// connection. Through PgBouncer in transaction (or statement) pooling mode a
// LISTEN is silently lost when the server connection is handed to another
// client; point ConnString at PostgreSQL directly or at a session-mode pool.
// NOTIFY (Publish) works through any pooling mode.
package pgnotify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultChannel is the channel name when Config.Channel is empty.
const DefaultChannel = "outbox_messages"

// maxPayload is below PostgreSQL's 8000-byte NOTIFY payload limit.
const maxPayload = 7900

// closeTimeout bounds closing the listening connection after cancellation.
const closeTimeout = 5 * time.Second

// channelName is a lowercase PostgreSQL identifier: LISTEN folds unquoted
// names to lowercase, so mixed case would be a trap.
var channelName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Config configures a Transport.
type Config struct {
	// ConnString is a PostgreSQL connection string (key=value or URL) as pgx
	// accepts it. Required.
	ConnString string
	// Channel is the NOTIFY channel. Use one per outbox table and
	// environment, the same on every writer and relay sharing the table.
	// Empty means DefaultChannel ("outbox_messages"); it must match
	// ^[a-z_][a-z0-9_]{0,62}$.
	Channel string
	// Logger receives the transport's logs. Nil means slog.Default().
	Logger *slog.Logger
}

// Transport publishes and receives bucket hints over LISTEN/NOTIFY. Its
// methods are safe for concurrent use: the relay calls Publish from one
// sender goroutine and Listen from one listener goroutine.
type Transport struct {
	cfg    Config
	poolMu sync.Mutex
	pool   *pgxpool.Pool
}

// New validates cfg. It does not connect: Publish connects lazily and
// Listen opens its own dedicated connection.
func New(cfg Config) (*Transport, error) {
	if cfg.ConnString == "" {
		return nil, errors.New("pgnotify: Config.ConnString is empty")
	}
	if _, err := pgx.ParseConfig(cfg.ConnString); err != nil {
		return nil, fmt.Errorf("pgnotify: Config.ConnString: %w", err)
	}
	if cfg.Channel == "" {
		cfg.Channel = DefaultChannel
	}
	if !channelName.MatchString(cfg.Channel) {
		return nil, fmt.Errorf("pgnotify: Config.Channel %q: must match %s", cfg.Channel, channelName)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Transport{cfg: cfg}, nil
}

// Channel returns the channel name in use.
func (t *Transport) Channel() string { return t.cfg.Channel }

// Encode returns the payload for buckets: comma-separated decimal ids, or
// "-1" when the list is empty, holds -1, or would not fit in a NOTIFY.
func Encode(buckets []int) string {
	var b strings.Builder
	for i, x := range buckets {
		if x < 0 || b.Len() > maxPayload {
			return "-1"
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(x))
	}
	if b.Len() == 0 {
		return "-1"
	}
	return b.String()
}

// Decode parses a payload; any malformed part becomes -1 (discover).
func Decode(payload string) []int {
	parts := strings.Split(payload, ",")
	out := make([]int, 0, len(parts))
	for _, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < -1 {
			n = -1
		}
		out = append(out, n)
	}
	return out
}

func (t *Transport) getPool(ctx context.Context) (*pgxpool.Pool, error) {
	t.poolMu.Lock()
	defer t.poolMu.Unlock()
	if t.pool != nil {
		return t.pool, nil
	}
	pc, err := pgxpool.ParseConfig(t.cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("pgnotify: %w", err)
	}
	pc.MaxConns = 2
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgnotify: connect: %w", err)
	}
	t.pool = p
	return p, nil
}

// Publish broadcasts buckets (committed bucket ids; -1 = unknown) to every
// listener of the channel, including this process's own. It does not
// retain buckets.
func (t *Transport) Publish(ctx context.Context, buckets []int) error {
	if len(buckets) == 0 {
		return nil
	}
	p, err := t.getPool(ctx)
	if err != nil {
		return err
	}
	if _, err := p.Exec(ctx, "SELECT pg_notify($1, $2)", t.cfg.Channel, Encode(buckets)); err != nil {
		return fmt.Errorf("pgnotify: notify %s: %w", t.cfg.Channel, err)
	}
	return nil
}

// Listen subscribes on a dedicated connection and calls fn once per received
// bucket id (including -1 and buckets this relay does not own), on the
// calling goroutine, until ctx is done or the connection fails. It returns
// ctx.Err() after cancellation, or the connection's error; the relay calls
// it again after its ErrorBackoff, which reconnects. Every callback has
// returned when Listen returns.
func (t *Transport) Listen(ctx context.Context, fn func(bucket int)) error {
	conn, err := pgx.Connect(ctx, t.cfg.ConnString)
	if err != nil {
		return fmt.Errorf("pgnotify: connect listener: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{t.cfg.Channel}.Sanitize()); err != nil {
		return fmt.Errorf("pgnotify: listen %s: %w", t.cfg.Channel, err)
	}
	t.cfg.Logger.Debug("pgnotify: listening", "channel", t.cfg.Channel)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("pgnotify: wait on %s: %w", t.cfg.Channel, err)
		}
		for _, b := range Decode(n.Payload) {
			fn(b)
		}
	}
}

// Close releases the publishing connections. Listen connections close when
// their ctx is done.
func (t *Transport) Close() {
	t.poolMu.Lock()
	defer t.poolMu.Unlock()
	if t.pool != nil {
		t.pool.Close()
		t.pool = nil
	}
}
