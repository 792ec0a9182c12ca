package kafkapub_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// BenchmarkKafkaPublisherTransactional compares the transactional mode
// (Config.Transactions) with the default one in one run, on the
// in-process broker and the real one: throughput of batches of 500 rows
// with 1 KiB values over 8 partitions (msg/s), and the latency of a
// one-row publish (p50/p99 in µs), each mode on its own fresh topic.
//
//	go test -run '^$' -bench KafkaPublisherTransactional -benchtime 200x ./internal/tests/kafkapub
func BenchmarkKafkaPublisherTransactional(b *testing.B) {
	for _, br := range benchBrokers(b) {
		value := bytes.Repeat([]byte("v"), 1024)
		type mode struct {
			name string
			pub  *kafkapub.Publisher
			next func() *outbox.Message
		}
		var modes []mode
		for _, name := range []string{"default", "transactional"} {
			topic := newTopic(b, br, 8, nil)
			var p *kafkapub.Publisher
			if name == "default" {
				p = newPublisher(b, br, kafkapub.Config{})
			} else {
				p = newTestTxnPublisher(b, br, topic, kafkapub.Config{})
				own(b, p, 0)
			}
			seq := 0
			next := func() *outbox.Message {
				seq++
				return &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: fmt.Appendf(nil, "key-%d", seq), Value: value}
			}
			// Warm metadata, connections and (transactional) the
			// coordinator.
			if res := p.Publish(context.Background(), [][]*outbox.Message{{next()}})[0]; res.Err != nil {
				b.Fatalf("warm-up Publish = %+v", res)
			}
			modes = append(modes, mode{name, p, next})
		}
		for _, m := range modes {
			b.Run(br.Name+"/batch500/"+m.name, func(b *testing.B) {
				batch := make([]*outbox.Message, 500)
				for i := range batch {
					batch[i] = m.next()
				}
				b.SetBytes(int64(len(batch) * len(value)))
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					if res := m.pub.Publish(context.Background(), [][]*outbox.Message{batch})[0]; res.Err != nil {
						b.Fatalf("Publish = %+v", res)
					}
				}
				b.ReportMetric(float64(b.N*len(batch))/time.Since(start).Seconds(), "msg/s")
			})
		}
		for _, m := range modes {
			b.Run(br.Name+"/single_row/"+m.name, func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				for range b.N {
					msg := m.next()
					start := time.Now()
					if res := m.pub.Publish(context.Background(), [][]*outbox.Message{{msg}})[0]; res.Err != nil {
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
}
