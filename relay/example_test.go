package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// A relay publishes the pending rows of an in-memory store with a fake
// publisher, deletes them once acknowledged, and stops gracefully. With a
// database, use gormstore.New and kafkapub.New instead.
func Example() {
	store := relaytest.NewMemStore(relay.DefaultBucketCount, nil)
	store.Add(
		outbox.NewStringMessage("orders", "order-1", "created"),
		outbox.NewStringMessage("orders", "order-1", "paid"),
		outbox.NewStringMessage("orders", "order-1", "shipped"),
	)
	pub := relaytest.NewPublisher()
	r, err := relay.New(store, pub, relay.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for store.Len() > 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	for _, m := range pub.Acknowledged() {
		fmt.Printf("%s %s=%s\n", m.Topic, m.Key, m.Value)
	}
	// Output:
	// orders order-1=created
	// orders order-1=paid
	// orders order-1=shipped
}

// The notifier exists before the relay, so the GORM plugin can be
// registered first; a commit hint for an owned bucket wakes the relay.
func ExampleNewNotifier() {
	n := relay.NewNotifier()
	// db.Use(outbox.Plugin{Notifier: n}) would go here.
	store := relaytest.NewMemStore(relay.DefaultBucketCount, nil)
	r, err := relay.New(store, relaytest.NewPublisher(), relay.Options{Notifier: n, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Notifier() == n)
	// Output: true
}
