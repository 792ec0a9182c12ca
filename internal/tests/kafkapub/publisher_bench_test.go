package kafkapub_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// benchBrokers is the in-process broker and, when OUTBOX_TEST_KAFKA_BROKERS
// is set, the real one.
func benchBrokers(b *testing.B) []testenv.Broker {
	bs := []testenv.Broker{testenv.NewFake(b)}
	if r, ok := testenv.RealBroker(b); ok {
		bs = append(bs, r)
	}
	return bs
}

// BenchmarkKafkaPublisher measures publish throughput (batches of 500 rows
// with 1 KiB values over 8 partitions, reported as msg/s) and single-row
// publish latency (p50/p99, reported in µs).
func BenchmarkKafkaPublisher(b *testing.B) {
	for _, br := range benchBrokers(b) {
		topic := newTopic(b, br, 8, nil)
		p := newPublisher(b, br, kafkapub.Config{})
		value := bytes.Repeat([]byte("v"), 1024)
		seq := 0
		next := func() *outbox.Message {
			seq++
			return &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: fmt.Appendf(nil, "key-%d", seq), Value: value}
		}
		// Warm metadata and connections.
		if res := p.Publish(context.Background(), [][]*outbox.Message{{next()}})[0]; res.Err != nil {
			b.Fatalf("warm-up Publish = %+v", res)
		}

		b.Run(br.Name+"/batch500", func(b *testing.B) {
			batch := make([]*outbox.Message, 500)
			for i := range batch {
				batch[i] = next()
			}
			b.SetBytes(int64(len(batch) * len(value)))
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Err != nil {
					b.Fatalf("Publish = %+v", res)
				}
			}
			b.ReportMetric(float64(b.N*len(batch))/time.Since(start).Seconds(), "msg/s")
		})

		b.Run(br.Name+"/single_row", func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for range b.N {
				m := next()
				start := time.Now()
				if res := p.Publish(context.Background(), [][]*outbox.Message{{m}})[0]; res.Err != nil {
					b.Fatalf("Publish = %+v", res)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkPublish measures what a relay serving 64 shallow buckets (one
// row each, 8 partitions) pays per group: 64 Publish calls of one batch one
// after the other against one Publish call of the 64 batches (ns/op is per
// group of 64 rows).
func BenchmarkPublish(b *testing.B) {
	const buckets = 64
	for _, br := range benchBrokers(b) {
		topic := newTopic(b, br, 8, nil)
		p := newPublisher(b, br, kafkapub.Config{})
		seq := 0
		group := func() [][]*outbox.Message {
			batches := make([][]*outbox.Message, buckets)
			for i := range batches {
				seq++
				batches[i] = []*outbox.Message{{MessageID: outbox.NewUUID(), Topic: topic, Key: fmt.Appendf(nil, "key-%d", seq), Value: []byte("v")}}
			}
			return batches
		}
		for _, res := range p.Publish(context.Background(), group()) { // warm metadata and connections
			if res.Err != nil {
				b.Fatalf("warm-up Publish = %+v", res)
			}
		}

		b.Run(br.Name+"/publish_x64", func(b *testing.B) {
			for b.Loop() {
				for _, batch := range group() {
					if res := p.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Err != nil {
						b.Fatalf("Publish = %+v", res)
					}
				}
			}
		})
		b.Run(br.Name+"/publish_group_64", func(b *testing.B) {
			for b.Loop() {
				for _, res := range p.Publish(context.Background(), group()) {
					if res.Err != nil {
						b.Fatalf("Publish = %+v", res)
					}
				}
			}
		})
	}
}
