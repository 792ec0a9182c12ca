package outbox

import (
	"bytes"
	"testing"
	"time"
)

// BenchmarkBucketOf measures the bucket hash of a row: Kafka's murmur2 of
// a 16-byte key (and of the message id for a keyless row) mod 8 buckets.
func BenchmarkBucketOf(b *testing.B) {
	id := NewUUID()
	key := []byte("order-0123456789")
	b.Run("key16", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = BucketOf(key, nil, id, DefaultBucketCount)
		}
	})
	b.Run("keyless", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = BucketOf(nil, nil, id, DefaultBucketCount)
		}
	})
	b.Run("key16_1024buckets", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = BucketOf(key, nil, id, 1024)
		}
	})
}

// BenchmarkMurmur2 measures the hash alone over keys of 16 bytes and 1 KiB.
func BenchmarkMurmur2(b *testing.B) {
	for _, n := range []int{16, 1024} {
		key := bytes.Repeat([]byte("k"), n)
		b.Run(map[int]string{16: "16B", 1024: "1KiB"}[n], func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(n))
			for range b.N {
				_ = murmur2Mod(key, DefaultBucketCount)
			}
		})
	}
}

// benchHeaders is a typical header list: a trace context and two short
// application headers.
var benchHeaders = Headers{
	{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
	{Key: "content-type", Value: []byte("application/json")},
	{Key: "schema", Value: []byte("orders.v3")},
}

// BenchmarkHeaderCodec measures the version 1 header encoding both ways.
func BenchmarkHeaderCodec(b *testing.B) {
	blob := EncodeHeaders(benchHeaders)
	b.Run("encode3", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(blob)))
		for range b.N {
			_ = EncodeHeaders(benchHeaders)
		}
	})
	b.Run("decode3", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(blob)))
		for range b.N {
			if _, err := DecodeHeaders(blob); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkMessageBuild measures what a writer's Create does per row before
// SQL: building the message (string and JSON helpers) and preparing it
// (topic check, message id, bucket, created-at).
func BenchmarkMessageBuild(b *testing.B) {
	cfg := Config{}.WithDefaults()
	value := string(bytes.Repeat([]byte("v"), 1024))
	now := time.Now()
	b.Run("string_1KiB_prepare", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			m := NewStringMessage("orders", "order-0123456789", value, benchHeaders...)
			if err := cfg.prepare(m, now, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	type order struct {
		ID    string  `json:"id"`
		Total float64 `json:"total"`
		Items []int   `json:"items"`
	}
	o := order{ID: "order-0123456789", Total: 12.5, Items: []int{1, 2, 3}}
	b.Run("json_prepare", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			m, err := NewJSONMessage("orders", o.ID, o)
			if err != nil {
				b.Fatal(err)
			}
			if err := cfg.prepare(m, now, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("headers_value", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := benchHeaders.Value(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
