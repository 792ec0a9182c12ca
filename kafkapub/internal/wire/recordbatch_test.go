package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
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
// sequence, records and the CRC-32C over them. The batches were captured
// as the in-process broker received them, and their transactions read back
// with read_committed, by internal/tests/kafkapub's
// TestKgoTransactionalBatchesGolden, which wrote them to
// testdata/kgo_transactional_batches.txt (this module does not require
// franz-go) and checks that franz-go still sends them:
//
//	go test ./internal/tests/kafkapub -run TestKgoTransactionalBatchesGolden -update-kgo-batches
//
// Each is decoded here with kafka-go's decoder.
func TestEncodeRecordBatch_matches_a_transactional_kgo_producer(t *testing.T) {
	data, err := os.ReadFile("testdata/kgo_transactional_batches.txt")
	if err != nil {
		t.Fatal(err)
	}
	var batches [][]byte
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		_, h, ok := strings.Cut(l, " ") // partition, bytes
		raw, err := hex.DecodeString(h)
		if !ok || err != nil {
			t.Fatalf("testdata line %q: %v", l, err)
		}
		batches = append(batches, raw)
	}
	if len(batches) == 0 {
		t.Fatal("no batch in testdata")
	}
	compared := 0
	for _, raw := range batches {
		rb, msgs, firstTimestamp := decodeKgoBatch(t, raw)
		if rb.Attributes&batchAttrTransactional == 0 || rb.ProducerID < 0 {
			t.Fatalf("kgo batch attributes %#x producer %d; want a transactional batch", rb.Attributes, rb.ProducerID)
		}
		ours, err := EncodeRecordBatch(ProducerBatch{
			ProducerID: rb.ProducerID, ProducerEpoch: rb.ProducerEpoch, BaseSequence: rb.BaseSequence, Transactional: true,
		}, firstTimestamp, 0, msgs)
		if err != nil {
			t.Fatal(err)
		}
		ours = ours[4:] // the size prefix of the request's record set
		// The broker's fields (base offset, partition leader epoch) lie
		// before the CRC's range; everything from the CRC on must match.
		if !bytes.Equal(ours[batchOffCRC:], raw[batchOffCRC:]) {
			t.Fatalf("our batch of %d records differs from kgo's from the CRC on:\nours %x\nkgo  %x", len(msgs), ours[batchOffCRC:], raw[batchOffCRC:])
		}
		if got, want := crc32.Checksum(ours[batchOffAttributes:], crc32.MakeTable(crc32.Castagnoli)), binary.BigEndian.Uint32(raw[batchOffCRC:]); got != want {
			t.Fatalf("CRC-32C %#x; kgo's %#x", got, want)
		}
		compared += len(msgs)
	}
	if compared != 40 {
		t.Fatalf("compared %d records; want 40", compared)
	}
}

// decodeKgoBatch decodes raw (an uncompressed v2 record batch, without a
// size prefix) with kafka-go's decoder: its producer fields, its records as
// kafka-go messages and its first timestamp (every record's: the records
// were given one timestamp).
func decodeKgoBatch(t *testing.T, raw []byte) (*protocol.RecordBatch, []kafka.Message, int64) {
	t.Helper()
	buf := append(binary.BigEndian.AppendUint32(nil, uint32(len(raw))), raw...)
	var rs protocol.RecordSet
	if _, err := rs.ReadFrom(bytes.NewReader(buf)); err != nil {
		t.Fatalf("kafka-go ReadFrom = %v", err)
	}
	recs := rs.Records
	if st, ok := recs.(*protocol.RecordStream); ok && len(st.Records) == 1 {
		recs = st.Records[0]
	}
	rb, ok := recs.(*protocol.RecordBatch)
	if !ok {
		t.Fatalf("records are a %T; want *protocol.RecordBatch", rs.Records)
	}
	firstTimestamp := int64(binary.BigEndian.Uint64(raw[batchOffAttributes+2+4:]))
	n := int(binary.BigEndian.Uint32(raw[batchOffAttributes+2+4+8+8+8+2+4:])) // the records count
	var out []kafka.Message
	for range n {
		r, err := rb.ReadRecord()
		if err != nil {
			t.Fatal(err)
		}
		if r.Time.UnixMilli() != firstTimestamp {
			t.Fatalf("record time %d; the test gives every record one timestamp (%d)", r.Time.UnixMilli(), firstTimestamp)
		}
		m := kafka.Message{Key: readBytes(t, r.Key), Value: readBytes(t, r.Value)}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		out = append(out, m)
	}
	if _, err := rb.ReadRecord(); err == nil {
		t.Fatalf("a record after the last one")
	}
	return rb, out, firstTimestamp
}
