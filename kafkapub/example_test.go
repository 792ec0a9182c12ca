package kafkapub_test

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// ExampleNew publishes two rows of one key to a broker: both land on the
// key's partition in order, each with its message-id header, and Publish
// returns once the broker acknowledged them (acks=all). It needs a broker,
// so it is compiled, not run; internal/tests/kafkapub runs the same example
// on an in-process broker and checks what a consumer reads.
func ExampleNew() {
	pub, err := kafkapub.New(kafkapub.Config{
		Brokers: []string{"localhost:9092"},
		Configure: func(w *kafka.Writer) {
			w.WriteTimeout = 5 * time.Second // kept (at most PublishTimeout); acks=all, one attempt per request and placement are the publisher's
		},
	})
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	batch := []*outbox.Message{
		outbox.NewStringMessage("orders", "order-42", "created"),
		outbox.NewStringMessage("orders", "order-42", "paid"),
	}
	res := pub.Publish(context.Background(), [][]*outbox.Message{batch})[0]
	fmt.Println("acknowledged:", res.Acknowledged, "error:", res.Err)
}
