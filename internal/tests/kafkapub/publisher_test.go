package kafkapub_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// newTopic creates a fresh topic named after the test on b.
func newTopic(t testing.TB, b testenv.Broker, partitions int, configs map[string]string) string {
	t.Helper()
	name := regexp.MustCompile(`[^a-zA-Z0-9._-]+`).ReplaceAllString(t.Name(), "_")
	if len(name) > 180 {
		name = name[:180]
	}
	topic := fmt.Sprintf("%s-%08x", name, rand.Uint32())
	b.CreateTopic(t, topic, partitions, configs)
	return topic
}

// newPublisher returns a publisher on b, closed at cleanup.
func newPublisher(t testing.TB, b testenv.Broker, cfg kafkapub.Config) *kafkapub.Publisher {
	t.Helper()
	cfg.Brokers = b.Addrs
	p, err := kafkapub.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
	return p
}

func msg(topic string, key, value string, partition ...int32) *outbox.Message {
	m := &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: []byte(key), Value: []byte(value)}
	if len(partition) > 0 {
		m.Partition = &partition[0]
	}
	return m
}

// byID indexes records by their message-id header.
func byID(t testing.TB, recs []kafka.Message) map[string]kafka.Message {
	t.Helper()
	out := make(map[string]kafka.Message)
	for _, r := range recs {
		out[idOf(r)] = r
	}
	return out
}

func idOf(r kafka.Message) string {
	id := ""
	for _, h := range r.Headers {
		if h.Key == kafkapub.DefaultMessageIDHeader {
			id = string(h.Value)
		}
	}
	return id
}

// captureProduced records every record of the uncompressed produce
// requests c receives from now on, by message-id header; the returned
// function reads what was captured.
func captureProduced(t testing.TB, c *kfake.Cluster) func() map[string]kmsg.Record {
	t.Helper()
	var mu sync.Mutex
	got := make(map[string]kmsg.Record)
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true, When: func(r kmsg.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, tp := range r.(*kmsg.ProduceRequest).Topics {
			for _, pp := range tp.Partitions {
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(pp.Records); err != nil {
					continue
				}
				buf := rb.Records
				for range rb.NumRecords {
					l, n := binary.Varint(buf)
					if n <= 0 || int(l)+n > len(buf) {
						break
					}
					var rec kmsg.Record
					if err := rec.ReadFrom(buf[:n+int(l)]); err == nil {
						for _, h := range rec.Headers {
							if h.Key == kafkapub.DefaultMessageIDHeader {
								got[string(h.Value)] = rec
							}
						}
					}
					buf = buf[n+int(l):]
				}
			}
		}
		return true
	}})
	return func() map[string]kmsg.Record {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(got)
	}
}

func murmur2(key []byte, n int) int {
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	return kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: key}, parts...)
}

func TestKafkaPublisher_hook_cannot_downgrade_invariants(t *testing.T) {
	b := testenv.NewFake(t)
	// The writer the hook was given holds the publisher's settings: New
	// sets acks=all and caps the write timeout after the hook ran, and the
	// writer's own batching, balancing, attempts and topic are not used.
	var w *kafka.Writer
	var completed, completedErrs, logged, errLogged atomic.Int64
	p := newPublisher(t, b, kafkapub.Config{Configure: func(hooked *kafka.Writer) {
		w = hooked
		w.RequiredAcks = kafka.RequireNone
		w.Balancer = &kafka.Hash{}
		w.BatchTimeout = time.Second
		w.BatchSize = 1
		w.Async = true
		w.Topic = "hooked"
		w.MaxAttempts = 3 // not used: one attempt per request, the relay retries
		w.WriteTimeout = time.Hour
		w.Compression = kafka.Snappy // kept
		w.Completion = func(msgs []kafka.Message, err error) {
			completed.Add(int64(len(msgs)))
			if err != nil {
				completedErrs.Add(1)
			}
		}
		w.Logger = kafka.LoggerFunc(func(string, ...any) { logged.Add(1) })
		w.ErrorLogger = kafka.LoggerFunc(func(string, ...any) { errLogged.Add(1) })
	}})
	if w.RequiredAcks != kafka.RequireAll {
		t.Errorf("writer RequiredAcks = %v; want RequireAll", w.RequiredAcks)
	}
	if w.WriteTimeout != kafkapub.DefaultPublishTimeout {
		t.Errorf("writer WriteTimeout = %v; want PublishTimeout's default %v", w.WriteTimeout, kafkapub.DefaultPublishTimeout)
	}

	// On the wire: every produce request asks for acks=all, and keys land
	// where murmur2 puts them (not where the hook's Hash balancer would).
	topic := newTopic(t, b, 8, nil)
	notAll := b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true,
		When: func(r kmsg.Request) bool { return r.(*kmsg.ProduceRequest).Acks != -1 }})
	produces := b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true})
	uncompressed := b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true,
		When: func(r kmsg.Request) bool {
			for _, tp := range r.(*kmsg.ProduceRequest).Topics {
				for _, pp := range tp.Partitions {
					var rb kmsg.RecordBatch
					if err := rb.ReadFrom(pp.Records); err != nil || rb.Attributes&0x7 != int16(kafka.Snappy) {
						return true
					}
				}
			}
			return false
		}})
	var batch []*outbox.Message
	for i := range 16 {
		batch = append(batch, msg(topic, fmt.Sprintf("key-%d", i), "v"))
	}
	if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Acknowledged != len(batch) || res.Err != nil {
		t.Fatalf("Publish = %+v; want %d acknowledged", res, len(batch))
	}
	if notAll.Hits() != 0 || produces.Hits() == 0 {
		t.Errorf("produce requests without acks=all = %d of %d; want 0 of > 0", notAll.Hits(), produces.Hits())
	}
	if uncompressed.Hits() != 0 {
		t.Errorf("produce requests not compressed with the hook's Snappy = %d of %d; want 0", uncompressed.Hits(), produces.Hits())
	}
	got := byID(t, b.ReadAll(t, topic, len(batch), 10*time.Second))
	for _, m := range batch {
		r, ok := got[m.MessageID.String()]
		if !ok {
			t.Fatalf("record %s missing", m.MessageID)
		}
		if want := murmur2(m.Key, 8); r.Partition != want {
			t.Errorf("key %q on partition %d; want murmur2's %d", m.Key, r.Partition, want)
		}
	}
	if completed.Load() != int64(len(batch)) || completedErrs.Load() != 0 || logged.Load() != int64(produces.Hits()) {
		t.Errorf("the writer's Completion saw %d rows (%d errors), its Logger %d writes; want %d rows, 0 errors, %d writes (one per request)",
			completed.Load(), completedErrs.Load(), logged.Load(), len(batch), produces.Hits())
	}

	// One attempt per request, whatever MaxAttempts the hook set: a
	// request the broker fails once fails the Publish, and the writer's
	// ErrorLogger and Completion are told.
	before := produces.Hits()
	b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: 1})
	res := p.Publish(context.Background(), [][]*outbox.Message{{msg(topic, "key-0", "v")}})[0]
	if res.Acknowledged != 0 || !errors.Is(res.Err, kafka.NotEnoughReplicas) {
		t.Errorf("Publish with a failing produce = %+v; want 0 acknowledged, NOT_ENOUGH_REPLICAS", res)
	}
	if n := produces.Hits() - before; n != 1 {
		t.Errorf("produce requests for a failing row = %d; want 1 (no retry inside the publisher)", n)
	}
	if errLogged.Load() != 1 || completedErrs.Load() != 1 {
		t.Errorf("the writer's ErrorLogger saw %d errors, its Completion %d; want 1 and 1", errLogged.Load(), completedErrs.Load())
	}
}

func TestKafkaPublisher_round_trips_records(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		const parts = 8
		topic := newTopic(t, b, parts, nil)
		p := newPublisher(t, b, kafkapub.Config{})

		withHeaders := msg(topic, "order-1", `{"n":1}`)
		withHeaders.Headers = outbox.Headers{
			{Key: "b", Value: []byte("2")},
			{Key: kafkapub.DefaultMessageIDHeader, Value: []byte("caller's, replaced")},
			{Key: "a", Value: []byte("1")},
			{Key: "b", Value: []byte("dup")},
		}
		emptyKey := msg(topic, "", "empty key")
		tombstone := &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: []byte("gone")}
		emptyValue := msg(topic, "k", "")
		pinned := msg(topic, "order-1", "pinned", 5)
		batch := []*outbox.Message{withHeaders, emptyKey, tombstone, emptyValue, pinned}
		for i := range 32 {
			batch = append(batch, &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Value: []byte(fmt.Sprint(i))})
		}
		var wire func() map[string]kmsg.Record
		if b.Fake != nil {
			wire = captureProduced(t, b.Fake)
		}
		res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
		if res.Acknowledged != len(batch) || res.Err != nil {
			t.Fatalf("Publish = %+v; want %d acknowledged, nil error", res, len(batch))
		}
		got := byID(t, b.ReadAll(t, topic, len(batch), 20*time.Second))
		if len(got) != len(batch) {
			t.Fatalf("read %d distinct records; want %d", len(got), len(batch))
		}
		spread := map[int]bool{}
		for _, m := range batch {
			r := got[m.MessageID.String()]
			if r.Topic != topic || !bytes.Equal(r.Key, m.Key) || !bytes.Equal(r.Value, m.Value) {
				t.Errorf("record %s = key %q value %q; want key %q value %q", m.MessageID, r.Key, r.Value, m.Key, m.Value)
			}
			// kafka-go's reader turns an empty key or value into nil, so
			// nil-ness is checked on the wire (kfake only).
			if wire != nil {
				w, ok := wire()[m.MessageID.String()]
				if !ok {
					t.Fatalf("record %s not seen in a produce request", m.MessageID)
				}
				if (w.Key == nil) != (m.Key == nil) || (w.Value == nil) != (m.Value == nil) {
					t.Errorf("record %s sent with key nil %v, value nil %v; want %v, %v", m.MessageID, w.Key == nil, w.Value == nil, m.Key == nil, m.Value == nil)
				}
			}
			switch {
			case m.Partition != nil:
				if r.Partition != int(*m.Partition) {
					t.Errorf("pinned record on partition %d; want %d", r.Partition, *m.Partition)
				}
			case m.Key != nil:
				if want := murmur2(m.Key, parts); r.Partition != want {
					t.Errorf("key %q on partition %d; want murmur2's %d", m.Key, r.Partition, want)
				}
			default:
				spread[r.Partition] = true
			}
		}
		if len(spread) < 2 {
			t.Errorf("32 keyless records used %d partitions; want them spread over several", len(spread))
		}

		r := got[withHeaders.MessageID.String()]
		var hs []string
		for _, h := range r.Headers {
			hs = append(hs, h.Key+"="+string(h.Value))
		}
		want := []string{"b=2", "a=1", "b=dup", kafkapub.DefaultMessageIDHeader + "=" + withHeaders.MessageID.String()}
		if strings.Join(hs, " ") != strings.Join(want, " ") {
			t.Errorf("headers = %q; want %q", hs, want)
		}
		if id := idOf(r); len(id) != 36 || id != strings.ToLower(id) {
			t.Errorf("message id header = %q; want 36-char lowercase", id)
		}
	})
}

func TestKafkaPublisher_stamps_configured_message_id_header(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 1, nil)
	p := newPublisher(t, b, kafkapub.Config{MessageIDHeader: "id"})
	m := msg(topic, "k", "v")
	if res := p.Publish(context.Background(), [][]*outbox.Message{{m}})[0]; res.Err != nil {
		t.Fatalf("Publish = %+v", res)
	}
	recs := b.ReadAll(t, topic, 1, 10*time.Second)
	if len(recs) != 1 || len(recs[0].Headers) != 1 || recs[0].Headers[0].Key != "id" || string(recs[0].Headers[0].Value) != m.MessageID.String() {
		t.Fatalf("records = %+v; want one with header id=%s", recs, m.MessageID)
	}
}

// TestKafkaPublisher_keeps_key_order_after_rejected_row is the reference
// design's rows 1, 2, 3 scenario: row 1 is too large for the topic, rows 2
// and 3 share its key. The reference's consumer sees 2, 3, 1; ours 1, 2, 3.
func TestKafkaPublisher_keeps_key_order_after_rejected_row(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		topic := newTopic(t, b, 3, map[string]string{"max.message.bytes": "2048"})
		p := newPublisher(t, b, kafkapub.Config{})
		row1 := msg(topic, "order-7", strings.Repeat("x", 8192))
		row2 := msg(topic, "order-7", "2")
		row3 := msg(topic, "order-7", "3")
		batch := []*outbox.Message{row1, row2, row3}

		res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
		if res.Acknowledged != 0 || !errors.Is(res.Err, kafka.MessageSizeTooLarge) {
			t.Fatalf("Publish = %+v; want 0 acknowledged and MessageSizeTooLarge", res)
		}
		if !strings.Contains(res.Err.Error(), row1.MessageID.String()) {
			t.Errorf("error %q does not name row 1 (%s)", res.Err, row1.MessageID)
		}

		row1.Value = []byte("1") // repaired, same message id
		if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Acknowledged != 3 || res.Err != nil {
			t.Fatalf("retry Publish = %+v; want 3 acknowledged", res)
		}
		// Nothing of the failed attempt was appended: the topic holds exactly
		// the three records of the retry.
		recs := b.ReadAll(t, topic, 3, 10*time.Second)
		if len(recs) != 3 {
			t.Errorf("topic holds %d records; want 3 (none from the failed attempt)", len(recs))
		}
		seen := map[string]bool{}
		var order []string
		for _, r := range recs {
			if id := idOf(r); !seen[id] {
				seen[id] = true
				order = append(order, string(r.Value))
			}
		}
		if got := strings.Join(order, ","); got != "1,2,3" {
			t.Errorf("deduplicated consumer order = %s; want 1,2,3", got)
		}
	})
}

func TestKafkaPublisher_stops_failed_partition_while_others_proceed(t *testing.T) {
	poison := []byte("poison")
	tests := []struct {
		name string
		// fault fails produce requests to partition 1 of topic.
		fault   func(topic string) kfake.Fault
		wantAck int
		wantErr error
		// wantOnP1 is the values that must land on partition 1.
		wantOnP1 []string
	}{
		{
			// A record error rejects the whole request; the publisher
			// resends in halves, so rows before the culprit still land.
			name: "record_error_fails_only_the_culprit_and_later_rows",
			fault: func(topic string) kfake.Fault {
				return kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{1}, Err: kerr.InvalidRecord, Count: -1,
					When: func(r kmsg.Request) bool {
						for _, tp := range r.(*kmsg.ProduceRequest).Topics {
							for _, pp := range tp.Partitions {
								if bytes.Contains(pp.Records, poison) {
									return true
								}
							}
						}
						return false
					}}
			},
			wantAck:  4,
			wantErr:  kafka.InvalidRecord,
			wantOnP1: []string{"r1", "r3"},
		},
		{
			name: "partition_error_fails_the_partition_from_its_first_row",
			fault: func(topic string) kfake.Fault {
				return kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{1}, Err: kerr.TopicAuthorizationFailed, Count: -1}
			},
			wantAck: 1,
			wantErr: kafka.TopicAuthorizationFailed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := testenv.NewFake(t)
			topic := newTopic(t, b, 3, nil)
			b.Fake.Fault(tt.fault(topic))
			p := newPublisher(t, b, kafkapub.Config{})
			parts := []int32{0, 1, 2, 1, 1, 0, 1, 2}
			var batch []*outbox.Message
			for i, part := range parts {
				v := fmt.Sprintf("r%d", i)
				if i == 4 {
					v = "r4-" + string(poison)
				}
				batch = append(batch, msg(topic, "", v, part))
			}
			res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
			if res.Acknowledged != tt.wantAck || !errors.Is(res.Err, tt.wantErr) {
				t.Fatalf("Publish = %d acknowledged, %v; want %d, %v", res.Acknowledged, res.Err, tt.wantAck, tt.wantErr)
			}
			if !strings.Contains(res.Err.Error(), batch[tt.wantAck].MessageID.String()) {
				t.Errorf("error %q does not name row %d", res.Err, tt.wantAck)
			}
			onPart := onPartitions(t, b, topic, 4+len(tt.wantOnP1))
			want := map[int]string{0: "r0 r5", 1: strings.Join(tt.wantOnP1, " "), 2: "r2 r7"}
			for part, w := range want {
				if got := onPart[part]; got != w {
					t.Errorf("partition %d holds %q; want %q", part, got, w)
				}
			}
		})
	}
}

func TestKafkaPublisher_fails_row_above_batch_bytes_without_failing_earlier_rows(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 2, nil)
	p := newPublisher(t, b, kafkapub.Config{BatchBytes: 1024})
	batch := []*outbox.Message{
		msg(topic, "", "a0", 0),
		msg(topic, "", "a1", 0),
		msg(topic, "", strings.Repeat("x", 2048), 0),
		msg(topic, "", "b0", 1),
		msg(topic, "", "a3", 0),
		msg(topic, "", "b1", 1),
	}
	res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
	if res.Acknowledged != 2 || !errors.Is(res.Err, kafka.MessageSizeTooLarge) {
		t.Fatalf("Publish = %d acknowledged, %v; want 2, MessageSizeTooLarge", res.Acknowledged, res.Err)
	}
	onPart := onPartitions(t, b, topic, 4)
	for part, w := range map[int]string{0: "a0 a1", 1: "b0 b1"} {
		if g := onPart[part]; g != w {
			t.Errorf("partition %d holds %q; want %q", part, g, w)
		}
	}
}

func TestKafkaPublisher_sends_large_batch_in_a_handful_of_requests(t *testing.T) {
	b := testenv.NewFake(t)
	const parts = 8
	topic := newTopic(t, b, parts, nil)
	p := newPublisher(t, b, kafkapub.Config{})
	produces := b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true})
	value := bytes.Repeat([]byte("v"), 1024)
	var batch []*outbox.Message
	for i := range 500 {
		batch = append(batch, &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: []byte(fmt.Sprint("key-", i)), Value: value})
	}
	if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Acknowledged != 500 || res.Err != nil {
		t.Fatalf("Publish = %+v; want 500 acknowledged", res)
	}
	if n := produces.Hits(); n > parts {
		t.Errorf("500 rows on %d partitions took %d produce requests; want at most %d", parts, n, parts)
	}
}

// A partition's rows beyond MaxBatchRecords go in several requests, in
// order; once one of them fails, no later row of the call goes to the
// partition, where it would land ahead of the failed rows' retry.
func TestKafkaPublisher_chunks_partition_in_order_and_stops_it_at_a_failed_request(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 1, nil)
	p := newPublisher(t, b, kafkapub.Config{MaxBatchRecords: 4})
	produces := b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true})
	var batch []*outbox.Message
	for i := range 10 {
		batch = append(batch, msg(topic, "k", fmt.Sprint(i)))
	}
	if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Acknowledged != 10 || res.Err != nil {
		t.Fatalf("Publish = %+v; want 10 acknowledged", res)
	}
	if n := produces.Hits(); n != 3 {
		t.Errorf("10 rows with MaxBatchRecords 4 took %d produce requests; want 3", n)
	}

	var seen []kmsg.Request // When runs on the broker's goroutine alone
	b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, When: func(r kmsg.Request) bool {
		if !slices.Contains(seen, r) {
			seen = append(seen, r)
		}
		return len(seen) == 2 // the second request of the next call
	}})
	if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Acknowledged != 4 || !errors.Is(res.Err, kafka.NotEnoughReplicas) {
		t.Fatalf("Publish with its second request failing = %d acknowledged, %v; want 4, NotEnoughReplicas", res.Acknowledged, res.Err)
	}
	if n := produces.Hits() - 3; n != 2 {
		t.Errorf("the call took %d produce requests; want 2: none after the failed one", n)
	}
	if g := onPartitions(t, b, topic, 14)[0]; g != "0 1 2 3 4 5 6 7 8 9 0 1 2 3" {
		t.Errorf("partition holds %s; want 0..9 in order, then 0..3", g)
	}
}

func TestKafkaPublisher_reports_only_acknowledged_rows_on_cancel(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 1, nil)
	p := newPublisher(t, b, kafkapub.Config{})
	h := holdFirstProduce(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := publishAsync(ctx, p, msg(topic, "k", "stuck"), msg(topic, "k", "next"))
	<-h.entered
	cancel()
	if res := <-done; res.Acknowledged != 0 || !errors.Is(res.Err, context.Canceled) {
		t.Fatalf("Publish after cancel = %+v; want 0 acknowledged, context.Canceled", res)
	}

	// The handed-over records may still land; a later call on the same
	// partition waits for them and comes after them.
	later := publishAsync(context.Background(), p, msg(topic, "k", "later"))
	h.release()
	if res := <-later; res.Err != nil {
		t.Fatalf("later Publish = %+v", res)
	}
	if g := onPartitions(t, b, topic, 3)[0]; g != "stuck next later" {
		t.Errorf("partition holds %s; want stuck next later", g)
	}
}

// A broker rejects a whole partition request for one too-large record; the
// publisher resends in halves so the rows before it are still acknowledged
// and nothing after it on that partition is appended.
func TestKafkaPublisher_acknowledges_rows_before_a_row_the_broker_rejects(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		topic := newTopic(t, b, 1, map[string]string{"max.message.bytes": "2048"})
		p := newPublisher(t, b, kafkapub.Config{})
		batch := []*outbox.Message{
			msg(topic, "k", "1"), msg(topic, "k", "2"), msg(topic, "k", "3"),
			msg(topic, "k", strings.Repeat("x", 8192)),
			msg(topic, "k", "5"),
		}
		res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]
		if res.Acknowledged != 3 || !errors.Is(res.Err, kafka.MessageSizeTooLarge) {
			t.Fatalf("Publish = %d acknowledged, %v; want 3, MessageSizeTooLarge", res.Acknowledged, res.Err)
		}
		if g := onPartitions(t, b, topic, 3)[0]; g != "1 2 3" {
			t.Errorf("partition holds %s; want 1,2,3 (nothing after the rejected row)", g)
		}
	})
}
