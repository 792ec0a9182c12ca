package kafkapub_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// heldProduce makes the in-process broker hold its first produce request
// until release is called, and records how many records each produce
// request carried; entered is closed once the first arrived.
type heldProduce struct {
	mu      sync.Mutex
	sizes   []int
	entered chan struct{}
	wake    chan struct{}
}

func holdFirstProduce(t *testing.T, b testenv.Broker) *heldProduce {
	h := &heldProduce{entered: make(chan struct{}), wake: make(chan struct{})}
	b.Fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		n := 0
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, pp := range tp.Partitions {
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(pp.Records); err != nil {
					t.Errorf("decode a produce request's record batch: %v", err)
				}
				n += int(rb.NumRecords)
			}
		}
		h.mu.Lock()
		h.sizes = append(h.sizes, n)
		first := len(h.sizes) == 1
		h.mu.Unlock()
		if first {
			close(h.entered)
			b.Fake.SleepControl(func() { <-h.wake })
		}
		return nil, nil, false // observe only: the broker handles it
	})
	t.Cleanup(h.release)
	return h
}

func (h *heldProduce) release() {
	select {
	case <-h.wake:
	default:
		close(h.wake)
	}
}

// requestSizes returns the records of each produce request so far.
func (h *heldProduce) requestSizes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.sizes...)
}

// awaitWaiting waits until n calls wait on the lane of topic's partition 0
// of p (the only partition the lane tests publish to), besides the call
// whose request the broker holds: until n+1 goroutines are blocked in the
// lane's wait (kafkapub's publishPartition, seen in the goroutines' stacks:
// the lane's queue is not exported). A call that stopped waiting is no
// longer counted.
func awaitWaiting(t *testing.T, p *kafkapub.Publisher, topic string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := waitingCalls() - 1
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls wait on the partition after 10 s; want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitingCalls counts the goroutines blocked in a select of kafkapub's
// publishPartition (a call waiting for its rows on a partition's lane).
func waitingCalls() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, " [select") && strings.Contains(g, "kafkapub.(*Publisher).publishPartition(") {
			count++
		}
	}
	return count
}

// publishAsync starts p.Publish of batch and returns its result's channel.
func publishAsync(ctx context.Context, p *kafkapub.Publisher, batch ...*outbox.Message) <-chan relay.Result {
	ch := make(chan relay.Result, 1)
	go func() { ch <- p.Publish(ctx, [][]*outbox.Message{batch})[0] }()
	return ch
}

// heldPartition is a publisher on a one-partition topic of the in-process
// broker whose first produce request (the row "held", its Publish result in
// first) the broker holds until h.release.
type heldPartition struct {
	b     testenv.Broker
	topic string
	p     *kafkapub.Publisher
	h     *heldProduce
	first <-chan relay.Result
}

func holdPartition(t *testing.T, configs map[string]string) heldPartition {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 1, configs)
	p := newPublisher(t, b, kafkapub.Config{})
	h := holdFirstProduce(t, b)
	first := publishAsync(context.Background(), p, msg(topic, "k", "held"))
	<-h.entered
	return heldPartition{b, topic, p, h, first}
}

func TestPublish_calls_waiting_on_a_partition_share_one_request(t *testing.T) {
	hp := holdPartition(t, nil)
	b, topic, p, h, first := hp.b, hp.topic, hp.p, hp.h, hp.first

	var later []<-chan relay.Result
	for i, vals := range [][]string{{"a1", "a2"}, {"b1"}, {"c1", "c2", "c3"}} {
		var batch []*outbox.Message
		for _, v := range vals {
			batch = append(batch, msg(topic, v[:1], v))
		}
		later = append(later, publishAsync(context.Background(), p, batch...))
		awaitWaiting(t, p, topic, i+1)
	}
	h.release()

	if res := <-first; res.Acknowledged != 1 || res.Err != nil {
		t.Fatalf("first Publish = %+v; want 1 acknowledged", res)
	}
	for i, want := range []int{2, 1, 3} {
		if res := <-later[i]; res.Acknowledged != want || res.Err != nil {
			t.Errorf("waiting Publish %d = %+v; want %d acknowledged", i, res, want)
		}
	}
	if got := h.requestSizes(); len(got) != 2 || got[0] != 1 || got[1] != 6 {
		t.Errorf("produce requests carried %v records; want [1 6]: the three waiting calls in one request", got)
	}
	if g := onPartitions(t, b, topic, 7)[0]; g != "held a1 a2 b1 c1 c2 c3" {
		t.Errorf("partition holds %s; want held a1 a2 b1 c1 c2 c3 (calls in order of arrival)", g)
	}
}

func TestPublish_shared_request_rejected_for_one_record_fails_only_that_call_from_the_record(t *testing.T) {
	hp := holdPartition(t, map[string]string{"max.message.bytes": "2048"})
	b, topic, p, h, first := hp.b, hp.topic, hp.p, hp.h, hp.first

	a := publishAsync(context.Background(), p, msg(topic, "a", "a1"), msg(topic, "a", "a2"))
	awaitWaiting(t, p, topic, 1)
	bad := publishAsync(context.Background(), p, msg(topic, "b", "b1"), msg(topic, "b", strings.Repeat("x", 8192)), msg(topic, "b", "b3"))
	awaitWaiting(t, p, topic, 2)
	h.release()

	if res := <-first; res.Acknowledged != 1 || res.Err != nil {
		t.Fatalf("first Publish = %+v; want 1 acknowledged", res)
	}
	if res := <-a; res.Acknowledged != 2 || res.Err != nil {
		t.Errorf("Publish beside the culprit's = %+v; want both rows acknowledged", res)
	}
	if res := <-bad; res.Acknowledged != 1 || !errors.Is(res.Err, kafka.MessageSizeTooLarge) || !errors.Is(res.Err, relay.ErrUnpublishable) {
		t.Errorf("culprit's Publish = %d acknowledged, %v; want 1, MessageSizeTooLarge and ErrUnpublishable", res.Acknowledged, res.Err)
	}
	if g := onPartitions(t, b, topic, 4)[0]; g != "held a1 a2 b1" {
		t.Errorf("partition holds %s; want held a1 a2 b1 (nothing from the rejected row on)", g)
	}
}

func TestPublish_call_that_stopped_waiting_sends_nothing(t *testing.T) {
	hp := holdPartition(t, nil)
	b, topic, p, h, first := hp.b, hp.topic, hp.p, hp.h, hp.first

	ctx, cancel := context.WithCancel(context.Background())
	gone := publishAsync(ctx, p, msg(topic, "g", "gone"))
	awaitWaiting(t, p, topic, 1)
	cancel()
	if res := <-gone; res.Acknowledged != 0 || !errors.Is(res.Err, context.Canceled) {
		t.Fatalf("cancelled Publish = %+v; want 0 acknowledged, context.Canceled", res)
	}
	next := publishAsync(context.Background(), p, msg(topic, "n", "next"))
	awaitWaiting(t, p, topic, 1) // next; the cancelled call left
	h.release()

	if res := <-first; res.Err != nil {
		t.Fatalf("first Publish = %+v", res)
	}
	if res := <-next; res.Acknowledged != 1 || res.Err != nil {
		t.Fatalf("next Publish = %+v; want 1 acknowledged", res)
	}
	if got := h.requestSizes(); len(got) != 2 || got[1] != 1 {
		t.Errorf("produce requests carried %v records; want [1 1]: the cancelled call's row not sent", got)
	}
	if g := onPartitions(t, b, topic, 2)[0]; g != "held next" {
		t.Errorf("partition holds %s; want held next", g)
	}
}
