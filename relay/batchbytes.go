package relay

import "github.com/gorm-outbox/outbox"

// MessageSize is the size of a row as Options.MaxBatchBytes counts it: the
// bytes of its key, value, and header names and values.
func MessageSize(m *outbox.Message) int64 {
	n := int64(len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// trimToBytes returns the longest prefix of batch within maxBytes, at least
// one row; over reports that batch exceeded the bound (the bucket may hold
// more rows).
func trimToBytes(batch []*outbox.Message, maxBytes int64) (kept []*outbox.Message, over bool) {
	var total int64
	for i, m := range batch {
		total += MessageSize(m)
		if total > maxBytes {
			return batch[:max(i, 1)], true
		}
	}
	return batch, false
}
