// Package pgnotify is a cross-pod notification transport for the relay built
// on PostgreSQL LISTEN/NOTIFY: a commit in one process wakes the relay that
// owns the bucket in another, well before its poll interval, with no extra
// infrastructure.
//
// Payloads carry bucket ids only ("3,5", or "-1" for an unknown bucket),
// never message contents. The outbox itself may live in any database; the
// transport only needs a PostgreSQL connection string.
//
// Through a pooler in transaction mode a LISTEN is lost, so Listen and
// Check fail with ErrTransactionPooler there: point ConnString at
// PostgreSQL or a session-mode pool (see docs/relays.md).
package pgnotify

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// DefaultChannel is the channel name when Config.Channel is empty.
	DefaultChannel = "outbox_messages"
	// DefaultProbeTimeout is how long Listen and Check wait for their probe
	// notification when Config.ProbeTimeout is zero.
	DefaultProbeTimeout = 2 * time.Second

	maxPayload   = 7900            // below PostgreSQL's 8000-byte NOTIFY payload limit
	closeTimeout = 5 * time.Second // closing the listening connection after cancellation
)

// ErrTransactionPooler is wrapped by the error of Listen and Check when a
// notification sent to the listening connection never arrived, as through
// a pooler in transaction or statement mode.
var ErrTransactionPooler = errors.New("pgnotify: LISTEN does not work through this connection: " +
	"a notification sent to it never arrived, as through PgBouncer (or another pooler) in transaction or statement pooling mode; " +
	"point Config.ConnString at PostgreSQL directly or at a session-mode pool")

// channelName is a lowercase PostgreSQL identifier: LISTEN folds unquoted
// names to lowercase, so mixed case would be a trap.
var channelName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Config configures a Transport.
type Config struct {
	// ConnString is a PostgreSQL connection string (key=value or URL) as pgx
	// accepts it. Required.
	ConnString string
	// Channel is the NOTIFY channel, one per outbox table and environment,
	// the same on every writer and relay sharing the table. Empty means
	// DefaultChannel; it must match ^[a-z_][a-z0-9_]{0,62}$.
	Channel string
	// Logger receives the transport's logs. Nil means slog.Default().
	Logger *slog.Logger
	// ProbeTimeout is how long Listen and Check wait for their probe
	// notification; zero means DefaultProbeTimeout, negative no probe.
	ProbeTimeout time.Duration
}

// Transport publishes and receives bucket hints over LISTEN/NOTIFY. Its
// methods are safe for concurrent use.
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
	cfg.Channel = cmp.Or(cfg.Channel, DefaultChannel)
	if !channelName.MatchString(cfg.Channel) {
		return nil, fmt.Errorf("pgnotify: Config.Channel %q: must match %s", cfg.Channel, channelName)
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.ProbeTimeout = cmp.Or(cfg.ProbeTimeout, DefaultProbeTimeout)
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
	// pgx's named cached statements break through a transaction pooler.
	if pc.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
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
	return t.notify(ctx, "notify", t.cfg.Channel, Encode(buckets))
}

// notify sends payload on channel from the publishing pool.
func (t *Transport) notify(ctx context.Context, what, channel, payload string) error {
	p, err := t.getPool(ctx)
	if err != nil {
		return err
	}
	if _, err := p.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		return fmt.Errorf("pgnotify: %s %s: %w", what, channel, err)
	}
	return nil
}

// Listen subscribes on a dedicated connection and calls fn once per received
// bucket id (including -1), on the calling goroutine, until ctx is done
// (returning ctx.Err()) or the connection fails (returning its error).
func (t *Transport) Listen(ctx context.Context, fn func(bucket int)) error {
	conn, err := t.connect(ctx)
	if err != nil {
		return err
	}
	defer t.close(ctx, conn)
	if err := t.probe(ctx, conn); err != nil {
		if errors.Is(err, ErrTransactionPooler) {
			t.cfg.Logger.ErrorContext(ctx, "notification listener cannot listen: the connection is transaction-pooled", "channel", t.cfg.Channel, "error", err)
		}
		return err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{t.cfg.Channel}.Sanitize()); err != nil {
		return fmt.Errorf("pgnotify: listen %s: %w", t.cfg.Channel, err)
	}
	t.cfg.Logger.DebugContext(ctx, "notification listener listening", "channel", t.cfg.Channel)
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

// Check connects and probes as Listen does, to fail fast at startup.
func (t *Transport) Check(ctx context.Context) error {
	conn, err := t.connect(ctx)
	if err != nil {
		return err
	}
	defer t.close(ctx, conn)
	return t.probe(ctx, conn)
}

func (t *Transport) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, t.cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("pgnotify: connect listener: %w", err)
	}
	return conn, nil
}

// close closes conn within closeTimeout, even after ctx is done.
func (t *Transport) close(ctx context.Context, conn *pgx.Conn) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	_ = conn.Close(cctx)
}

// probe LISTENs on a private channel on conn and NOTIFYs it from another
// connection: through a transaction pooler nothing arrives.
func (t *Transport) probe(ctx context.Context, conn *pgx.Conn) error {
	if t.cfg.ProbeTimeout < 0 {
		return nil
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	ch := "outbox_probe_" + hex.EncodeToString(b[:])
	token := hex.EncodeToString(b[:4])
	if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
		return fmt.Errorf("pgnotify: listen %s: %w", ch, err)
	}
	if err := t.notify(ctx, "notify probe", ch, token); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, t.cfg.ProbeTimeout)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wctx)
		switch {
		case err == nil && n.Channel == ch && n.Payload == token:
			if _, err := conn.Exec(ctx, "UNLISTEN "+ch); err != nil {
				return fmt.Errorf("pgnotify: unlisten %s: %w", ch, err)
			}
			return nil
		case err == nil:
			continue // not ours (cannot happen on a private channel)
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil:
			return fmt.Errorf("pgnotify: channel %s: no probe notification within %v: %w", t.cfg.Channel, t.cfg.ProbeTimeout, ErrTransactionPooler)
		default:
			return fmt.Errorf("pgnotify: wait for probe on %s: %w", ch, err)
		}
	}
}

// Close releases the publishing connections and returns nil; Listen
// connections close when their ctx is done. Close is idempotent.
func (t *Transport) Close() error {
	t.poolMu.Lock()
	defer t.poolMu.Unlock()
	if t.pool != nil {
		t.pool.Close()
		t.pool = nil
	}
	return nil
}

var _ io.Closer = (*Transport)(nil)
