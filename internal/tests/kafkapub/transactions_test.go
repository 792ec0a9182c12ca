package kafkapub_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// bucketMsg is msg in bucket b.
func bucketMsg(b int32, topic, key, value string, partition ...int32) *outbox.Message {
	m := msg(topic, key, value, partition...)
	m.Bucket = b
	return m
}

// A batch goes out in one transaction: read_committed consumers see every
// row, in order per partition, with the producer's id, once it committed.
func TestTxnPublisher_publishes_a_batch_in_one_transaction(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		topic := newTopic(t, b, 3, nil)
		p := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
		own(t, p, 2)
		var batch []*outbox.Message
		for i := range 30 {
			batch = append(batch, bucketMsg(2, topic, fmt.Sprintf("k%d", i%5), fmt.Sprint(i)))
		}
		batch[7].Key = nil
		batch[8].Value = nil
		batch[9].Headers = outbox.Headers{{Key: "a", Value: []byte("1")}, {Key: "b", Value: nil}}
		res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
		if res.Acknowledged != len(batch) || res.Err != nil {
			t.Fatalf("Publish = %d, %v; want %d, nil", res.Acknowledged, res.Err, len(batch))
		}
		// A second batch: the next transaction of the same producer.
		batch2 := []*outbox.Message{bucketMsg(2, topic, "k0", "30"), bucketMsg(2, topic, "k1", "31")}
		if res := p.Publish(context.Background(), [][]*outbox.Message{batch2})[0]; res.Acknowledged != 2 || res.Err != nil {
			t.Fatalf("second Publish = %d, %v; want 2, nil", res.Acknowledged, res.Err)
		}
		batch = append(batch, batch2...)

		recs := readIsolated(t, b, topic, kgo.ReadCommitted(), len(batch), 300*time.Millisecond)
		if len(recs) != len(batch) {
			t.Fatalf("read_committed read %d records; want %d", len(recs), len(batch))
		}
		want := map[string]*outbox.Message{}
		for _, m := range batch {
			want[m.MessageID.String()] = m
		}
		last := map[string]int{}
		for _, r := range recs {
			m := want[recordID(r)]
			if m == nil {
				t.Fatalf("record %q at %d/%d: unknown message id", r.Value, r.Partition, r.Offset)
			}
			if !r.Attrs.IsTransactional() || r.ProducerID < 0 {
				t.Errorf("record %q: transactional %v, producer id %d; want a transactional record", r.Value, r.Attrs.IsTransactional(), r.ProducerID)
			}
			if (r.Key == nil) != (m.Key == nil) || string(r.Key) != string(m.Key) || (r.Value == nil) != (m.Value == nil) || string(r.Value) != string(m.Value) {
				t.Errorf("record %s: key %q value %q; want %q, %q", m.MessageID, r.Key, r.Value, m.Key, m.Value)
			}
			if want := len(m.Headers) + 1; len(r.Headers) != want {
				t.Errorf("record %s: %d headers; want %d", m.MessageID, len(r.Headers), want)
			}
			if m.Key != nil && int(r.Partition) != murmur2(m.Key, 3) {
				t.Errorf("record key %q on partition %d; want %d (murmur2)", m.Key, r.Partition, murmur2(m.Key, 3))
			}
			var v int
			fmt.Sscan(string(m.Value), &v)
			if m.Value != nil {
				k := fmt.Sprint(r.Partition)
				if prev, ok := last[k]; ok && v < prev {
					t.Errorf("partition %d: %d after %d; want submission order", r.Partition, v, prev)
				}
				last[k] = v
			}
		}
	})
}

// Without OwnedBuckets, a bucket has no producer: Publish fails with
// relay.ErrFenced and sends nothing.
func TestTxnPublisher_refuses_a_bucket_it_was_not_told_about(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 1, nil)
	p := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
	own(t, p, 0)
	res := p.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(1, topic, "k", "v")}})[0]
	if res.Acknowledged != 0 || !errors.Is(res.Err, relay.ErrFenced) {
		t.Fatalf("Publish(bucket 1) = %d, %v; want 0, relay.ErrFenced", res.Acknowledged, res.Err)
	}
	p.OwnedBuckets(nil)
	res = p.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "v")}})[0]
	if res.Acknowledged != 0 || !errors.Is(res.Err, relay.ErrFenced) {
		t.Fatalf("Publish(bucket 0) after it left the set = %d, %v; want 0, relay.ErrFenced", res.Acknowledged, res.Err)
	}
}

// A second owner's initialisation fences the first: the first one's next
// publish fails with relay.ErrFenced and acknowledges nothing, and nothing it
// sends becomes visible to read_committed consumers.
func TestTxnPublisher_new_owner_fences_the_old_one(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		topic := newTopic(t, b, 2, nil)
		a := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
		own(t, a, 0)
		if res := a.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "a1")}})[0]; res.Err != nil {
			t.Fatalf("A's first Publish = %v", res.Err)
		}
		nb := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
		own(t, nb, 0)
		res := a.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "a2")}})[0]
		if res.Acknowledged != 0 || !errors.Is(res.Err, relay.ErrFenced) || !errors.Is(res.Err, kafka.ProducerFenced) && !errors.Is(res.Err, kafka.InvalidProducerEpoch) {
			t.Fatalf("A's Publish after B's init = %d, %v; want 0, relay.ErrFenced and the broker's error", res.Acknowledged, res.Err)
		}
		// It reads once: one origin, the sentinel's word once at the end.
		if msg := res.Err.Error(); strings.Count(msg, "kafkapub: ") != 1 || !strings.HasSuffix(msg, ": fenced") || strings.Count(msg, ": fenced") != 1 {
			t.Errorf("fenced error = %q; want one \"kafkapub: \" and \": fenced\" once, at the end", msg)
		}
		// Sticky: A never publishes again with that producer.
		if res := a.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "a3")}})[0]; !errors.Is(res.Err, relay.ErrFenced) {
			t.Fatalf("A's next Publish = %v; want relay.ErrFenced", res.Err)
		}
		if res := nb.Publish(context.Background(), [][]*outbox.Message{{bucketMsg(0, topic, "k", "b1")}})[0]; res.Err != nil {
			t.Fatalf("B's Publish = %v", res.Err)
		}
		var got []string
		for _, r := range readIsolated(t, b, topic, kgo.ReadCommitted(), 2, 300*time.Millisecond) {
			got = append(got, string(r.Value))
		}
		if g := strings.Join(got, ","); g != "a1,b1" {
			t.Fatalf("read_committed = %s; want a1,b1", g)
		}
	})
}

// A record the broker rejects aborts the transaction; the rows before it
// are published alone, so the call acknowledges exactly that prefix and
// nothing after it becomes visible.
func TestTxnPublisher_acknowledges_rows_before_a_row_the_broker_rejects(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		topic := newTopic(t, b, 2, map[string]string{"max.message.bytes": "2048"})
		p := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
		own(t, p, 0)
		var batch []*outbox.Message
		for i := range 9 {
			batch = append(batch, bucketMsg(0, topic, fmt.Sprintf("k%d", i%3), fmt.Sprint(i)))
		}
		batch[6].Value = []byte(strings.Repeat("x", 8192))
		res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
		if res.Acknowledged != 6 || !errors.Is(res.Err, kafka.MessageSizeTooLarge) || !errors.Is(res.Err, relay.ErrUnpublishable) {
			t.Fatalf("Publish = %d acknowledged, %v; want 6, MessageSizeTooLarge and relay.ErrUnpublishable", res.Acknowledged, res.Err)
		}
		var got []string
		for _, r := range readIsolated(t, b, topic, kgo.ReadCommitted(), 6, 300*time.Millisecond) {
			got = append(got, string(r.Value))
		}
		if len(got) != 6 {
			t.Fatalf("read_committed = %v; want the 6 rows before the rejected one, once each", got)
		}
		seen := map[string]bool{}
		for _, v := range got {
			if seen[v] || v >= "6" {
				t.Fatalf("read_committed = %v; want rows 0-5 once each", got)
			}
			seen[v] = true
		}
		// The producer goes on: the rows after the culprit publish next.
		if res := p.Publish(context.Background(), [][]*outbox.Message{batch[7:]})[0]; res.Acknowledged != 2 || res.Err != nil {
			t.Fatalf("next Publish = %d, %v; want 2, nil", res.Acknowledged, res.Err)
		}
	})
}
