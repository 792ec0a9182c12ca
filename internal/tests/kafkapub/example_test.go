package kafkapub_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// ExampleNew (kafkapub's own is compiled only) publishes two rows of one key to an in-process
// broker (kfake; no Kafka needed) and reads them back in order, each with
// its message-id header.
func ExampleNew() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	pub, err := kafkapub.New(kafkapub.Config{
		Brokers: cluster.ListenAddrs(),
		Configure: func(w *kafka.Writer) {
			w.WriteTimeout = 5 * time.Second // kept (at most PublishTimeout); acks=all, one attempt per request and placement are the publisher's
		},
	})
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	id1 := outbox.UUID(uuid.MustParse("0b6f2f1e-9b8f-4c1e-8d1a-2f4e5b6c7d01"))
	id2 := outbox.UUID(uuid.MustParse("0b6f2f1e-9b8f-4c1e-8d1a-2f4e5b6c7d02"))
	batch := []*outbox.Message{
		{MessageID: id1, Topic: "orders", Key: []byte("order-42"), Value: []byte("created")},
		{MessageID: id2, Topic: "orders", Key: []byte("order-42"), Value: []byte("paid")},
	}
	res := pub.Publish(context.Background(), [][]*outbox.Message{batch})[0]
	fmt.Println("acknowledged:", res.Acknowledged, "error:", res.Err)

	partition := kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: []byte("order-42")}, 0, 1, 2, 3)
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: cluster.ListenAddrs(), Topic: "orders", Partition: partition, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range batch {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s %s %s=%s\n", m.Key, m.Value, m.Headers[0].Key, m.Headers[0].Value)
	}
	// Output:
	// acknowledged: 2 error: <nil>
	// order-42 created x-outbox-message-id=0b6f2f1e-9b8f-4c1e-8d1a-2f4e5b6c7d01
	// order-42 paid x-outbox-message-id=0b6f2f1e-9b8f-4c1e-8d1a-2f4e5b6c7d02
}
