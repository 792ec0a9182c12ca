package pgnotify

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/logrepeat"
)

// maxPendingBuckets bounds what a Sender holds between two sends; beyond it
// the batch collapses to the unknown-bucket hint.
const maxPendingBuckets = 1024

// DefaultSendBackoff is the wait after a failed send when
// SenderOptions.Backoff is zero.
const DefaultSendBackoff = time.Second

// Sender is an outbox.Plugin notifier for processes that write outbox rows
// but run no relay: Run broadcasts the committed bucket ids, coalesced, over
// the Transport, so that the owning relays wake at once. It never blocks a
// commit.
type Sender struct {
	t       *Transport
	opts    SenderOptions
	repeats *logrepeat.Limiter

	mu      sync.Mutex
	pending map[int]struct{}
	unknown bool
	wake    chan struct{}
}

// SenderOptions configures a Sender. The zero value means the defaults.
type SenderOptions struct {
	// Backoff is the wait after a failed send, whose batch is dropped. Zero
	// means DefaultSendBackoff.
	Backoff time.Duration
	// Logger receives send failures. Nil means slog.Default().
	Logger *slog.Logger
}

var (
	_ outbox.BucketNotifier = (*Sender)(nil)
	_ outbox.NonBlocking    = (*Sender)(nil)
)

// NewSender returns a Sender on t. Start its Run before commits matter.
func (t *Transport) NewSender(opts SenderOptions) *Sender {
	if opts.Backoff <= 0 {
		opts.Backoff = DefaultSendBackoff
	}
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	return &Sender{t: t, opts: opts, repeats: logrepeat.New(logrepeat.Interval), pending: map[int]struct{}{}, wake: make(chan struct{}, 1)}
}

// NonBlockingNotifier marks the Sender as never blocking (outbox.NonBlocking).
func (*Sender) NonBlockingNotifier() {}

// NotifyCommitted records a commit in unknown buckets.
func (s *Sender) NotifyCommitted() { s.NotifyBucket(-1) }

// NotifyBuckets records committed buckets; it does not retain the slice.
func (s *Sender) NotifyBuckets(buckets []int) {
	for _, b := range buckets {
		s.NotifyBucket(b)
	}
}

// NotifyBucket records a committed bucket (negative: unknown).
func (s *Sender) NotifyBucket(bucket int) {
	s.mu.Lock()
	switch {
	case bucket < 0 || len(s.pending) >= maxPendingBuckets:
		s.unknown = true
		clear(s.pending)
	case !s.unknown:
		s.pending[bucket] = struct{}{}
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// take returns and clears what is pending.
func (s *Sender) take(dst []int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unknown {
		s.unknown = false
		return append(dst, -1)
	}
	dst = slices.AppendSeq(dst, maps.Keys(s.pending))
	clear(s.pending)
	slices.Sort(dst)
	return dst
}

// Run sends the pending hints until ctx is done, and returns nil then. A
// failed send drops its batch, is logged and waits Backoff.
func (s *Sender) Run(ctx context.Context) error {
	var buf []int
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		}
		buf = s.take(buf[:0])
		if len(buf) == 0 {
			continue
		}
		if err := s.t.Publish(ctx, buf); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.repeats.Log(ctx, s.opts.Logger, time.Now(), "send", "notification send failed; hints dropped", err, "channel", s.t.cfg.Channel, "backoff", s.opts.Backoff)
			t := time.NewTimer(s.opts.Backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		s.repeats.LogRecovered(ctx, s.opts.Logger, time.Now(), "send", "notification send succeeds again", "channel", s.t.cfg.Channel)
	}
}

// String names the sender in logs.
func (s *Sender) String() string { return fmt.Sprintf("pgnotify.Sender(%s)", s.t.cfg.Channel) }
