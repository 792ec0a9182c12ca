package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
)

// produceTxn writes one transaction of records (value = message id) to
// partition 0 of topic and commits or aborts it.
func produceTxn(t *testing.T, b testenv.Broker, topic string, commit bool, ids ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs...), kgo.TransactionalID(testenv.Unique("txn-")),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		r := &kgo.Record{Key: []byte("k"), Value: []byte(id), Headers: []kgo.RecordHeader{{Key: relay.DefaultMessageIDHeader, Value: []byte(id)}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", id, err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction: %v", err)
	}
}

// TestKafkaGoConsumerOnATransactionalTopic reads, with kafka-go, a
// partition as the relay's fenced publishing leaves it after a zombie:
// an aborted transaction whose records are published again, committed,
// by the bucket's next owner, and one aborted record (z) that is never
// published again (an operator discarded its row). The Consumer skips the
// three transaction markers (nothing handled, failed or dead-lettered,
// the group's offset past the last one) and applies each message id once,
// in the order of its first copy: a, b, c (from the aborted copy), z, d.
// z's effect is the limit the README states: kafka-go does not drop
// aborted records, so a consumer on it applies the effect of an aborted
// record that no read_committed consumer sees.
func TestKafkaGoConsumerOnATransactionalTopic(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		db := o.Open(t, nil)
		topic, dlq, group := testenv.Unique("inbox-txn-"), testenv.Unique("inbox-dlq-"), testenv.Unique("g-")
		b.CreateTopic(t, topic, 1, nil)
		b.CreateTopic(t, dlq, 1, nil)
		produceTxn(t, b, topic, true, "a", "b")
		produceTxn(t, b, topic, false, "c", "z")
		produceTxn(t, b, topic, true, "c", "d")
		// a b M(commit) c z M(abort) c d M(commit): 9 offsets.
		const end = 9

		ib, metrics := setup(t, db, inbox.Options{})
		w := &kafka.Writer{Addr: kafka.TCP(b.Addrs...), Topic: dlq, BatchTimeout: time.Millisecond, Transport: &kafka.Transport{}}
		t.Cleanup(func() { _ = w.Close() })
		cfg := groupReaderConfig(b.Addrs, topic, group)
		cfg.IsolationLevel = kafka.ReadCommitted
		r := kafka.NewReader(cfg)
		t.Cleanup(func() { _ = r.Close() })
		var markers int
		fetched := watchedReader{Reader: r, onFetch: func(m kafka.Message) {
			if len(m.Headers) == 0 {
				markers++
				t.Logf("fetched a record without headers at offset %d: key %x, value %x", m.Offset, m.Key, m.Value)
			}
		}}
		c, err := inbox.NewConsumer(ib, fetched, "txn", applyRecord, inbox.ConsumerOptions{
			DeadLetter: w, MaxAttempts: 1, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		waitCommitted(t, b, group, topic, map[int]int64{0: end})
		stop()

		var got []string
		if err := db.Model(&effect{}).Order("id").Pluck("message_id", &got).Error; err != nil {
			t.Fatal(err)
		}
		if want := []string{"a", "b", "c", "z", "d"}; !equal(got, want) {
			t.Fatalf("effects in order = %v; want %v", got, want)
		}
		if markers != 3 {
			t.Errorf("kafka-go returned %d records without headers; want the 3 markers (if it drops them now, the skip is moot)", markers)
		}
		collect(t, metrics).check(t, readings{inbox.MetricProcessed: 5, inbox.MetricDuplicates: 1, inbox.MetricFailures: 0, inbox.MetricDeadLettered: 0})
	})
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
