package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// withID returns a record for partition carrying id in the message-id
// header (none for "") and note as its value.
func withID(partition int, id, note string) kafka.Message {
	m := kafka.Message{Partition: partition, Key: []byte("key-" + id), Value: []byte(note), Headers: []kafka.Header{{Key: "trace", Value: []byte("t-" + note)}}}
	if id != "" {
		m.Headers = append(m.Headers, kafka.Header{Key: relay.DefaultMessageIDHeader, Value: []byte(id)})
	}
	return m
}

// applyRecord is a HandlerFunc writing one effect row for the record's
// message id, with its value as the note.
func applyRecord(tx *gorm.DB, m kafka.Message) error {
	id, _ := header(m, relay.DefaultMessageIDHeader)
	return tx.Create(&effect{MessageID: id, Note: string(m.Value)}).Error
}

func TestConsumer(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		db := o.Open(t, nil)

		t.Run("the_same_record_delivered_three_times_has_one_effect", func(t *testing.T) {
			topic, group := testenv.Unique("inbox-three-"), testenv.Unique("g-")
			b.CreateTopic(t, topic, 1, nil)
			produce(t, b, topic, withID(0, "three-x", "x1"), withID(0, "three-x", "x2"), withID(0, "three-y", "y"), withID(0, "three-x", "x3"))
			ib, reader := setup(t, db, inbox.Options{})
			c, err := inbox.NewConsumer(ib, groupReader(t, b, topic, group), "three", applyRecord, inbox.ConsumerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c)
			waitCommitted(t, b, group, topic, map[int]int64{0: 4})
			stop()
			if n := effects(t, db, "three-x"); n != 1 {
				t.Fatalf("effects of three-x = %d; want 1", n)
			}
			var note string
			if err := db.Model(&effect{}).Where("message_id = ?", "three-x").Pluck("note", &note).Error; err != nil || note != "x1" {
				t.Fatalf("effect of three-x = %q, %v; want the first delivery's (x1)", note, err)
			}
			if n := effects(t, db, "three-y"); n != 1 {
				t.Fatalf("effects of three-y = %d; want 1", n)
			}
			collect(t, reader).check(t, readings{inbox.MetricProcessed: 2, inbox.MetricDuplicates: 2, inbox.MetricFailures: 0})
		})

		t.Run("a_handler_error_rolls_back_and_is_retried_with_backoff", func(t *testing.T) {
			topic, group := testenv.Unique("inbox-retry-"), testenv.Unique("g-")
			b.CreateTopic(t, topic, 1, nil)
			produce(t, b, topic, withID(0, "retry-a", "a"), withID(0, "retry-b", "b"))
			clock := relaytest.NewManualClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
			logs := &testenv.Logs{}
			ib, reader := setup(t, db, inbox.Options{Clock: clock, Logger: logs.Logger()})
			var calls atomic.Int32
			fn := func(tx *gorm.DB, m kafka.Message) error {
				if err := applyRecord(tx, m); err != nil {
					return err
				}
				if string(m.Value) == "a" && calls.Add(1) <= 2 {
					return errInjected // after writing the effect: rolled back
				}
				return nil
			}
			c, err := inbox.NewConsumer(ib, groupReader(t, b, topic, group), "retry", fn, inbox.ConsumerOptions{RetryBackoff: time.Second, MaxRetryBackoff: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			runConsumer(t, c)
			ctx := withTimeout(t, time.Minute)
			for attempt, max := range []time.Duration{time.Second, 2 * time.Second} {
				if !clock.WaitForWaiters(ctx, 1) {
					t.Fatalf("the consumer never waited after failure %d", attempt+1)
				}
				at, _ := clock.NextDeadline()
				if wait := at.Sub(clock.Now()); wait < max/2 || wait > max {
					t.Fatalf("backoff after failure %d = %v; want within [%v, %v]", attempt+1, wait, max/2, max)
				}
				if n := effects(t, db, "retry-a"); n != 0 {
					t.Fatalf("effects of retry-a after failure %d = %d; want 0 (rolled back)", attempt+1, n)
				}
				if got := committed(t, b, group, topic, 1)[0]; got > 0 {
					t.Fatalf("committed offset after failure %d = %d; want none (the record is not skipped)", attempt+1, got)
				}
				clock.Advance(max)
			}
			waitCommitted(t, b, group, topic, map[int]int64{0: 2})
			if a, b := effects(t, db, "retry-a"), effects(t, db, "retry-b"); a != 1 || b != 1 {
				t.Fatalf("effects = %d, %d; want 1, 1", a, b)
			}
			collect(t, reader).check(t, readings{inbox.MetricProcessed: 2, inbox.MetricFailures: 2})
			if warns := logs.Matching("level=WARN msg=\"handling failed; retrying the message\""); len(warns) != 1 {
				t.Fatalf("WARN lines for a repeated failure = %d; want 1 (then DEBUG):\n%s", len(warns), strings.Join(warns, "\n"))
			}
		})

		t.Run("dead_letter_after_max_attempts_with_the_original_headers_and_the_error", func(t *testing.T) {
			topic, dlq, group := testenv.Unique("inbox-dl-"), testenv.Unique("inbox-dlq-"), testenv.Unique("g-")
			b.CreateTopic(t, topic, 1, nil)
			b.CreateTopic(t, dlq, 1, nil)
			produce(t, b, topic, withID(0, "poison", "p"), withID(0, "", "no-id"), withID(0, "fine", "f"))
			ib, reader := setup(t, db, inbox.Options{})
			w := &kafka.Writer{Addr: kafka.TCP(b.Addrs...), Topic: dlq, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, Transport: &kafka.Transport{}}
			t.Cleanup(func() { _ = w.Close() })
			fn := func(tx *gorm.DB, m kafka.Message) error {
				if err := applyRecord(tx, m); err != nil {
					return err
				}
				if string(m.Value) == "p" {
					return fmt.Errorf("cannot ship: %w", errInjected)
				}
				return nil
			}
			c, err := inbox.NewConsumer(ib, groupReader(t, b, topic, group), "dl", fn, inbox.ConsumerOptions{
				DeadLetter: w, MaxAttempts: 3, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c)
			waitCommitted(t, b, group, topic, map[int]int64{0: 3})
			stop()
			if p, f := effects(t, db, "poison"), effects(t, db, "fine"); p != 0 || f != 1 {
				t.Fatalf("effects poison=%d fine=%d; want 0 and 1", p, f)
			}
			got := readTopic(t, b, dlq, 2)
			if len(got) != 2 {
				t.Fatalf("dead-letter records = %d; want 2", len(got))
			}
			for i, want := range []struct {
				value, id, errText, offset, attempts string
			}{
				{"p", "poison", "cannot ship: injected failure", "0", "3"},
				{"no-id", "", "inbox: no message id", "1", "1"}, // no retry can give it an id
			} {
				m := got[i]
				if string(m.Value) != want.value {
					t.Fatalf("dead-letter record %d value = %q; want %q", i, m.Value, want.value)
				}
				if tr, _ := header(m, "trace"); tr != "t-"+want.value || m.Headers[0].Key != "trace" {
					t.Errorf("dead-letter record %d headers = %v; want the original ones first", i, m.Headers)
				}
				if id, ok := header(m, relay.DefaultMessageIDHeader); want.id != "" && (!ok || id != want.id) {
					t.Errorf("dead-letter record %d message id = %q; want %q", i, id, want.id)
				}
				for key, v := range map[string]string{
					inbox.HeaderHandler: "dl", inbox.HeaderAttempts: want.attempts, inbox.HeaderTopic: topic,
					inbox.HeaderPartition: "0", inbox.HeaderOffset: want.offset,
				} {
					if got, _ := header(m, key); got != v {
						t.Errorf("dead-letter record %d header %s = %q; want %q", i, key, got, v)
					}
				}
				if e, _ := header(m, inbox.HeaderError); !strings.Contains(e, want.errText) {
					t.Errorf("dead-letter record %d error = %q; want it to contain %q", i, e, want.errText)
				}
				if string(m.Key) != string(withID(0, want.id, want.value).Key) {
					t.Errorf("dead-letter record %d key = %q", i, m.Key)
				}
			}
			collect(t, reader).check(t, readings{inbox.MetricDeadLettered: 2, inbox.MetricFailures: 4, inbox.MetricProcessed: 1})
		})

		t.Run("a_database_outage_is_retried_and_never_dead_lettered", func(t *testing.T) {
			topic, dlq, group := testenv.Unique("inbox-outage-"), testenv.Unique("inbox-dlq-"), testenv.Unique("g-")
			b.CreateTopic(t, topic, 1, nil)
			b.CreateTopic(t, dlq, 1, nil)
			produce(t, b, topic, withID(0, "outage", "o"))
			// An inbox on a table that does not exist yet: every Handle
			// fails in the database, before the handler.
			ib, reader := setup(t, db, inbox.Options{Config: inbox.Config{Table: "inbox_later"}})
			if err := db.Migrator().DropTable("inbox_later"); err != nil {
				t.Fatal(err)
			}
			w := &kafka.Writer{Addr: kafka.TCP(b.Addrs...), Topic: dlq, BatchTimeout: time.Millisecond, Transport: &kafka.Transport{}}
			t.Cleanup(func() { _ = w.Close() })
			c, err := inbox.NewConsumer(ib, groupReader(t, b, topic, group), "outage", applyRecord, inbox.ConsumerOptions{
				DeadLetter: w, MaxAttempts: 1, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			runConsumer(t, c)
			deadline := time.Now().Add(time.Minute)
			for collect(t, reader)[inbox.MetricFailures] < 5 {
				if time.Now().After(deadline) {
					t.Fatal("the consumer did not retry the failing database")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := inbox.AutoMigrate(db, inbox.Config{Table: "inbox_later"}); err != nil {
				t.Fatal(err)
			}
			waitCommitted(t, b, group, topic, map[int]int64{0: 1})
			if n := effects(t, db, "outage"); n != 1 {
				t.Fatalf("effects = %d; want 1", n)
			}
			collect(t, reader).check(t, readings{inbox.MetricDeadLettered: 0, inbox.MetricProcessed: 1})
		})

		t.Run("a_stop_during_a_retry_returns_nil_and_commits_nothing", func(t *testing.T) {
			topic, group := testenv.Unique("inbox-stop-"), testenv.Unique("g-")
			b.CreateTopic(t, topic, 1, nil)
			produce(t, b, topic, withID(0, "stuck", "s"))
			clock := relaytest.NewManualClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
			ib, _ := setup(t, db, inbox.Options{Clock: clock})
			c, err := inbox.NewConsumer(ib, groupReader(t, b, topic, group), "stop", func(*gorm.DB, kafka.Message) error { return errInjected }, inbox.ConsumerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c)
			if !clock.WaitForWaiters(withTimeout(t, time.Minute), 1) {
				t.Fatal("the consumer never waited to retry")
			}
			stop() // fails t unless Run returns nil within 30s
			if got := committed(t, b, group, topic, 1)[0]; got > 0 {
				t.Fatalf("committed offset = %d; want none", got)
			}
		})

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

		t.Run("a_stop_while_fetching_returns_nil", func(t *testing.T) {
			topic, group := testenv.Unique("inbox-idle-"), testenv.Unique("g-")
			b.CreateTopic(t, topic, 1, nil)
			ib, _ := setup(t, db, inbox.Options{})
			var fetched atomic.Bool
			r := watchedReader{Reader: groupReader(t, b, topic, group), onFetch: func(kafka.Message) { fetched.Store(true) }}
			c, err := inbox.NewConsumer(ib, r, "idle", applyRecord, inbox.ConsumerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c)
			time.Sleep(100 * time.Millisecond) // let Run reach FetchMessage
			stop()
			if fetched.Load() {
				t.Fatal("fetched a record from an empty topic")
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
				id, _ := header(m, relay.DefaultMessageIDHeader)
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
