package main

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// TestPlaceOrdersPublishesCommittedOrdersOnly tests the quickstart's code
// under test, placeOrders, the way an adopter tests their own service with
// outboxtest: a SQLite database with the outbox plugin and tables, an
// in-process broker and a running relay come from one call and are torn
// down with the test; the test adds its business tables, runs the code
// that writes the rows and their records in one transaction, and reads
// what the relay published.
func TestPlaceOrdersPublishesCommittedOrdersOnly(t *testing.T) {
	env := outboxtest.New(t, outboxtest.Options{})
	if err := env.DB.AutoMigrate(&Order{}); err != nil {
		t.Fatal(err)
	}
	topic := env.Topic(t, partitions)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	committed, rolledBack, err := placeOrders(ctx, env.DB, topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(committed) == 0 || len(rolledBack) == 0 {
		t.Fatalf("placeOrders committed %d orders and rolled back %d; want some of each", len(committed), len(rolledBack))
	}

	// Records waits for at least this many records; a retried publish may
	// add duplicates (same message id), which a consumer skips.
	published := map[string]bool{}
	for _, rec := range env.Records(t, topic, len(committed)) {
		var id string
		for _, h := range rec.Headers {
			if h.Key == kafkapub.DefaultMessageIDHeader {
				id = string(h.Value)
			}
		}
		if id == "" {
			t.Errorf("record %s/%d/%d has no %s header", rec.Topic, rec.Partition, rec.Offset, kafkapub.DefaultMessageIDHeader)
		}
		published[string(rec.Key)] = true
	}
	for id := range committed {
		if !published[id] {
			t.Errorf("committed order %s was not published", id)
		}
	}
	for id := range rolledBack {
		if published[id] {
			t.Errorf("rolled-back order %s was published", id)
		}
	}
}
