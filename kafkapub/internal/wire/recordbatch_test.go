package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// Our v2 record batches decode with kafka-go's own decoder to the records
// and producer fields they were built from, with every codec.
func TestEncodeRecordBatch_round_trips_through_kafka_go(t *testing.T) {
	many := make([]kafka.Message, 1000)
	for i := range many {
		many[i] = kafka.Message{Key: []byte(fmt.Sprintf("key-%d", i%17)), Value: bytes.Repeat([]byte{byte(i)}, i%300)}
	}
	shapes := []struct {
		name string
		msgs []kafka.Message
	}{
		{"one_record", []kafka.Message{{Key: []byte("k"), Value: []byte("v")}}},
		{"nil_key_empty_key_tombstone", []kafka.Message{
			{Key: nil, Value: []byte("keyless")},
			{Key: []byte{}, Value: []byte("empty key")},
			{Key: []byte("k"), Value: nil},
			{Key: []byte("k"), Value: []byte{}},
		}},
		{"headers", []kafka.Message{
			{Key: []byte("k"), Value: []byte("v"), Headers: []kafka.Header{
				{Key: "a", Value: []byte("1")}, {Key: "", Value: []byte("empty key")}, {Key: "nil", Value: nil}, {Key: "a", Value: []byte("dup")},
			}},
		}},
		{"large_values", []kafka.Message{{Value: bytes.Repeat([]byte("x"), 300_000)}, {Value: []byte(strings.Repeat("y", 70_000))}}},
		{"1000_records", many},
	}
	codecs := []kafka.Compression{0, kafka.Gzip, kafka.Snappy, kafka.Lz4, kafka.Zstd}
	pb := ProducerBatch{ProducerID: 1 << 40, ProducerEpoch: 7, BaseSequence: 123456, Transactional: true}
	ts := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	for _, shape := range shapes {
		for _, codec := range codecs {
			t.Run(fmt.Sprintf("%s_%v", shape.name, codec), func(t *testing.T) {
				buf, err := EncodeRecordBatch(pb, ts, codec, shape.msgs)
				if err != nil {
					t.Fatalf("EncodeRecordBatch = %v", err)
				}
				if got := int(binary.BigEndian.Uint32(buf)); got != len(buf)-4 {
					t.Fatalf("size prefix = %d; want %d", got, len(buf)-4)
				}
				var rs protocol.RecordSet
				if _, err := rs.ReadFrom(bytes.NewReader(buf)); err != nil {
					t.Fatalf("kafka-go ReadFrom = %v", err)
				}
				if rs.Version != 2 || rs.Attributes.Compression() != codec || !rs.Attributes.Transactional() || rs.Attributes.Control() {
					t.Fatalf("version %d attributes %v; want 2, %v, transactional, not control", rs.Version, rs.Attributes, codec)
				}
				recs := rs.Records
				if st, ok := recs.(*protocol.RecordStream); ok && len(st.Records) == 1 {
					recs = st.Records[0]
				}
				rb, ok := recs.(*protocol.RecordBatch)
				if !ok {
					t.Fatalf("records are a %T; want *protocol.RecordBatch", rs.Records)
				}
				if rb.ProducerID != pb.ProducerID || rb.ProducerEpoch != pb.ProducerEpoch || rb.BaseSequence != pb.BaseSequence {
					t.Fatalf("producer %d/%d/%d; want %d/%d/%d", rb.ProducerID, rb.ProducerEpoch, rb.BaseSequence, pb.ProducerID, pb.ProducerEpoch, pb.BaseSequence)
				}
				for i, want := range shape.msgs {
					r, err := rb.ReadRecord()
					if err != nil {
						t.Fatalf("record %d: %v", i, err)
					}
					if r.Offset != int64(i) || r.Time.UnixMilli() != ts {
						t.Fatalf("record %d: offset %d time %d; want %d, %d", i, r.Offset, r.Time.UnixMilli(), i, ts)
					}
					key, val := readBytes(t, r.Key), readBytes(t, r.Value)
					if (key == nil) != (want.Key == nil) || !bytes.Equal(key, want.Key) {
						t.Fatalf("record %d: key %q (nil %v); want %q (nil %v)", i, key, key == nil, want.Key, want.Key == nil)
					}
					if (val == nil) != (want.Value == nil) || !bytes.Equal(val, want.Value) {
						t.Fatalf("record %d: value of %d bytes (nil %v); want %d (nil %v)", i, len(val), val == nil, len(want.Value), want.Value == nil)
					}
					if len(r.Headers) != len(want.Headers) {
						t.Fatalf("record %d: %d headers; want %d", i, len(r.Headers), len(want.Headers))
					}
					for j, h := range want.Headers {
						if r.Headers[j].Key != h.Key || !bytes.Equal(r.Headers[j].Value, h.Value) {
							t.Fatalf("record %d header %d = %q:%q; want %q:%q", i, j, r.Headers[j].Key, r.Headers[j].Value, h.Key, h.Value)
						}
					}
				}
				if _, err := rb.ReadRecord(); err == nil {
					t.Fatalf("a record after the last one")
				}
			})
		}
	}
	if _, err := EncodeRecordBatch(pb, ts, 0, nil); err == nil {
		t.Errorf("EncodeRecordBatch(no records) = nil error; want one")
	}
}

func readBytes(t *testing.T, b protocol.Bytes) []byte {
	t.Helper()
	if b == nil {
		return nil
	}
	out, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if out == nil {
		out = []byte{}
	}
	return out
}

// The record batches a transactional franz-go producer (a reference client)
// sends are byte for byte what our encoder makes of the same records and
// producer fields: attributes, offsets, timestamps, producer id, epoch,
// sequence, records and the CRC-32C over them. Batches are captured as
// the in-process broker receives them, and read back from it with
// read_committed.
func TestEncodeRecordBatch_matches_a_transactional_kgo_producer(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 2, nil)

	var mu sync.Mutex
	var captured [][]byte
	seen := map[kmsg.Request]bool{} // When runs once per partition of a request
	b.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Observe: true, When: func(r kmsg.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if seen[r] {
			return true
		}
		seen[r] = true
		for _, tp := range r.(*kmsg.ProduceRequest).Topics {
			for _, pp := range tp.Partitions {
				captured = append(captured, bytes.Clone(pp.Records))
			}
		}
		return true
	}})

	cl, err := kgo.NewClient(
		kgo.SeedBrokers(b.Addrs...),
		kgo.TransactionalID("reference-"+topic),
		kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := time.UnixMilli(time.Now().UnixMilli())
	for txn := range 2 {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		var recs []*kgo.Record
		for i := range 20 {
			r := &kgo.Record{Partition: int32(i % 2), Timestamp: ts, Value: []byte(fmt.Sprintf("v-%d-%d", txn, i))}
			if i%5 != 0 {
				r.Key = []byte(fmt.Sprintf("k%d", i%3))
			}
			if i%4 == 0 {
				r.Headers = []kgo.RecordHeader{{Key: "h", Value: []byte{byte(i)}}, {Key: "x-outbox-message-id", Value: []byte("0b9a6f7e-0000-4000-8000-000000000000")}}
			}
			recs = append(recs, r)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}

	mu.Lock()
	batches := captured
	mu.Unlock()
	if len(batches) == 0 {
		t.Fatal("no produce request captured")
	}
	compared := 0
	for _, raw := range batches {
		var rb kmsg.RecordBatch
		if err := rb.ReadFrom(raw); err != nil {
			t.Fatalf("kmsg.RecordBatch.ReadFrom: %v", err)
		}
		if rb.Attributes&batchAttrTransactional == 0 || rb.ProducerID < 0 {
			t.Fatalf("kgo batch attributes %#x producer %d; want a transactional batch", rb.Attributes, rb.ProducerID)
		}
		msgs := decodeKmsgRecords(t, rb)
		ours, err := EncodeRecordBatch(ProducerBatch{
			ProducerID: rb.ProducerID, ProducerEpoch: rb.ProducerEpoch, BaseSequence: rb.FirstSequence, Transactional: true,
		}, rb.FirstTimestamp, 0, msgs)
		if err != nil {
			t.Fatal(err)
		}
		ours = ours[4:] // the size prefix of the request's record set
		// The broker's fields (base offset, partition leader epoch) lie
		// before the CRC's range; everything from the CRC on must match.
		if !bytes.Equal(ours[batchOffCRC:], raw[batchOffCRC:]) {
			t.Fatalf("our batch of %d records differs from kgo's from the CRC on:\nours %x\nkgo  %x", len(msgs), ours[batchOffCRC:], raw[batchOffCRC:])
		}
		if got := crc32.Checksum(ours[batchOffAttributes:], crc32.MakeTable(crc32.Castagnoli)); got != uint32(rb.CRC) {
			t.Fatalf("CRC-32C %#x; kgo's %#x", got, uint32(rb.CRC))
		}
		compared += len(msgs)
	}
	if compared != 40 {
		t.Fatalf("compared %d records; want 40", compared)
	}

	// Read back: the reference client's records are what our encoding of
	// them says (read_committed, so the transactions committed).
	recs := readIsolated(t, b, topic, kgo.ReadCommitted(), 40, 200*time.Millisecond)
	if len(recs) != 40 {
		t.Fatalf("read %d records; want 40", len(recs))
	}
}

// decodeKmsgRecords returns rb's records (uncompressed) as kafka-go
// messages.
func decodeKmsgRecords(t *testing.T, rb kmsg.RecordBatch) []kafka.Message {
	t.Helper()
	var out []kafka.Message
	buf := rb.Records
	for range rb.NumRecords {
		l, n := binary.Varint(buf)
		if n <= 0 || int(l)+n > len(buf) {
			t.Fatalf("bad record length")
		}
		var rec kmsg.Record
		if err := rec.ReadFrom(buf[:n+int(l)]); err != nil {
			t.Fatal(err)
		}
		buf = buf[n+int(l):]
		if rec.TimestampDelta64 != 0 {
			t.Fatalf("timestamp delta %d; the test gives every record one timestamp", rec.TimestampDelta64)
		}
		m := kafka.Message{Key: rec.Key, Value: rec.Value}
		for _, h := range rec.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		out = append(out, m)
	}
	return out
}
