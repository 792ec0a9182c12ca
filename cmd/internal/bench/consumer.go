package bench

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox/kafkapub"
)

// consumer reads every partition of a topic from the beginning and counts
// the distinct message ids (the x-outbox-message-id header), remembering
// when each id was first read.
type consumer struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	seen    map[string]time.Time
	want    int
	reached chan struct{}
	err     error
}

// startConsumer starts one reader per partition. want > 0 closes the
// channel returned by done once that many distinct ids were read.
func startConsumer(ctx context.Context, brokers []string, topic string, partitions, want int) *consumer {
	ctx, cancel := context.WithCancel(ctx)
	c := &consumer{cancel: cancel, seen: make(map[string]time.Time, max(want, 1024)), want: want, reached: make(chan struct{})}
	for p := range partitions {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			next, failures := kafka.FirstOffset, 0
			var r *kafka.Reader
			defer func() {
				if r != nil {
					r.Close()
				}
			}()
			for {
				if r == nil {
					r = kafka.NewReader(kafka.ReaderConfig{
						Brokers:   brokers,
						Topic:     topic,
						Partition: p,
						MinBytes:  1,
						MaxBytes:  16 << 20,
						MaxWait:   10 * time.Millisecond,
						// kafka-go backs off 100ms-1s after an empty fetch by
						// default, which would dominate commit→consume.
						ReadBackoffMin: time.Millisecond,
						ReadBackoffMax: 5 * time.Millisecond,
					})
					if err := r.SetOffset(next); err != nil {
						c.fail(err)
						return
					}
				}
				m, err := r.ReadMessage(ctx)
				if err != nil {
					if ctx.Err() != nil || errors.Is(err, context.Canceled) {
						return
					}
					// A fresh topic's leader may not be known yet (NOT_LEADER
					// and the like): reopen at the next offset, up to
					// 300 times in a row (30s).
					r.Close()
					r = nil
					if failures++; failures > 300 {
						c.fail(err)
						return
					}
					select {
					case <-ctx.Done():
						return
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				next, failures = m.Offset+1, 0
				now := time.Now()
				var id string
				for _, h := range m.Headers {
					if h.Key == kafkapub.DefaultMessageIDHeader {
						id = string(h.Value)
					}
				}
				if id == "" {
					continue // a harness warm-up record
				}
				c.mu.Lock()
				if _, dup := c.seen[id]; !dup {
					c.seen[id] = now
					if len(c.seen) == c.want {
						close(c.reached)
					}
				}
				c.mu.Unlock()
			}
		}()
	}
	return c
}

func (c *consumer) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
}

// done is closed when want distinct ids were read.
func (c *consumer) done() <-chan struct{} { return c.reached }

func (c *consumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// readAt returns when id was first read.
func (c *consumer) readAt(id string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.seen[id]
	return t, ok
}

// quarterRates returns the consumer's rate, in distinct ids per second,
// over the first and over the last quarter of the ids it read: the first
// from start (the preload's commit) until the n/4-th distinct id was read,
// the last from the read of the (n-n/4)-th id until the n-th. Both are 0
// with fewer than 4 ids.
func (c *consumer) quarterRates(start time.Time) (first, last float64) {
	c.mu.Lock()
	ts := make([]time.Time, 0, len(c.seen))
	for _, t := range c.seen {
		ts = append(ts, t)
	}
	c.mu.Unlock()
	n := len(ts)
	q := n / 4
	if q == 0 {
		return 0, 0
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return rateOver(q, ts[q-1].Sub(start)), rateOver(q, ts[n-1].Sub(ts[n-q-1]))
}

// rateOver is n per d in seconds, or 0 when d is not positive.
func rateOver(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func (c *consumer) stop() error {
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
