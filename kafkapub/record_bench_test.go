package kafkapub

import (
	"bytes"
	"testing"

	"github.com/gorm-outbox/outbox"
)

// BenchmarkKafkaRecord measures the publisher's per-row conversion of an
// outbox row to a kafka-go message (headers copied, message-id header
// stamped), with no broker: New does not connect.
func BenchmarkKafkaRecord(b *testing.B) {
	p, err := New(Config{Brokers: []string{"127.0.0.1:1"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	value := bytes.Repeat([]byte("v"), 1024)
	for _, tc := range []struct {
		name    string
		headers outbox.Headers
	}{
		{"no_headers", nil},
		{"3_headers", outbox.Headers{
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
			{Key: "content-type", Value: []byte("application/json")},
			{Key: "schema", Value: []byte("orders.v3")},
		}},
	} {
		m := &outbox.Message{MessageID: outbox.NewUUID(), Topic: "orders", Key: []byte("order-0123456789"), Value: value, Headers: tc.headers}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				_ = p.record(m)
			}
		})
	}
}
