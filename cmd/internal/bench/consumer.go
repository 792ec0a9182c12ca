package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox/kafkapub"
)

// consumer reads every partition of a topic from the beginning and
// remembers when it first read each message id (the x-outbox-message-id
// header).
type consumer struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	seen    map[string]time.Time
	want    int
	reached chan struct{} // closed once want ids were read (want > 0)
	err     error
}

// startConsumer starts one franz-go client that reads every partition of
// topic in one fetch per round trip, as Kafka's own consumers do. It
// returns once the client reads every partition: it writes a warm-up record
// (no message id) to each and waits, up to 30 s, until each was read.
func startConsumer(ctx context.Context, brokers []string, topic string, partitions, want int) (*consumer, error) {
	ctx, cancel := context.WithCancel(ctx)
	c := &consumer{cancel: cancel, seen: make(map[string]time.Time, max(want, 1024)), want: want, reached: make(chan struct{})}
	offsets := make(map[int32]kgo.Offset, partitions)
	for p := range partitions {
		offsets[int32(p)] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		// A fetch returns as soon as a record is there; with none it waits
		// at most this long.
		kgo.FetchMaxWait(10*time.Millisecond),
		kgo.FetchMaxBytes(64<<20),
		kgo.FetchMaxPartitionBytes(16<<20),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), // the warm-up records
	)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("bench: consumer: %w", err)
	}
	warm := make(chan int32, partitions)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer cl.Close()
		failures := 0
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			if errs := fs.Errors(); len(errs) > 0 && fs.NumRecords() == 0 {
				// A fresh topic's leader may not be known yet: the client
				// retries; give up after 30 s of polls that only failed.
				if failures++; failures > 300 {
					c.mu.Lock()
					c.err = fmt.Errorf("bench: consumer: %w", errs[0].Err)
					c.mu.Unlock()
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			failures = 0
			c.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				var id string
				for _, h := range r.Headers {
					if h.Key == kafkapub.DefaultMessageIDHeader {
						id = string(h.Value)
					}
				}
				if id == "" {
					if string(r.Value) == consumerWarmUp {
						select {
						case warm <- r.Partition:
						default: // one per partition was written; never block
						}
					}
					return // a harness warm-up record
				}
				if _, dup := c.seen[id]; !dup {
					c.seen[id] = time.Now() // each record's own, as it is handed over
					if len(c.seen) == c.want {
						close(c.reached)
					}
				}
			})
			c.mu.Unlock()
		}
	}()
	if err := c.warmUp(ctx, cl, topic, partitions, warm); err != nil {
		return nil, errors.Join(err, c.stop())
	}
	return c, nil
}

// consumerWarmUp is the value of the records startConsumer writes.
const consumerWarmUp = "consumer warm-up"

// warmUp writes a warm-up record to each partition and waits until the
// consumer has read one from each.
func (c *consumer) warmUp(ctx context.Context, cl *kgo.Client, topic string, partitions int, warm <-chan int32) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for p := range partitions {
		r := &kgo.Record{Topic: topic, Partition: int32(p), Value: []byte(consumerWarmUp)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			return fmt.Errorf("bench: consumer warm-up, partition %d: %w", p, err)
		}
	}
	read := make(map[int32]bool, partitions)
	for len(read) < partitions {
		select {
		case p := <-warm:
			read[p] = true
		case <-ctx.Done():
			return fmt.Errorf("bench: consumer warm-up: %d of %d partitions read: %w", len(read), partitions, ctx.Err())
		}
	}
	return nil
}

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

// quarterRates returns the rate of distinct ids read over the first
// quarter of them (from start, the preload's commit) and over the last
// quarter; 0 and 0 with fewer than 4 ids.
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
	return ratio(float64(q), ts[q-1].Sub(start).Seconds()), ratio(float64(q), ts[n-1].Sub(ts[n-q-1]).Seconds())
}

func (c *consumer) stop() error {
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
