package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/segmentio/kafka-go"
)

// Offsets in a v2 record batch (magic 2), after its 4-byte size prefix.
const (
	batchOffBaseOffset  = 0  // int64
	batchOffLength      = 8  // int32: the bytes after this field
	batchOffLeaderEpoch = 12 // int32
	batchOffMagic       = 16 // int8
	batchOffCRC         = 17 // uint32: CRC-32C of attributes..end
	batchOffAttributes  = 21 // int16
	batchHeaderSize     = 61 // up to and including the record count
)

// Record batch attributes (v2).
const (
	batchAttrCompressionMask = 0x07
	batchAttrTransactional   = 0x10
)

// ProducerBatch is the producer part of a v2 record batch header: what
// kafka-go's own encoder writes as -1, so that the broker can fence an old
// producer epoch, reject a duplicate or out-of-order sequence and hold the
// records back from read_committed consumers until their transaction ends.
type ProducerBatch struct {
	ProducerID    int64
	ProducerEpoch int16
	// BaseSequence is the sequence number of the batch's first record: the
	// producer's count of records sent to the partition in this epoch.
	BaseSequence  int32
	Transactional bool
}

// EncodeRecordBatch returns msgs as one v2 record batch, as the record set
// of a produce request (a 4-byte size prefix, then the batch), with the
// producer fields of pb, every record stamped timestampMs (create time), and
// the records compressed with compression (0: none). Keys, values and header
// values that are nil are encoded as null (-1), as kafka-go's writer does.
// An empty msgs is an error.
func EncodeRecordBatch(pb ProducerBatch, timestampMs int64, compression kafka.Compression, msgs []kafka.Message) ([]byte, error) {
	if len(msgs) == 0 {
		return nil, errors.New("record batch: no records")
	}
	size := 4 + batchHeaderSize
	for i := range msgs {
		size += RecordSize(&msgs[i]) + 2*binary.MaxVarintLen32
	}
	buf := make([]byte, 4+batchHeaderSize, size)

	attrs := int16(compression) & batchAttrCompressionMask
	if pb.Transactional {
		attrs |= batchAttrTransactional
	}
	h := buf[4:]
	binary.BigEndian.PutUint64(h[batchOffBaseOffset:], 0)
	binary.BigEndian.PutUint32(h[batchOffLeaderEpoch:], 0xffffffff) // -1: set by the broker
	h[batchOffMagic] = 2
	binary.BigEndian.PutUint16(h[batchOffAttributes:], uint16(attrs))
	binary.BigEndian.PutUint32(h[23:], uint32(len(msgs)-1)) // last offset delta
	binary.BigEndian.PutUint64(h[27:], uint64(timestampMs)) // base timestamp
	binary.BigEndian.PutUint64(h[35:], uint64(timestampMs)) // max timestamp
	binary.BigEndian.PutUint64(h[43:], uint64(pb.ProducerID))
	binary.BigEndian.PutUint16(h[51:], uint16(pb.ProducerEpoch))
	binary.BigEndian.PutUint32(h[53:], uint32(pb.BaseSequence))
	binary.BigEndian.PutUint32(h[57:], uint32(len(msgs)))

	if compression == 0 {
		for i := range msgs {
			buf = appendRecord(buf, i, &msgs[i])
		}
	} else {
		codec := compression.Codec()
		if codec == nil {
			return nil, fmt.Errorf("record batch: compression %d: codec unknown or not linked", compression)
		}
		var raw []byte
		for i := range msgs {
			raw = appendRecord(raw, i, &msgs[i])
		}
		b := bytes.NewBuffer(buf)
		w := codec.NewWriter(b)
		_, err := w.Write(raw)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("record batch: %s: %w", codec.Name(), err)
		}
		buf = b.Bytes()
	}

	binary.BigEndian.PutUint32(buf[0:], uint32(len(buf)-4))
	binary.BigEndian.PutUint32(buf[4+batchOffLength:], uint32(len(buf)-4-12))
	// MakeTable returns the package's own Castagnoli table (built once).
	crc := crc32.Checksum(buf[4+batchOffAttributes:], crc32.MakeTable(crc32.Castagnoli))
	binary.BigEndian.PutUint32(buf[4+batchOffCRC:], crc)
	return buf, nil
}

// appendRecord appends record i of a batch (timestamp delta 0, offset delta
// i) to dst.
func appendRecord(dst []byte, i int, m *kafka.Message) []byte {
	body := 1 + varIntLen(0) + varIntLen(int64(i)) +
		nullBytesLen(m.Key) + nullBytesLen(m.Value) + varIntLen(int64(len(m.Headers)))
	for _, h := range m.Headers {
		body += varIntLen(int64(len(h.Key))) + len(h.Key) + nullBytesLen(h.Value)
	}
	dst = binary.AppendVarint(dst, int64(body))
	dst = append(dst, 0)                     // record attributes (unused)
	dst = binary.AppendVarint(dst, 0)        // timestamp delta
	dst = binary.AppendVarint(dst, int64(i)) // offset delta
	dst = appendNullBytes(dst, m.Key)
	dst = appendNullBytes(dst, m.Value)
	dst = binary.AppendVarint(dst, int64(len(m.Headers)))
	for _, h := range m.Headers {
		dst = binary.AppendVarint(dst, int64(len(h.Key)))
		dst = append(dst, h.Key...)
		dst = appendNullBytes(dst, h.Value)
	}
	return dst
}

func appendNullBytes(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendVarint(dst, -1)
	}
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}

func nullBytesLen(b []byte) int {
	if b == nil {
		return varIntLen(-1)
	}
	return varIntLen(int64(len(b))) + len(b)
}

// RecordSize is kafka-go's accounting of a message's size against
// Writer.BatchBytes (Message.totalSize in kafka-go v0.4).
func RecordSize(m *kafka.Message) int {
	hs := varIntLen(int64(len(m.Headers)))
	for _, h := range m.Headers {
		hs += varIntLen(int64(len(h.Key))) + len(h.Key) + varIntLen(int64(len(h.Value))) + len(h.Value)
	}
	return hs + 4 + 1 + 1 + 4 + len(m.Key) + 4 + len(m.Value) + 8
}

func varIntLen(i int64) int {
	u := uint64((i << 1) ^ (i >> 63))
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}
