package inbox_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// Consumer tests that need no broker: the records come from a queueReader.

// newQueueReader returns a queueReader of msgs (offsets 0, 1, …) whose
// commits waitCommits can wait for.
func newQueueReader(msgs ...kafka.Message) *queueReader {
	for i := range msgs {
		msgs[i].Topic, msgs[i].Offset = "mem", int64(i)
	}
	return &queueReader{msgs: msgs, commits: make(chan kafka.Message, len(msgs))}
}

// waitCommits waits (at most a minute) until r has committed n records.
func waitCommits(t *testing.T, r *queueReader, n int) {
	t.Helper()
	timeout := time.After(time.Minute)
	for range n {
		select {
		case <-r.commits:
		case <-timeout:
			t.Fatalf("the consumer did not commit %d records within a minute", n)
		}
	}
}

func TestProcessedLineNamesTheMessageID(t *testing.T) {
	forEachDB(t, func(t *testing.T, _ testenv.Opener, db *gorm.DB) {
		logs := &testenv.Logs{}
		ib, _ := setup(t, db, inbox.Options{Logger: logs.Logger()})
		r := newQueueReader(withID(0, "processed-1", "p"))
		c, err := inbox.NewConsumer(ib, r, "logged", applyRecord, inbox.ConsumerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		waitCommits(t, r, 1)
		stop()
		lines := logs.Matching(`msg="message processed"`)
		if len(lines) != 1 || !strings.Contains(lines[0], " message_id=processed-1 ") {
			t.Fatalf("processed lines = %q; want one with message_id=processed-1", lines)
		}
	})
}

// dropOwnConnection kills the database connection tx runs on, from another
// connection of db, as a server restart or a network cut would: tx's next
// statement fails. It skips t on SQLite, which has no connection to drop.
func dropOwnConnection(t *testing.T, o testenv.Opener, db, tx *gorm.DB) {
	t.Helper()
	var id int64
	var kill string
	switch o.Name {
	case testenv.Postgres:
		if err := tx.Raw("SELECT pg_backend_pid()").Scan(&id).Error; err != nil {
			t.Error(err)
		}
		kill = fmt.Sprintf("SELECT pg_terminate_backend(%d)", id)
	case testenv.MySQL:
		if err := tx.Raw("SELECT CONNECTION_ID()").Scan(&id).Error; err != nil {
			t.Error(err)
		}
		kill = fmt.Sprintf("KILL %d", id)
	default:
		t.Skipf("%s has no connection to drop", o.Name)
	}
	if err := db.Exec(kill).Error; err != nil {
		t.Error(err)
	}
}

func TestHandlerErrorFromADroppedConnectionIsAnOutageNotAnAttempt(t *testing.T) {
	forEachDB(t, func(t *testing.T, o testenv.Opener, db *gorm.DB) {
		if o.Name == testenv.SQLite {
			t.Skip("SQLite has no connection to drop")
		}
		ib, metrics := setup(t, db, inbox.Options{})
		r := newQueueReader(withID(0, "flapping", "f"))
		dl := &memWriter{}
		var drops atomic.Int32
		// The connection drops under the handler three times, then stays.
		fn := func(tx *gorm.DB, m kafka.Message) error {
			if drops.Add(1) <= 3 {
				dropOwnConnection(t, o, db, tx)
			}
			return applyRecord(tx, m)
		}
		c, err := inbox.NewConsumer(ib, r, "flapping", fn, inbox.ConsumerOptions{
			DeadLetter: dl, MaxAttempts: 1, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		waitCommits(t, r, 1)
		stop()
		if n := dl.len(); n != 0 {
			t.Fatalf("dead-lettered %d records after the database dropped the handler's connection; want 0 (an outage is no attempt)", n)
		}
		if n := effects(t, db, "flapping"); n != 1 {
			t.Fatalf("effects = %d; want 1", n)
		}
		collect(t, metrics).Check(t, readings{inbox.MetricFailures: 3, inbox.MetricProcessed: 1, inbox.MetricDeadLettered: 0})
	})
}

// TestRecordWithoutMessageID: no retry can give a record an id, so it is
// dead-lettered at its first failure, or stops Run without a dead-letter
// topic; either way it is a counted failure, and never skipped.
func TestRecordWithoutMessageID(t *testing.T) {
	forEachDB(t, func(t *testing.T, _ testenv.Opener, db *gorm.DB) {
		t.Run("dead_lettered_at_its_first_failure", func(t *testing.T) {
			ib, metrics := setup(t, db, inbox.Options{})
			r := newQueueReader(withID(0, "", "no-id"), withID(0, "after", "a"))
			dl := &memWriter{}
			c, err := inbox.NewConsumer(ib, r, "noid-dl", applyRecord, inbox.ConsumerOptions{DeadLetter: dl, DeadLetterTopic: "dlq", MaxAttempts: 5})
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c)
			waitCommits(t, r, 2)
			stop()
			if n := dl.len(); n != 1 {
				t.Fatalf("dead-lettered %d records; want 1", n)
			}
			if a, _ := header(dl.msgs[0], inbox.HeaderAttempts); a != "1" {
				t.Errorf("%s = %q; want 1", inbox.HeaderAttempts, a)
			}
			collect(t, metrics).Check(t, readings{inbox.MetricFailures: 1, inbox.MetricDeadLettered: 1, inbox.MetricProcessed: 1})
		})
		t.Run("stops_Run_without_a_dead_letter_topic", func(t *testing.T) {
			ib, metrics := setup(t, db, inbox.Options{})
			r := newQueueReader(withID(0, "before", "b"), withID(0, "", "no-id"), withID(0, "after2", "a"))
			c, err := inbox.NewConsumer(ib, r, "noid-stop", applyRecord, inbox.ConsumerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			err = c.Run(withTimeout(t, time.Minute))
			if !errors.Is(err, inbox.ErrNoMessageID) || !strings.Contains(err.Error(), "mem[0]@1") {
				t.Fatalf("Run = %v; want an error wrapping ErrNoMessageID naming mem[0]@1", err)
			}
			if n := len(r.commits); n != 1 {
				t.Fatalf("commits = %d; want 1 (the record before, not the one without an id)", n)
			}
			collect(t, metrics).Check(t, readings{inbox.MetricFailures: 1, inbox.MetricProcessed: 1})
		})
	})
}

// markerFree wraps a queueReader as a reader whose client filters
// transaction markers.
type markerFree struct{ *queueReader }

func (markerFree) ReturnsNoTransactionMarkers() bool { return true }

// TestTransactionMarkersAreSkipped: records shaped like kafka-go's view of
// a commit or abort marker are not handled, counted or dead-lettered, and
// their offsets are committed; the same shape with a header, another
// type, version or length is a record like any other. A MarkerFreeReader
// turns the check off.
func TestTransactionMarkersAreSkipped(t *testing.T) {
	marker := func(typ byte) kafka.Message {
		return kafka.Message{Key: []byte{0, 0, 0, typ}, Value: []byte{0, 0, 0, 0, 0, 7}}
	}
	notMarkers := []kafka.Message{
		{Key: []byte{0, 0, 0, 2}, Value: []byte{0, 0, 0, 0, 0, 7}},                                      // another control type
		{Key: []byte{0, 1, 0, 1}, Value: []byte{0, 0, 0, 0, 0, 7}},                                      // another key version
		{Key: []byte{0, 0, 0, 1}, Value: []byte{0, 0, 0, 0, 7}},                                         // a short value
		{Key: []byte{0, 0, 0, 1}, Value: []byte{0, 1, 0, 0, 0, 7}},                                      // another value version
		{Key: []byte{0, 0, 0, 1}, Value: []byte{0, 0, 0, 0, 0, 7}, Headers: []kafka.Header{{Key: "h"}}}, // a header
	}
	forEachDB(t, func(t *testing.T, _ testenv.Opener, db *gorm.DB) {
		ib, metrics := setup(t, db, inbox.Options{IDFromOffset: true})
		msgs := append([]kafka.Message{marker(0), withID(0, "real", "r"), marker(1)}, notMarkers...)
		r := newQueueReader(msgs...)
		dl := &memWriter{}
		var handled atomic.Int32
		fn := func(tx *gorm.DB, m kafka.Message) error { handled.Add(1); return nil }
		c, err := inbox.NewConsumer(ib, r, "markers", fn, inbox.ConsumerOptions{DeadLetter: dl, DeadLetterTopic: "dlq"})
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		waitCommits(t, r, len(msgs))
		stop()
		if got, want := handled.Load(), int32(1+len(notMarkers)); got != want || dl.len() != 0 {
			t.Fatalf("handled %d records, dead-lettered %d; want %d and 0 (the two markers skipped)", got, dl.len(), want)
		}
		collect(t, metrics).Check(t, readings{inbox.MetricProcessed: int64(1 + len(notMarkers)), inbox.MetricFailures: 0})

		// A reader whose client filters markers itself: the shape is a record.
		handled.Store(0)
		r = newQueueReader(marker(1))
		c, err = inbox.NewConsumer(ib, markerFree{r}, "markers-free", fn, inbox.ConsumerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stop = runConsumer(t, c)
		waitCommits(t, r, 1)
		stop()
		if handled.Load() != 1 {
			t.Fatalf("handled %d records through a MarkerFreeReader; want 1", handled.Load())
		}
	})
}
