package kafkapub_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// The classification of errors as the relay sees it, on the in-process
// broker (the unit tests of classify and classifyAuth are kafkapub's
// classify_test.go).

// TestKafkaPublisher_reports_unpublishable_rows: a row too large for the
// topic, a row above BatchBytes, a row naming a partition the topic does
// not have and a row without a topic fail with relay.ErrUnpublishable (and their
// original error), after the rows before them are acknowledged; two rows
// that fit the topic alone but not together are both acknowledged (the
// batch is split, nothing is unpublishable).
func TestKafkaPublisher_reports_unpublishable_rows(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 2, map[string]string{"max.message.bytes": "2048"})
	for _, tc := range []struct {
		name  string
		cfg   kafkapub.Config
		batch []*outbox.Message
		ack   int
		match error // nil: every row acknowledged
	}{
		{"too_large_for_the_topic", kafkapub.Config{}, []*outbox.Message{msg(topic, "k", "1", 0), msg(topic, "k", strings.Repeat("x", 8192), 0), msg(topic, "k", "3", 0)}, 1, kafka.MessageSizeTooLarge},
		{"above_batch_bytes", kafkapub.Config{BatchBytes: 1024}, []*outbox.Message{msg(topic, "k", "1", 1), msg(topic, "k", strings.Repeat("x", 1500), 1)}, 1, kafka.MessageSizeTooLarge},
		{"partition_the_topic_lacks", kafkapub.Config{}, []*outbox.Message{msg(topic, "k", "1", 1), msg(topic, "k", "2", 7)}, 1, kafka.UnknownTopicOrPartition},
		{"no_topic", kafkapub.Config{}, []*outbox.Message{msg(topic, "k", "1", 0), msg("", "k", "2")}, 1, nil},
		{"rows_too_large_only_together", kafkapub.Config{}, []*outbox.Message{msg(topic, "k", strings.Repeat("a", 1200), 0), msg(topic, "k", strings.Repeat("b", 1200), 0)}, 2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPublisher(t, b, tc.cfg)
			res := p.Publish(context.Background(), [][]*outbox.Message{tc.batch})[0]
			if res.Acknowledged != tc.ack {
				t.Fatalf("Publish = %d acknowledged, %v; want %d", res.Acknowledged, res.Err, tc.ack)
			}
			if tc.ack == len(tc.batch) {
				if res.Err != nil {
					t.Fatalf("Publish error = %v; want nil", res.Err)
				}
				return
			}
			if !errors.Is(res.Err, relay.ErrUnpublishable) {
				t.Fatalf("Publish error = %v; want it to wrap relay.ErrUnpublishable", res.Err)
			}
			if tc.match != nil && !errors.Is(res.Err, tc.match) {
				t.Fatalf("Publish error = %v; want it to match %v too", res.Err, tc.match)
			}
			if !strings.Contains(res.Err.Error(), tc.batch[tc.ack].MessageID.String()) {
				t.Fatalf("Publish error %q does not name the failing row", res.Err)
			}
		})
	}
}
