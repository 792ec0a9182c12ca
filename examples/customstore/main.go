// Command customstore is the skeleton of a custom relay.Store, for teams
// whose outbox does not live in a GORM database: an in-memory Store (store.go)
// whose methods mark the statement a real backend would run, checked by the
// conformance kit (store_test.go runs storetest.Run; go test ./examples/customstore).
// main runs a relay over it with a publisher that prints what it sends.
//
// It needs nothing but Go: go run ./examples/customstore
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// printer is a relay.Publisher made of one function: it prints each record
// and acknowledges it.
var printer = relay.PublishFunc(func(_ context.Context, batches [][]*outbox.Message) []relay.Result {
	results := make([]relay.Result, len(batches))
	for i, batch := range batches {
		for _, m := range batch {
			fmt.Printf("published %s key=%s value=%s (bucket %d)\n", m.Topic, m.Key, m.Value, m.Bucket)
		}
		results[i].Acknowledged = len(batch)
	}
	return results
})

func main() {
	const buckets = 4
	backend := NewBackend(buckets)
	for i, v := range []string{"created", "paid", "shipped"} {
		m := outbox.NewStringMessage("orders", "order-1", v)
		m.MessageID = outbox.NewUUID()
		m.Bucket = outbox.BucketOf(m.Key, m.Partition, m.MessageID, buckets)
		m.CreatedAt = time.Now().Add(time.Duration(i) * time.Millisecond)
		backend.Insert(m)
	}

	store := NewStore(backend, nil)
	r, err := relay.New(store, printer, relay.Options{Logger: slog.New(slog.DiscardHandler), PollInterval: 10 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, "customstore:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for {
		p, _ := store.PendingMetrics(ctx)
		if p.Count == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "customstore:", err)
		os.Exit(1)
	}
	p, _ := store.PendingMetrics(context.Background())
	fmt.Printf("pending after the relay stopped: %d\n", p.Count)
	if p.Count != 0 {
		os.Exit(1)
	}
}
