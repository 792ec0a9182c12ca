package kafkapub_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// onPartitions reads want records of topic and returns the values each
// partition holds, in offset order, joined by spaces.
func onPartitions(t *testing.T, b testenv.Broker, topic string, want int) map[int]string {
	t.Helper()
	vals := map[int][]string{}
	for _, r := range b.ReadAll(t, topic, want, 10*time.Second) {
		vals[r.Partition] = append(vals[r.Partition], string(r.Value))
	}
	out := map[int]string{}
	for part, v := range vals {
		out[part] = strings.Join(v, " ")
	}
	return out
}

// Batches whose rows spread over partitions, some partitions shared by
// several batches, go out in one produce request per partition: every
// record lands once, each partition holds its rows in the order of the
// batches and, within each, submission order, and every batch is
// acknowledged whole.
func TestPublishGroup_acknowledges_every_batch_once_in_order(t *testing.T) {
	b := testenv.NewFake(t)
	const parts = 4
	topic := newTopic(t, b, parts, nil)
	p := newPublisher(t, b, kafkapub.Config{})
	// Warm the metadata, so that the produce requests counted below are
	// the group's only.
	if res := p.Publish(context.Background(), [][]*outbox.Message{{msg(topic, "", "warm", 3)}})[0]; res.Err != nil {
		t.Fatalf("warm-up Publish = %+v", res)
	}
	batches := [][]*outbox.Message{
		{msg(topic, "", "a0", 0), msg(topic, "", "a1", 1), msg(topic, "", "a2", 0)},
		{msg(topic, "", "b0", 1), msg(topic, "", "b1", 2)},
		nil, // an empty batch among others
		{msg(topic, "", "c0", 0)},
		{msg(topic, "order-9", "d0"), msg(topic, "order-9", "d1")}, // murmur2 places them
	}
	dPart := murmur2([]byte("order-9"), parts)
	produces := b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true})

	results := p.Publish(context.Background(), batches)
	if len(results) != len(batches) {
		t.Fatalf("PublishGroup returned %d results; want %d", len(results), len(batches))
	}
	total := 0
	for i, batch := range batches {
		if results[i].Acknowledged != len(batch) || results[i].Err != nil {
			t.Errorf("results[%d] = %d, %v; want %d, nil", i, results[i].Acknowledged, results[i].Err, len(batch))
		}
		total += len(batch)
	}
	if n := produces.Hits(); n > parts {
		t.Errorf("%d rows on %d partitions took %d produce requests; want at most %d", total, parts, n, parts)
	}

	recs := b.ReadAll(t, topic, total+1, 10*time.Second)
	seen := map[string]int{}
	for _, r := range recs {
		seen[idOf(r)]++
	}
	for _, batch := range batches {
		for _, m := range batch {
			if n := seen[m.MessageID.String()]; n != 1 {
				t.Errorf("record %s (%s) on the topic %d times; want once", m.MessageID, m.Value, n)
			}
		}
	}
	want := map[int][]string{0: {"a0", "a2", "c0"}, 1: {"a1", "b0"}, 2: {"b1"}, 3: {"warm"}}
	want[dPart] = append(want[dPart], "d0", "d1")
	got := onPartitions(t, b, topic, total+1)
	for part := range parts {
		if w := strings.Join(want[part], " "); got[part] != w {
			t.Errorf("partition %d holds %q; want %q", part, got[part], w)
		}
	}
}

// A row that fails alone fails its batch at that row; a batch on other
// partitions is acknowledged whole; a batch with a later row on the failed
// row's partition (left unsent, as the partition stops at its first
// failure) reports that row unacknowledged with an error that names the
// failed row and is not its own: it wraps neither relay.ErrUnpublishable
// (which counts towards parking) nor the failed row's Kafka error.
func TestPublishGroup_fails_only_rows_behind_a_failed_row(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 3, nil)
	p := newPublisher(t, b, kafkapub.Config{BatchBytes: 1024})
	tooLarge := msg(topic, "", strings.Repeat("x", 2048), 0)
	noPartition := msg(topic, "", "d0", 7)
	batches := [][]*outbox.Message{
		{msg(topic, "", "a0", 0), tooLarge, msg(topic, "", "a2", 0)}, // A
		{msg(topic, "", "b0", 1), msg(topic, "", "b1", 2)},           // B
		{msg(topic, "", "c0", 1), msg(topic, "", "c1", 0)},           // C
		{noPartition, msg(topic, "", "d1", 2)},                       // D
		{msg(topic, "", "e0", 2), msg(topic, "", "e1", 1)},           // E
	}
	res := p.Publish(context.Background(), batches)

	a := res[0]
	if a.Acknowledged != 1 || !errors.Is(a.Err, relay.ErrUnpublishable) || !errors.Is(a.Err, kafka.MessageSizeTooLarge) {
		t.Errorf("A = %d, %v; want 1, relay.ErrUnpublishable and MessageSizeTooLarge", a.Acknowledged, a.Err)
	}
	if r := res[1]; r.Acknowledged != 2 || r.Err != nil {
		t.Errorf("B (other partitions) = %d, %v; want 2, nil", r.Acknowledged, r.Err)
	}
	c := res[2]
	if c.Acknowledged != 1 || c.Err == nil {
		t.Fatalf("C (c1 behind A's failed row on partition 0) = %d, %v; want 1 and an error", c.Acknowledged, c.Err)
	}
	if errors.Is(c.Err, relay.ErrUnpublishable) || errors.Is(c.Err, kafka.MessageSizeTooLarge) {
		t.Errorf("C's error %q wraps relay.ErrUnpublishable or MessageSizeTooLarge; want neither (the row is not at fault)", c.Err)
	}
	for _, want := range []string{batches[2][1].MessageID.String(), tooLarge.MessageID.String(), "not sent"} {
		if !strings.Contains(c.Err.Error(), want) {
			t.Errorf("C's error %q does not say %q", c.Err, want)
		}
	}
	// A row that cannot be placed fails alone and holds nobody back.
	if d := res[3]; d.Acknowledged != 0 || !errors.Is(d.Err, relay.ErrUnpublishable) || !errors.Is(d.Err, kafka.UnknownTopicOrPartition) {
		t.Errorf("D = %d, %v; want 0, relay.ErrUnpublishable and UnknownTopicOrPartition", d.Acknowledged, d.Err)
	}
	if r := res[4]; r.Acknowledged != 2 || r.Err != nil {
		t.Errorf("E = %d, %v; want 2, nil", r.Acknowledged, r.Err)
	}
	// d1 goes out although D fails at d0 (no partition stops for a row
	// that has none), as in a Publish call; D does not count it.
	want := map[int]string{0: "a0", 1: "b0 c0 e1", 2: "b1 d1 e0"}
	got := onPartitions(t, b, topic, 7)
	for part, w := range want {
		if got[part] != w {
			t.Errorf("partition %d holds %q; want %q", part, got[part], w)
		}
	}
}

// When the broker rejects a produce request as a whole, a row of another
// batch in that request reports its request's error when it is transient,
// and not when it is the failed row's own verdict (a topic the relay may
// not write wraps relay.ErrUnpublishable for the row it is reported on
// only).
func TestPublishGroup_shared_request_failure_blames_the_first_row(t *testing.T) {
	for _, tt := range []struct {
		name      string
		err       *kerr.Error
		kafkaErr  error
		propagate bool // the other batch's error wraps kafkaErr
	}{
		{"transient_error_is_everyone's", kerr.NotLeaderForPartition, kafka.NotLeaderForPartition, true},
		{"unpublishable_error_is_the_first_row's", kerr.TopicAuthorizationFailed, kafka.TopicAuthorizationFailed, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := testenv.NewFake(t)
			topic := newTopic(t, b, 1, nil)
			p := newPublisher(t, b, kafkapub.Config{})
			if res := p.Publish(context.Background(), [][]*outbox.Message{{msg(topic, "", "warm", 0)}})[0]; res.Err != nil {
				t.Fatalf("warm-up Publish = %+v", res)
			}
			b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: tt.err, Count: 1})
			first := msg(topic, "", "a0", 0)
			res := p.Publish(context.Background(), [][]*outbox.Message{{first}, {msg(topic, "", "b0", 0)}})
			if res[0].Acknowledged != 0 || !errors.Is(res[0].Err, tt.kafkaErr) {
				t.Fatalf("first batch = %d, %v; want 0, %v", res[0].Acknowledged, res[0].Err, tt.kafkaErr)
			}
			other := res[1]
			if other.Acknowledged != 0 || other.Err == nil {
				t.Fatalf("other batch = %d, %v; want 0 and an error", other.Acknowledged, other.Err)
			}
			if errors.Is(other.Err, relay.ErrUnpublishable) || errors.Is(other.Err, relay.ErrPublisherAuth) {
				t.Errorf("other batch's error %q wraps relay.ErrUnpublishable or ErrPublisherAuth; want neither", other.Err)
			}
			if got := errors.Is(other.Err, tt.kafkaErr); got != tt.propagate {
				t.Errorf("errors.Is(other batch's error %q, %v) = %v; want %v", other.Err, tt.kafkaErr, got, tt.propagate)
			}
			if !strings.Contains(other.Err.Error(), first.MessageID.String()) {
				t.Errorf("other batch's error %q does not name the failed row %s", other.Err, first.MessageID)
			}
		})
	}
}

// PublishGroup with nothing to send, or after Close (idempotent): an empty
// batch gets a zero Result, every other batch ErrClosed after Close.
func TestPublishGroup_empty_and_closed(t *testing.T) {
	b := testenv.NewFake(t)
	p, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs})
	if err != nil {
		t.Fatal(err)
	}
	for _, batches := range [][][]*outbox.Message{nil, {}, {nil, {}}} {
		res := p.Publish(context.Background(), batches)
		if len(res) != len(batches) {
			t.Fatalf("Publish(%d empty batches) = %d results; want %d", len(batches), len(res), len(batches))
		}
		for i, r := range res {
			if r != (relay.Result{}) {
				t.Errorf("Publish(empty)[%d] = %+v; want a zero Result", i, r)
			}
		}
	}
	for range 2 {
		if err := p.Close(); err != nil {
			t.Fatalf("Close = %v", err)
		}
	}
	res := p.Publish(context.Background(), [][]*outbox.Message{{msg("t", "k", "v")}, nil, {msg("t", "k", "w")}})
	for i, want := range []error{kafkapub.ErrClosed, nil, kafkapub.ErrClosed} {
		if res[i].Acknowledged != 0 || !errors.Is(res[i].Err, want) || (want == nil) != (res[i].Err == nil) {
			t.Errorf("PublishGroup after Close: results[%d] = %+v; want error %v", i, res[i], want)
		}
	}
}

// When ctx ends before a partition answers, each batch reports the rows
// acknowledged so far (those on partitions that answered) and ctx's error
// for its first other row.
func TestPublishGroup_reports_only_acknowledged_rows_when_ctx_ends(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 2, nil)
	p := newPublisher(t, b, kafkapub.Config{})
	if res := p.Publish(context.Background(), [][]*outbox.Message{{msg(topic, "", "warm", 0), msg(topic, "", "warm", 1)}})[0]; res.Err != nil {
		t.Fatalf("warm-up Publish = %+v", res)
	}
	// Partition 1's produce requests hang until the end of the test; kafka-go
	// sends concurrent requests on separate connections, so partition 0's
	// are answered meanwhile.
	released := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(released) }) }
	t.Cleanup(release)
	b.Fake.ControlKey(kmsg.Produce.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		b.Fake.KeepControl()
		for _, tp := range r.(*kmsg.ProduceRequest).Topics {
			for _, pp := range tp.Partitions {
				if tp.Topic == topic && pp.Partition == 1 {
					b.Fake.SleepControl(func() { <-released })
				}
			}
		}
		return nil, nil, false
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	batches := [][]*outbox.Message{
		{msg(topic, "", "a0", 0), msg(topic, "", "a1", 1), msg(topic, "", "a2", 0)},
		{msg(topic, "", "b0", 0)},
		{msg(topic, "", "c0", 1)},
	}
	start := time.Now()
	res := p.Publish(ctx, batches)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("PublishGroup took %v past a 2s deadline; want it to return when ctx ends", d)
	}
	for i, want := range []struct {
		acked int
		err   error
	}{{1, context.DeadlineExceeded}, {1, nil}, {0, context.DeadlineExceeded}} {
		r := res[i]
		if r.Acknowledged != want.acked || !errors.Is(r.Err, want.err) || (want.err == nil) != (r.Err == nil) {
			t.Errorf("results[%d] = %d, %v; want %d, %v", i, r.Acknowledged, r.Err, want.acked, want.err)
		}
		if r.Err != nil && errors.Is(r.Err, relay.ErrUnpublishable) {
			t.Errorf("results[%d] error %q wraps relay.ErrUnpublishable; want a transient error", i, r.Err)
		}
	}
	release()
}

// In the transactional mode each batch is its own transaction (one per
// bucket), the buckets' transactions run at once, and read_committed
// consumers see every row once the call returns.
func TestPublishGroup_transactional_commits_a_transaction_per_batch(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 2, nil)
	p := newTestTxnPublisher(t, b, topic, kafkapub.Config{})
	var mu sync.Mutex
	produced := map[int]int{}
	added := map[int]chan struct{}{0: make(chan struct{}), 1: make(chan struct{})}
	setTxnHook(t, p, func(bucket int, step string) {
		switch step {
		case "added":
			close(added[bucket])
			// Each transaction waits for the other's partitions to be
			// added: both are open at once.
			select {
			case <-added[1-bucket]:
			case <-time.After(10 * time.Second):
				t.Errorf("bucket %d: the other bucket's transaction did not start while this one was open", bucket)
			}
		case "produced":
			mu.Lock()
			produced[bucket]++
			mu.Unlock()
		}
	})
	own(t, p, 0, 1)
	batches := [][]*outbox.Message{
		{bucketMsg(0, topic, "k0", "0-0"), bucketMsg(0, topic, "k1", "0-1")},
		{bucketMsg(1, topic, "k2", "1-0"), bucketMsg(1, topic, "k0", "1-1"), bucketMsg(1, topic, "k3", "1-2")},
	}
	res := p.Publish(context.Background(), batches)
	for i, batch := range batches {
		if res[i].Acknowledged != len(batch) || res[i].Err != nil {
			t.Errorf("results[%d] = %d, %v; want %d, nil", i, res[i].Acknowledged, res[i].Err, len(batch))
		}
	}
	if produced[0] != 1 || produced[1] != 1 {
		t.Errorf("transactions produced per bucket = %v; want one each", produced)
	}
	recs := readIsolated(t, b, topic, kgo.ReadCommitted(), 5, 300*time.Millisecond)
	seen := map[string]int{}
	for _, r := range recs {
		seen[recordID(r)]++
	}
	for _, batch := range batches {
		for _, m := range batch {
			if seen[m.MessageID.String()] != 1 {
				t.Errorf("record %s seen %d times by read_committed; want once", m.Value, seen[m.MessageID.String()])
			}
		}
	}
}

// In the transactional mode, batches of one bucket go in order, and a
// batch after one of its bucket that failed is not sent.
func TestPublishGroup_transactional_stops_a_bucket_at_its_failed_batch(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 1, nil)
	p := newTestTxnPublisher(t, b, topic, kafkapub.Config{BatchBytes: 1024})
	own(t, p, 0, 1)
	tooLarge := bucketMsg(0, topic, "k", strings.Repeat("x", 2048))
	batches := [][]*outbox.Message{
		{bucketMsg(0, topic, "k", "0-0"), tooLarge},
		{bucketMsg(0, topic, "k", "0-2")},
		{bucketMsg(1, topic, "k", "1-0")},
	}
	res := p.Publish(context.Background(), batches)
	if res[0].Acknowledged != 1 || !errors.Is(res[0].Err, relay.ErrUnpublishable) {
		t.Errorf("results[0] = %d, %v; want 1, relay.ErrUnpublishable", res[0].Acknowledged, res[0].Err)
	}
	if r := res[1]; r.Acknowledged != 0 || r.Err == nil || errors.Is(r.Err, relay.ErrUnpublishable) || !strings.Contains(r.Err.Error(), tooLarge.MessageID.String()) {
		t.Errorf("results[1] = %d, %v; want 0 and an error naming %s, not relay.ErrUnpublishable", r.Acknowledged, r.Err, tooLarge.MessageID)
	}
	if r := res[2]; r.Acknowledged != 1 || r.Err != nil {
		t.Errorf("results[2] (another bucket) = %d, %v; want 1, nil", r.Acknowledged, r.Err)
	}
	var got []string
	for _, r := range readIsolated(t, b, topic, kgo.ReadCommitted(), 2, 300*time.Millisecond) {
		got = append(got, string(r.Value))
	}
	if len(got) != 2 || strings.Contains(strings.Join(got, " "), "0-2") {
		t.Errorf("read_committed = %v; want 0-0 and 1-0 only", got)
	}
}
