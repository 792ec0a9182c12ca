package relay

import (
	"context"
	"time"
)

// HintTransport carries bucket hints, which may be duplicated, reordered or
// lost, between relay processes (pgnotify). The relay calls Publish and
// Listen from one goroutine each; both must honour ctx.
type HintTransport interface {
	// Publish broadcasts committed bucket ids (−1: unknown) to every relay
	// sharing the outbox, this one included, without retaining buckets. On
	// error the relay drops them and waits Options.ErrorBackoff.
	Publish(ctx context.Context, buckets []int) error

	// Listen delivers each received bucket id to fn until ctx is done, and
	// returns after every fn call has returned. When it returns before ctx
	// is done, the relay calls it again after Options.ErrorBackoff.
	Listen(ctx context.Context, fn func(bucket int)) error
}

func (r *Relay) runTransport(ctx context.Context, done func()) {
	defer done()
	t := r.opts.HintTransport
	n := r.notifier
	go func() {
		defer done()
		for ctx.Err() == nil {
			err := t.Listen(ctx, n.receive)
			if ctx.Err() != nil {
				return
			}
			r.repeats.Log(ctx, r.log, r.clock.Now(), "listen", "notification listener ended; restarting after backoff", err, "backoff", r.opts.ErrorBackoff)
			r.pause(ctx, r.opts.ErrorBackoff)
		}
	}()
	var buf []int
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.outWake:
		}
		var unknown bool
		buf, unknown = n.takeOut(buf[:0])
		if unknown {
			buf = append(buf[:0], -1)
		}
		if len(buf) == 0 {
			continue
		}
		if err := t.Publish(ctx, buf); err != nil {
			if ctx.Err() != nil {
				return
			}
			r.repeats.Log(ctx, r.log, r.clock.Now(), "send hints", "notification send failed; hints dropped", err, "backoff", r.opts.ErrorBackoff)
			r.pause(ctx, r.opts.ErrorBackoff)
			continue
		}
		r.repeats.LogRecovered(ctx, r.log, r.clock.Now(), "send hints", "notification send succeeds again")
	}
}

func (r *Relay) pause(ctx context.Context, d time.Duration) {
	tc, stop := r.clock.NewTimer(d)
	defer stop()
	select {
	case <-ctx.Done():
	case <-tc:
	}
}
