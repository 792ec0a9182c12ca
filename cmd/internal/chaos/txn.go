package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/twmb/franz-go/pkg/kgo"
)

// startChecker starts the run's independent consumer. A transactional run
// (its relays publish with kafkapub.Transactions, outbox named after the
// topic so that runs never fence each other) reads read_committed through
// franz-go: kafka-go's Reader returns aborted records and markers even so.
func startChecker(ctx context.Context, transactional bool, brokers []string, topic string, partitions int) *Consumer {
	if !transactional {
		return StartConsumer(ctx, brokers, topic, partitions)
	}
	c := &Consumer{parts: make([][]Record, partitions), ids: map[string]int{}}
	c.wg.Go(func() {
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
			cl.PollFetches(ctx).EachRecord(func(m *kgo.Record) {
				if p := int(m.Partition); p >= 0 && p < partitions {
					c.add(Record{ID: kgoMessageID(m), Key: string(m.Key), Keyless: m.Key == nil, Partition: p, Offset: m.Offset, Produced: m.Timestamp, Received: time.Now()})
				}
			})
		}
	})
	return c
}

// kgoMessageID returns r's message-id header.
func kgoMessageID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == kafkapub.DefaultMessageIDHeader {
			return string(h.Value)
		}
	}
	return ""
}

// txnOutbox is the relays' RelayConfig.TxnOutbox.
func txnOutbox(transactional bool, topic string) string {
	if transactional {
		return topic
	}
	return ""
}

// txnOrderViolations counts, per key, the inversions of commit order
// (perKey) in the records as consumed, every copy included (what a consumer
// that does not deduplicate sees), and those of them a batch published
// again does not explain. Fenced publishing allows one: a relay stopped
// between its Kafka commit and its delete leaves the batch's rows, and the
// bucket's next owner publishes them again from the first undeleted row, in
// commit order, before any newer row of the key. So a copy may restart a
// key's sequence at an earlier row, and the copies must then run on
// consecutively up to the newest row delivered before a first copy of a
// newer row arrives, or the records end. Ids outside perKey (rolled back,
// in doubt) are ignored.
func (c *Consumer) txnOrderViolations(perKey map[string][]string) (raw, unexplained int) {
	parts, _, _ := c.Snapshot()
	return orderViolations(parts, perKey, false), unexplainedOrderViolations(parts, perKey)
}

func unexplainedOrderViolations(parts [][]Record, perKey map[string][]string) int {
	rank := ranks(perKey)
	type keyState struct {
		newest int          // rank of the newest row delivered
		next   int          // rank the restarted run must deliver next; -1: none
		seen   map[int]bool // ranks delivered
	}
	keys := map[string]*keyState{}
	n := 0
	for _, p := range parts {
		for _, r := range p {
			k, ok := rank[r.ID]
			if r.Keyless || !ok {
				continue
			}
			st := keys[r.Key]
			if st == nil {
				st = &keyState{newest: -1, next: -1, seen: map[int]bool{}}
				keys[r.Key] = st
			}
			switch {
			case !st.seen[k]: // a first copy
				if st.next >= 0 {
					n++ // a newer row inside an incomplete restarted run
					st.next = -1
				}
				st.seen[k] = true
				st.newest = max(st.newest, k)
			case st.next >= 0 && k == st.next: // the restarted run goes on
				st.next = k + 1
			default: // a copy that restarts the run
				if st.next >= 0 && k > st.next {
					n++ // the restarted run skipped a row
				}
				st.next = k + 1
			}
			if st.next > st.newest {
				st.next = -1 // the restarted run reached the newest row
			}
		}
	}
	for _, st := range keys {
		if st.next >= 0 {
			n++ // a restarted run that never completed
		}
	}
	return n
}

// txnSummary is the transactional variant's part of Summary.String.
func (s Summary) txnSummary() string {
	if !s.Transactional {
		return ""
	}
	return fmt.Sprintf(" transactional isolation=read_committed raw_order_violations=%d unexplained_order_violations=%d", s.RawOrderViolations, s.UnexplainedOrderViolations)
}
