package inbox_test

import (
	"strings"
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
