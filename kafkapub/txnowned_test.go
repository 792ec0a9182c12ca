package kafkapub

import (
	"maps"
	"slices"
	"testing"
)

// ownedPublisher returns a transactional publisher (on an address nothing
// listens on: the tests never reach a broker) holding initialised
// producers for buckets 0 to n-1, as after an acquisition round.
func ownedPublisher(t testing.TB, n int) *Publisher {
	t.Helper()
	p, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Transactions: &Transactions{Outbox: "owned"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	for b := range n {
		prod := &txnProducer{bucket: b, id: p.txn.TransactionalID(b), ready: make(chan struct{}), turn: make(chan struct{}, 1)}
		close(prod.ready)
		p.producers[b] = prod
	}
	return p
}

func TestOwnedBucketsRetiresExactlyTheBucketsThatLeft(t *testing.T) {
	p := ownedPublisher(t, 10)
	kept := map[int]*txnProducer{1: p.producer(1), 3: p.producer(3), 7: p.producer(7)}
	for _, buckets := range [][]int{{1, 3, 7}, {7, 1, 3}} { // the relay's order, and any other
		p.OwnedBuckets(buckets)
		p.mu.Lock()
		got := slices.Sorted(maps.Keys(p.producers))
		same := maps.EqualFunc(p.producers, kept, func(a, b *txnProducer) bool { return a == b })
		p.mu.Unlock()
		if !slices.Equal(got, []int{1, 3, 7}) || !same {
			t.Fatalf("OwnedBuckets(%v): producers of buckets %v (the same ones: %v); want the producers of 1, 3 and 7 kept", buckets, got, same)
		}
	}
}

// BenchmarkOwnedBuckets is one acquisition round of a relay owning every
// bucket of a 65,536-bucket outbox in the transactional mode: an unchanged
// set, reported to OwnedBuckets under the publisher's mutex.
//
//	go test -run '^$' -bench OwnedBuckets ./kafkapub
func BenchmarkOwnedBuckets(b *testing.B) {
	const n = 1 << 16
	p := ownedPublisher(b, n)
	buckets := make([]int, n)
	for i := range buckets {
		buckets[i] = i
	}
	for b.Loop() {
		p.OwnedBuckets(buckets)
	}
	if len(p.producers) != n {
		b.Fatalf("%d producers; want %d", len(p.producers), n)
	}
}
