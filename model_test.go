package outbox_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/segmentio/kafka-go"
)

func int32p(v int32) *int32 { return &v }

func TestBucketOf(t *testing.T) {
	id := outbox.NewUUID()
	t.Run("same_key_same_bucket_in_range", func(t *testing.T) {
		for n := 1; n <= 64; n++ {
			for i := 0; i < 200; i++ {
				key := []byte{byte(i), byte(i >> 3), 'k'}
				a := outbox.BucketOf(key, nil, outbox.NewUUID(), n)
				b := outbox.BucketOf(key, nil, outbox.NewUUID(), n)
				if a != b {
					t.Fatalf("BucketOf(%q, n=%d) = %d and %d for two message ids; want equal", key, n, a, b)
				}
				if a < 0 || int(a) >= n {
					t.Fatalf("BucketOf(%q, n=%d) = %d; want in [0,%d)", key, n, a, n)
				}
			}
		}
	})
	t.Run("one_bucket_is_always_zero", func(t *testing.T) {
		for _, k := range [][]byte{nil, {}, []byte("x")} {
			if got := outbox.BucketOf(k, int32p(5), id, 1); got != 0 {
				t.Fatalf("BucketOf(%q, n=1) = %d; want 0", k, got)
			}
		}
	})
	t.Run("explicit_partition_overrides_key_and_id", func(t *testing.T) {
		for p := int32(0); p < 40; p++ {
			if got, want := outbox.BucketOf([]byte("some-key"), int32p(p), outbox.NewUUID(), 8), p%8; got != want {
				t.Fatalf("BucketOf(partition %d, n=8) = %d; want %d", p, got, want)
			}
		}
	})
	t.Run("empty_key_is_hashed_not_keyless", func(t *testing.T) {
		// An empty key hashes like any key: independent of the message id.
		seen := map[int32]bool{}
		for i := 0; i < 50; i++ {
			seen[outbox.BucketOf([]byte{}, nil, outbox.NewUUID(), 64)] = true
		}
		if len(seen) != 1 {
			t.Fatalf("empty key landed in %d buckets over 50 message ids; want 1", len(seen))
		}
		want := int32((uint32(275646681) & 0x7fffffff) % 64)
		if got := outbox.BucketOf([]byte{}, nil, id, 64); got != want {
			t.Fatalf("BucketOf(empty key, n=64) = %d; want %d (murmur2 of no bytes)", got, want)
		}
	})
	t.Run("nil_key_hashes_the_message_id", func(t *testing.T) {
		seen := map[int32]bool{}
		for i := 0; i < 200; i++ {
			u := outbox.NewUUID()
			b := outbox.BucketOf(nil, nil, u, 64)
			if again := outbox.BucketOf(nil, nil, u, 64); again != b {
				t.Fatalf("BucketOf(nil key, id %s) = %d then %d; want stable", u, b, again)
			}
			if want := outbox.BucketOf(u[:], nil, outbox.NewUUID(), 64); b != want {
				t.Fatalf("BucketOf(nil key, id %s) = %d; want %d (the hash of the id bytes)", u, b, want)
			}
			seen[b] = true
		}
		if len(seen) < 32 {
			t.Fatalf("nil keys spread over %d of 64 buckets; want most of them", len(seen))
		}
	})
}

func TestBucketOfMatchesJavaMurmur2Vectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/murmur2.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Vectors []struct {
			Source string `json:"source"`
			Key    string `json:"key"`
			Hash   int32  `json:"hash"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Vectors) < 10 {
		t.Fatalf("testdata/murmur2.json has %d vectors; want at least 10", len(file.Vectors))
	}
	for _, v := range file.Vectors {
		for _, n := range []int{2, 3, 7, 8, 16, 100, 997, 4096, outbox.MaxBucketCount} {
			want := int32((uint32(v.Hash) & 0x7fffffff) % uint32(n))
			if got := outbox.BucketOf([]byte(v.Key), nil, outbox.UUID{}, n); got != want {
				t.Errorf("BucketOf(%q, n=%d) = %d; want %d (%s hash %d)", v.Key, n, got, want, v.Source, v.Hash)
			}
		}
	}
}

func TestHeadersCodec(t *testing.T) {
	t.Run("nil_and_empty_are_NULL", func(t *testing.T) {
		for _, h := range []outbox.Headers{nil, {}} {
			v, err := h.Value()
			if err != nil || v != nil {
				t.Fatalf("Headers(%v).Value() = %v, %v; want nil, nil", h, v, err)
			}
		}
		var h outbox.Headers = outbox.Headers{{Key: "x"}}
		if err := h.Scan(nil); err != nil || h != nil {
			t.Fatalf("Scan(NULL) = %v, headers %v; want nil, nil", err, h)
		}
	})
	t.Run("round_trip_keeps_order_duplicates_nil_and_empty", func(t *testing.T) {
		in := outbox.Headers{
			{Key: "b", Value: []byte("2")},
			{Key: "a", Value: nil},
			{Key: "b", Value: []byte{}},
			{Key: "", Value: []byte{0, 1, 2}},
			{Key: "ü", Value: []byte("日本")},
		}
		v, err := in.Value()
		if err != nil {
			t.Fatal(err)
		}
		blob := v.([]byte)
		if blob[0] != 1 {
			t.Fatalf("version byte = %d; want 1", blob[0])
		}
		if n := binary.LittleEndian.Uint32(blob[1:]); n != 5 {
			t.Fatalf("count = %d; want 5", n)
		}
		var out outbox.Headers
		if err := out.Scan(blob); err != nil {
			t.Fatal(err)
		}
		if len(out) != len(in) {
			t.Fatalf("decoded %d headers; want %d", len(out), len(in))
		}
		for i := range in {
			if out[i].Key != in[i].Key || !bytes.Equal(out[i].Value, in[i].Value) || (out[i].Value == nil) != (in[i].Value == nil) {
				t.Fatalf("header %d = %q:%v; want %q:%v", i, out[i].Key, out[i].Value, in[i].Key, in[i].Value)
			}
		}
	})
	t.Run("byte_compatible_with_the_reference_encoding", func(t *testing.T) {
		got := outbox.EncodeHeaders(outbox.Headers{{Key: "k", Value: []byte("v")}, {Key: "n", Value: nil}})
		want := []byte{1, 2, 0, 0, 0, 1, 0, 0, 0, 'k', 1, 0, 0, 0, 'v', 1, 0, 0, 0, 'n', 0xff, 0xff, 0xff, 0xff}
		if !bytes.Equal(got, want) {
			t.Fatalf("EncodeHeaders = % x; want % x", got, want)
		}
	})
	corrupt := map[string][]byte{
		"unknown_version":      {2, 0, 0, 0, 0},
		"negative_count":       {1, 0xff, 0xff, 0xff, 0xff},
		"oversized_count":      {1, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0},
		"truncated_count":      {1, 1, 0},
		"negative_key_length":  {1, 1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0, 0, 0, 0},
		"key_past_end":         {1, 1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0},
		"value_past_end":       {1, 1, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0},
		"negative_value_below": {1, 1, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff},
		"trailing_bytes":       {1, 0, 0, 0, 0, 7},
	}
	for name, blob := range corrupt {
		t.Run("rejects_"+name, func(t *testing.T) {
			var h outbox.Headers
			err := h.Scan(blob)
			if !errors.Is(err, outbox.ErrCorruptHeaders) {
				t.Fatalf("Scan(% x) = %v; want ErrCorruptHeaders", blob, err)
			}
		})
	}
	t.Run("oversized_count_allocates_nothing_large", func(t *testing.T) {
		blob := []byte{1, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := 0; i < 100; i++ {
			if _, err := outbox.DecodeHeaders(blob); err == nil {
				t.Fatal("DecodeHeaders(count 2^31-1) = nil error")
			}
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / 100; per > 4096 {
			t.Fatalf("DecodeHeaders(count 2^31-1) allocated %d bytes per call; want under 4 KiB", per)
		}
	})
}

func FuzzDecodeHeaders(f *testing.F) {
	f.Add([]byte{})
	f.Add(outbox.EncodeHeaders(outbox.Headers{{Key: "a", Value: []byte("b")}, {Key: "c"}}))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := outbox.DecodeHeaders(b)
		if err != nil {
			return
		}
		if len(h) > len(b) {
			t.Fatalf("decoded %d headers from %d bytes", len(h), len(b))
		}
		// A valid blob re-encodes to itself (empty lists encode to nil).
		if again := outbox.EncodeHeaders(h); len(h) > 0 && !bytes.Equal(again, b) {
			t.Fatalf("re-encoding % x gave % x", b, again)
		}
	})
}

// TestBucketOfAgreesWithKafkaGoMurmur2Balancer: buckets use the same mapping
// as the publisher's placement (kafka-go's Murmur2Balancer), so keys land in
// buckets exactly as they land in partitions of the same count.
func TestBucketOfAgreesWithKafkaGoMurmur2Balancer(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 20000; i++ {
		key := make([]byte, rng.IntN(40))
		for j := range key {
			key[j] = byte(rng.Uint32())
		}
		n := 1 + rng.IntN(300)
		parts := make([]int, n)
		for j := range parts {
			parts[j] = j
		}
		want := kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: key}, parts...)
		if got := outbox.BucketOf(key, nil, outbox.UUID{}, n); int(got) != want {
			t.Fatalf("BucketOf(% x, n=%d) = %d; kafka-go's Murmur2Balancer says %d", key, n, got, want)
		}
	}
}
