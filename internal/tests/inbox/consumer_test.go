package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// withID returns a record for partition carrying id in the message-id
// header (none for "") and note as its value.
func withID(partition int, id, note string) kafka.Message {
	m := kafka.Message{Partition: partition, Key: []byte("key-" + id), Value: []byte(note), Headers: []kafka.Header{{Key: "trace", Value: []byte("t-" + note)}}}
	if id != "" {
		m.Headers = append(m.Headers, kafka.Header{Key: kafkapub.DefaultMessageIDHeader, Value: []byte(id)})
	}
	return m
}

// applyRecord is a HandlerFunc writing one effect row for the record's
// message id, with its value as the note.
func applyRecord(tx *gorm.DB, m kafka.Message) error {
	id, _ := header(m, kafkapub.DefaultMessageIDHeader)
	return tx.Create(&effect{MessageID: id, Note: string(m.Value)}).Error
}

// TestConsumer holds the kafka-go Consumer's own cases; the behaviour both
// consumer loops share is TestConsumerBehaviour (package consumertest).
func TestConsumer(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		db := o.Open(t, nil)

		t.Run("a_stop_right_after_the_transaction_still_commits_the_offset", func(t *testing.T) {
			topic, group := testenv.Unique("inbox-stopcommit-"), testenv.Unique("g-")
			b.CreateTopic(t, topic, 1, nil)
			produce(t, b, topic, withID(0, "last", "l"))
			ib, _ := setup(t, db, inbox.Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var attempts atomic.Int32
			// The stop arrives as the offset commit begins: that attempt
			// fails with the cancelled context, the last one at the stop
			// goes through.
			r := watchedReader{Reader: groupReader(t, b, topic, group), onCommit: func(ctx context.Context, _ []kafka.Message) error {
				if attempts.Add(1) == 1 {
					cancel()
					return ctx.Err()
				}
				return nil
			}}
			c, err := inbox.NewConsumer(ib, r, "stopcommit", applyRecord, inbox.ConsumerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Run(ctx); err != nil {
				t.Fatalf("Run = %v; want nil after the stop", err)
			}
			if got := committed(t, b, group, topic, 1)[0]; got != 1 || attempts.Load() != 2 {
				t.Fatalf("committed offset = %d after %d commit attempts; want 1 after 2", got, attempts.Load())
			}
		})

	})
}

// closedReader is a Reader whose fetches fail as a closed kafka.Reader's.
type closedReader struct{}

func (closedReader) FetchMessage(context.Context) (kafka.Message, error) {
	return kafka.Message{}, io.EOF
}
func (closedReader) CommitMessages(context.Context, ...kafka.Message) error {
	return errors.New("not reached")
}

func TestRunReturnsTheReadersError(t *testing.T) {
	ib, _ := setup(t, testenv.Databases(t)[0].Open(t, nil), inbox.Options{})
	c, err := inbox.NewConsumer(ib, closedReader{}, "closed", applyRecord, inbox.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, io.EOF) {
		t.Fatalf("Run = %v; want an error wrapping io.EOF", err)
	}
}

// TestTwoConsumersOfOneGroupRacingOneID: two consumer instances of one
// group, each owning one partition, get the same message id at once (as
// during a rebalance, when a record is redelivered to the new owner while
// the old one still handles it). The first to record the id holds it until
// the other has fetched its copy; the other waits, sees a duplicate and
// commits: one effect, no failure.
func TestTwoConsumersOfOneGroupRacingOneID(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		db := o.Open(t, nil)
		topic, group := testenv.Unique("inbox-race-"), testenv.Unique("g-")
		b.CreateTopic(t, topic, 2, nil)
		ib, reader := setup(t, db, inbox.Options{})

		var (
			mu       sync.Mutex
			handled  = map[string]string{} // record value → consumer
			fetches  = map[string]int{}    // message id → fetches of it
			dupIn    = make(chan struct{}) // closed when both copies are fetched
			dupOnce  sync.Once
			warmDone atomic.Bool
		)
		newConsumer := func(name string) {
			r := watchedReader{Reader: groupReader(t, b, topic, group), onFetch: func(m kafka.Message) {
				id, _ := header(m, kafkapub.DefaultMessageIDHeader)
				mu.Lock()
				defer mu.Unlock()
				if fetches[id]++; id == "dup" && fetches[id] == 2 {
					dupOnce.Do(func() { close(dupIn) })
				}
			}}
			fn := func(tx *gorm.DB, m kafka.Message) error {
				mu.Lock()
				handled[string(m.Value)] = name
				mu.Unlock()
				if string(m.Value) == "dup" {
					// The winner holds the id until the other consumer has
					// fetched its copy, and a little longer, so that it
					// meets the uncommitted row.
					select {
					case <-dupIn:
					case <-time.After(20 * time.Second):
						return errors.New("the other consumer never fetched its copy")
					}
					time.Sleep(100 * time.Millisecond)
				}
				return applyRecord(tx, m)
			}
			c, err := inbox.NewConsumer(ib, r, "race", fn, inbox.ConsumerOptions{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			runConsumer(t, c)
		}
		newConsumer("A")
		newConsumer("B")

		// Warm up until each consumer owns one partition: a record to each
		// partition, until two of a round were handled by different
		// consumers.
		next := map[int]int64{0: 0, 1: 0}
		deadline := time.Now().Add(time.Minute)
		for round := 0; !warmDone.Load(); round++ {
			if time.Now().After(deadline) {
				t.Fatal("the two consumers never owned one partition each")
			}
			v0, v1 := fmt.Sprintf("warm-%d-p0", round), fmt.Sprintf("warm-%d-p1", round)
			produce(t, b, topic, withID(0, v0, v0), withID(1, v1, v1))
			next[0]++
			next[1]++
			waitCommitted(t, b, group, topic, next)
			mu.Lock()
			warmDone.Store(handled[v0] != handled[v1])
			mu.Unlock()
		}

		// Warm-up records redelivered by the rebalances are duplicates too:
		// count from here.
		before := collect(t, reader)
		produce(t, b, topic, withID(0, "dup", "dup"), withID(1, "dup", "dup"))
		next[0]++
		next[1]++
		waitCommitted(t, b, group, topic, next)
		if n := effects(t, db, "dup"); n != 1 {
			t.Fatalf("effects of the raced id = %d; want 1", n)
		}
		after := collect(t, reader)
		for name, want := range map[string]int64{inbox.MetricProcessed: 1, inbox.MetricFailures: 0} {
			if got := after[name] - before[name]; got != want {
				t.Errorf("%s rose by %d for the raced id; want %d", name, got, want)
			}
		}
		// Both copies were fetched (below), one was processed and none
		// failed: the other was a duplicate. A warm-up record that a late
		// rebalance redelivers meanwhile is one more, so at least one.
		if got := after[inbox.MetricDuplicates] - before[inbox.MetricDuplicates]; got < 1 {
			t.Errorf("%s rose by %d for the raced id; want at least 1", inbox.MetricDuplicates, got)
		}
		mu.Lock()
		defer mu.Unlock()
		if fetches["dup"] != 2 {
			t.Fatalf("fetches of the raced id = %d; want 2 (one per consumer)", fetches["dup"])
		}
	})
}
