package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// CreateTopic creates topic with the given partitions and waits until
// their leaders serve.
func CreateTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	return testenv.CreateTopic(ctx, nil, brokers, kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1})
}

// Record is one record the checker consumed.
type Record struct {
	ID        string // the message-id header
	Key       string
	Keyless   bool // a nil key
	Partition int
	Offset    int64
	Produced  time.Time // the producer's timestamp: the relay's clock when it handed the record over
	Received  time.Time // when the checker read it
}

// Consumer reads every partition of a topic from the beginning, on its own
// connections: the independent checker.
type Consumer struct {
	mu    sync.Mutex
	parts [][]Record
	ids   map[string]int // id -> copies
	total int
	wg    sync.WaitGroup
}

// StartConsumer reads topic's partitions until ctx is done; Wait waits for
// the readers to exit.
func StartConsumer(ctx context.Context, brokers []string, topic string, partitions int) *Consumer {
	c := &Consumer{parts: make([][]Record, partitions), ids: map[string]int{}}
	for p := range partitions {
		c.wg.Go(func() {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 100 * time.Millisecond, StartOffset: kafka.FirstOffset})
			defer r.Close()
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
					continue
				}
				id := ""
				for _, h := range m.Headers {
					if h.Key == kafkapub.DefaultMessageIDHeader {
						id = string(h.Value)
					}
				}
				c.add(Record{ID: id, Key: string(m.Key), Keyless: m.Key == nil, Partition: p, Offset: m.Offset, Produced: m.Time, Received: time.Now()})
			}
		})
	}
	return c
}

func (c *Consumer) add(rec Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parts[rec.Partition] = append(c.parts[rec.Partition], rec)
	c.ids[rec.ID]++
	c.total++
}

// Wait waits for the readers to exit (after ctx is done).
func (c *Consumer) Wait() { c.wg.Wait() }

// Has reports whether every id of ids arrived.
func (c *Consumer) Has(ids []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if c.ids[id] == 0 {
			return false
		}
	}
	return true
}

// Snapshot returns the records per partition, in offset order, and the
// copies of each id.
func (c *Consumer) Snapshot() (parts [][]Record, copies map[string]int, total int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	parts = make([][]Record, len(c.parts))
	for i, p := range c.parts {
		parts[i] = append([]Record(nil), p...)
	}
	return parts, maps.Clone(c.ids), c.total
}

// FirstProducedAfter returns the earliest producer timestamp after t of a
// record whose bucket (for bucketCount buckets) is in buckets.
func (c *Consumer) FirstProducedAfter(t time.Time, buckets map[int]bool, bucketCount int) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best time.Time
	for _, p := range c.parts {
		for _, r := range p {
			if !r.Produced.After(t) || r.Keyless {
				continue
			}
			if !buckets[int(outbox.BucketOf([]byte(r.Key), nil, outbox.UUID{}, bucketCount))] {
				continue
			}
			if best.IsZero() || r.Produced.Before(best) {
				best = r.Produced
			}
		}
	}
	return best, !best.IsZero()
}

// Check is the verdict of the checker.
type Check struct {
	Lost              int // committed ids that never arrived
	RolledBackArrived int // rolled-back ids that arrived
	OrderViolations   int // adjacent inversions of commit order per key, after dedup
	Duplicates        int // records beyond the first copy of an id
	Records           int
}

// err reports the first failed check a run shares: lost or rolled-back
// messages, order violations, two live owners, an undrained table.
func (ck Check) err(run string, dualOwners int64, drained bool) error {
	switch {
	case ck.Lost != 0:
		return fmt.Errorf("%s: %d committed messages lost", run, ck.Lost)
	case ck.RolledBackArrived != 0:
		return fmt.Errorf("%s: %d rolled-back messages arrived", run, ck.RolledBackArrived)
	case ck.OrderViolations != 0:
		return fmt.Errorf("%s: %d per-key order violations after deduplication", run, ck.OrderViolations)
	case dualOwners != 0:
		return fmt.Errorf("%s: %d takeovers of a live lease", run, dualOwners)
	case !drained:
		return fmt.Errorf("%s: the outbox table did not drain", run)
	}
	return nil
}

// Verify checks the consumed records against the writers' ledger: perKey
// holds each key's committed ids in commit order (in-doubt ids included),
// doubt marks ids whose commit outcome is unknown, rolledBack the ids of
// rolled-back transactions, keyless the committed keyless ids.
func (c *Consumer) Verify(perKey map[string][]string, keyless []string, doubt, rolledBack map[string]bool) Check {
	parts, copies, total := c.Snapshot()
	var ck Check
	ck.Records = total
	for _, n := range copies {
		if n > 1 {
			ck.Duplicates += n - 1
		}
	}
	for id := range rolledBack {
		if copies[id] > 0 {
			ck.RolledBackArrived++
		}
	}
	for _, ids := range append(slices.Collect(maps.Values(perKey)), keyless) {
		for _, id := range ids {
			if copies[id] == 0 && !doubt[id] {
				ck.Lost++
			}
		}
	}
	ck.OrderViolations = orderViolations(parts, perKey, true)
	return ck
}

// orderViolations counts, per key, the adjacent inversions of commit order
// (perKey) in parts; dedup: among the first copies of each id only.
func orderViolations(parts [][]Record, perKey map[string][]string, dedup bool) int {
	rank := ranks(perKey)
	seen := map[string]bool{}
	last := map[string]int{}
	n := 0
	for _, p := range parts {
		for _, r := range p {
			k, ok := rank[r.ID]
			if r.Keyless || !ok || dedup && seen[r.ID] {
				continue
			}
			seen[r.ID] = true
			if prev, ok := last[r.Key]; ok && k < prev {
				n++
			}
			last[r.Key] = k
		}
	}
	return n
}

// ranks maps each id of perKey to its place in its key's commit order.
func ranks(perKey map[string][]string) map[string]int {
	rank := map[string]int{}
	for _, ids := range perKey {
		for i, id := range ids {
			rank[id] = i
		}
	}
	return rank
}
