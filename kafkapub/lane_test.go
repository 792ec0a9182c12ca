package kafkapub

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/gorm-outbox/outbox"
)

// ackingBroker is a kafka.RoundTripper, no *kafka.Transport, that gives
// every topic two partitions and acknowledges every produce request.
type ackingBroker struct{}

func (ackingBroker) RoundTrip(_ context.Context, _ net.Addr, req kafka.Request) (kafka.Response, error) {
	if r, ok := req.(*metadataAPI.Request); ok {
		return &metadataAPI.Response{Topics: []metadataAPI.ResponseTopic{{Name: r.TopicNames[0], Partitions: make([]metadataAPI.ResponsePartition, 2)}}}, nil
	}
	return &produceAPI.Response{Topics: []produceAPI.ResponseTopic{{Partitions: make([]produceAPI.ResponsePartition, 1)}}}, nil
}

// TestIdlePartitionsLeaveNoLane: the publisher keeps a partition's lane
// only while calls use it, so that publishing to ever new topics (dynamic
// names) does not grow its state, whether the calls come one at a time or
// share partitions. Every request goes through Config.Transport, any
// kafka.RoundTripper: nothing listens at the brokers' address.
func TestIdlePartitionsLeaveNoLane(t *testing.T) {
	p, err := New(Config{Brokers: []string{"broker:9092"}, Transport: ackingBroker{}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	lanes := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.lanes)
	}
	publish := func(topic string) {
		batch := []*outbox.Message{{Topic: topic, Key: []byte("a")}, {Topic: topic, Key: []byte("b")}, {Topic: topic, Key: []byte("c")}}
		if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Acknowledged != len(batch) || res.Err != nil {
			t.Errorf("Publish to %s = %+v; want %d acknowledged", topic, res, len(batch))
		}
	}
	for i := range 1000 {
		publish(fmt.Sprint("topic-", i))
		if n := lanes(); n != 0 {
			t.Fatalf("after calls to %d topics returned, the publisher keeps %d lanes; want none", i+1, n)
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				publish(fmt.Sprint("shared-", i%3)) // a lane found as its sender leaves
				publish(fmt.Sprintf("own-%d-%d", g, i))
			}
		})
	}
	wg.Wait()
	if n := lanes(); n != 0 {
		t.Fatalf("after concurrent calls returned, the publisher keeps %d lanes; want none", n)
	}
}
