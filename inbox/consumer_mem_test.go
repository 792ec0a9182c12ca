package inbox_test

import (
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
		collect(t, metrics).check(t, readings{inbox.MetricFailures: 3, inbox.MetricProcessed: 1, inbox.MetricDeadLettered: 0})
	})
}
