package kafkapub

import (
	"bytes"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/kafkapub/internal/wire"
)

// FuzzKafkaRecord builds records from arbitrary rows and checks the
// publisher's invariants: key, value and topic pass through byte for byte,
// caller headers keep their order except those named like the message-id
// header, the message-id header comes last exactly once, the size
// accounting covers the payload. (Its last three arguments fed a check of
// the writer's balancer, which the publisher no longer uses; they stay so
// that the seed corpus keeps its shape.)
func FuzzKafkaRecord(f *testing.F) {
	f.Add("orders", []byte("k"), false, []byte("v"), false, []byte(nil), "", int32(0), false, 8)
	f.Add("t", []byte{}, true, []byte(nil), true, outbox.EncodeHeaders(outbox.Headers{{Key: "x-outbox-message-id", Value: []byte("spoof")}, {Key: "a"}}), "", int32(3), true, 4)
	f.Add("t", []byte("k"), false, []byte("v"), false, outbox.EncodeHeaders(outbox.Headers{{Key: "h", Value: []byte{0, 1}}}), "custom-id", int32(9), true, 2)
	f.Fuzz(func(t *testing.T, topic string, key []byte, keyNil bool, value []byte, valueNil bool, headerBlob []byte, header string, _ int32, _ bool, _ int) {
		hs, err := outbox.DecodeHeaders(headerBlob)
		if err != nil {
			return
		}
		if keyNil {
			key = nil
		}
		if valueNil {
			value = nil
		}
		p, err := New(Config{Brokers: []string{"127.0.0.1:1"}, MessageIDHeader: header})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		m := &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: key, Value: value, Headers: hs}
		rec := p.record(m)
		if rec.Topic != topic || !bytes.Equal(rec.Key, key) || (rec.Key == nil) != (key == nil) || !bytes.Equal(rec.Value, value) || (rec.Value == nil) != (value == nil) {
			t.Fatalf("record(%q, % x, % x) = %q, % x, % x; want them unchanged", topic, key, value, rec.Topic, rec.Key, rec.Value)
		}
		name := p.header
		var want []kafka.Header
		for _, h := range hs {
			if h.Key != name {
				want = append(want, kafka.Header{Key: h.Key, Value: h.Value})
			}
		}
		got := rec.Headers
		if len(got) != len(want)+1 {
			t.Fatalf("record has %d headers; want %d", len(got), len(want)+1)
		}
		for i, h := range want {
			if got[i].Key != h.Key || !bytes.Equal(got[i].Value, h.Value) {
				t.Fatalf("header %d = %q=%q; want %q=%q", i, got[i].Key, got[i].Value, h.Key, h.Value)
			}
		}
		last := got[len(got)-1]
		if last.Key != name || string(last.Value) != m.MessageID.String() {
			t.Fatalf("last header = %q=%q; want %q=%q", last.Key, last.Value, name, m.MessageID)
		}
		if n := wire.RecordSize(&rec); n < len(key)+len(value)+len(last.Value) {
			t.Fatalf("recordSize = %d; want at least the payload %d", n, len(key)+len(value)+len(last.Value))
		}
	})
}
