package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The transactional variants (RunConfig.Transactional,
// MatrixConfig.Transactional): the relay children publish with
// relay.KafkaConfig.Transactions (one transactional id per bucket, prefixed
// with the run's topic so that runs never fence each other), and the
// checker reads with isolation.level=read_committed through franz-go:
// kafka-go's Reader does not filter aborted transactions (it returns their
// records and the transaction markers even with IsolationLevel
// ReadCommitted).

// startChecker starts the run's independent consumer: read_committed
// through franz-go for a transactional run, else kafka-go's Reader.
func startChecker(ctx context.Context, transactional bool, brokers []string, topic string, partitions int) *Consumer {
	if transactional {
		return StartCommittedConsumer(ctx, brokers, topic, partitions)
	}
	return StartConsumer(ctx, brokers, topic, partitions)
}

// txnOutbox is the relays' RelayConfig.TxnOutbox for a run on topic.
func txnOutbox(transactional bool, topic string) string {
	if transactional {
		return topic
	}
	return ""
}

// StartCommittedConsumer is StartConsumer reading with
// isolation.level=read_committed (franz-go): records of aborted
// transactions and transaction markers are never seen.
func StartCommittedConsumer(ctx context.Context, brokers []string, topic string, partitions int) *Consumer {
	c := &Consumer{parts: make([][]Record, partitions), ids: map[string]int{}}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		var cl *kgo.Client
		for ctx.Err() == nil {
			var err error
			cl, err = kgo.NewClient(
				kgo.SeedBrokers(brokers...),
				kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()),
				kgo.FetchMaxWait(100*time.Millisecond),
			)
			if err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if cl == nil {
			return
		}
		defer cl.Close()
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(m *kgo.Record) {
				p := int(m.Partition)
				if p < 0 || p >= partitions {
					return
				}
				rec := Record{Key: string(m.Key), Keyless: m.Key == nil, Partition: p, Offset: m.Offset, Produced: m.Timestamp}
				for _, h := range m.Headers {
					if h.Key == "x-outbox-message-id" {
						rec.ID = string(h.Value)
					}
				}
				c.mu.Lock()
				c.parts[p] = append(c.parts[p], rec)
				c.ids[rec.ID]++
				c.total++
				c.mu.Unlock()
			})
		}
	}()
	return c
}

// RawOrderViolations counts, per key, the adjacent inversions of commit
// order in the records as consumed, every copy included: what a consumer
// that does not deduplicate sees. perKey holds each key's committed ids in
// commit order. A batch published again (a relay stopped between the
// broker's acknowledgement and its delete) counts, as its first record
// follows later ones.
func (c *Consumer) RawOrderViolations(perKey map[string][]string) int {
	parts, _, _ := c.Snapshot()
	rank := map[string]int{}
	for _, ids := range perKey {
		for i, id := range ids {
			rank[id] = i
		}
	}
	n := 0
	last := map[string]int{}
	for _, p := range parts {
		for _, r := range p {
			k, ok := rank[r.ID]
			if r.Keyless || !ok {
				continue
			}
			if prev, ok := last[r.Key]; ok && k < prev {
				n++
			}
			last[r.Key] = k
		}
	}
	return n
}

// txnSummary is the transactional variant's part of Summary.String.
func (s Summary) txnSummary() string {
	if !s.Transactional {
		return ""
	}
	return fmt.Sprintf(" transactional isolation=read_committed raw_order_violations=%d", s.RawOrderViolations)
}

// FormatTxnMatrix renders rows of the transactional variant as a Markdown
// table: FormatMatrix's columns plus the order violations without
// deduplication.
func FormatTxnMatrix(rows []MatrixRow) string {
	var b strings.Builder
	b.WriteString("| step (failpoints) | recovery | messages | lost | duplicates | order violations (dedup) | order violations (no dedup) | delivery resumed after |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		resumed := "— (nothing left)"
		if r.Resumed >= 0 {
			resumed = r.Resumed.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s (`%s`) | %s | %d | %d | %d | %d | %d | %s |\n", r.Step, r.Failpoints, r.Mode, r.Messages, r.Lost, r.Duplicates, r.OrderViolations, r.RawOrderViolations, resumed)
	}
	return b.String()
}
