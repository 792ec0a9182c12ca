package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox/relay"
)

// TestKafkaErrorClassification: errors that will recur for the row as
// stored wrap relay.ErrUnpublishable and still match the original error; errors
// about a request's records wrap it only when the request held that row
// alone (a batch may be too large where each row is not); transient errors
// never wrap it.
func TestKafkaErrorClassification(t *testing.T) {
	timeout := fmt.Errorf("no answer from the broker within Config.PublishTimeout (10s): %w (%w)", context.DeadlineExceeded, kafka.MessageSizeTooLarge)
	for _, tc := range []struct {
		name  string
		err   error
		alone bool
		want  bool
	}{
		{"message_too_large_alone", kafka.MessageSizeTooLarge, true, true},
		{"message_too_large_in_a_batch", kafka.MessageSizeTooLarge, false, false},
		{"writer_message_too_large_alone", kafka.MessageTooLargeError{}, true, true},
		{"record_list_too_large_alone", kafka.RecordListTooLarge, true, true},
		{"record_list_too_large_in_a_batch", kafka.RecordListTooLarge, false, false},
		{"corrupt_message_alone", kafka.InvalidMessage, true, true},
		{"corrupt_message_in_a_batch", kafka.InvalidMessage, false, false},
		{"invalid_record_alone", fmt.Errorf("%w: key required for compacted topic", kafka.InvalidRecord), true, true},
		{"invalid_topic_in_a_batch", kafka.InvalidTopic, false, true},
		{"topic_authorization_failed_in_a_batch", fmt.Errorf("metadata: %w", kafka.TopicAuthorizationFailed), false, true},
		{"leader_not_available", kafka.LeaderNotAvailable, true, false},
		{"not_leader_for_partition", kafka.NotLeaderForPartition, true, false},
		{"request_timed_out", kafka.RequestTimedOut, true, false},
		{"not_enough_replicas", kafka.NotEnoughReplicas, true, false},
		{"not_enough_replicas_after_append", kafka.NotEnoughReplicasAfterAppend, true, false},
		{"unknown_topic_or_partition", kafka.UnknownTopicOrPartition, true, false},
		{"connection_refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true, false},
		{"connection_cut", io.ErrUnexpectedEOF, true, false},
		{"deadline", context.DeadlineExceeded, true, false},
		{"publish_timeout_over_a_size_error", timeout, true, false},
		{"cancelled", context.Canceled, true, false},
		{"already_classified", unpublishable(errors.New("x")), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := classify(tc.err, tc.alone)
			if is := errors.Is(got, relay.ErrUnpublishable); is != tc.want {
				t.Fatalf("classify(%v, alone=%v) matches relay.ErrUnpublishable = %v; want %v", tc.err, tc.alone, is, tc.want)
			}
			if !errors.Is(got, tc.err) && !errors.As(got, new(kafka.MessageTooLargeError)) {
				t.Fatalf("classify(%v) = %v; want it to match the original error", tc.err, got)
			}
			if got.Error() != tc.err.Error() {
				t.Fatalf("classify(%v) reads %q; want the original's text", tc.err, got.Error())
			}
		})
	}
	if classify(nil, true) != nil {
		t.Fatal("classify(nil) != nil")
	}
}

// TestKafkaAuthErrorClassification: the broker's SASL refusals wrap
// relay.ErrPublisherAuth (for the relay's Health) and still match and read as
// the original error; other errors do not wrap it.
func TestKafkaAuthErrorClassification(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"sasl_authentication_failed", fmt.Errorf("metadata: %w", kafka.SASLAuthenticationFailed), true},
		{"unsupported_sasl_mechanism", kafka.UnsupportedSASLMechanism, true},
		{"illegal_sasl_state", kafka.IllegalSASLState, true},
		{"topic_authorization_failed", kafka.TopicAuthorizationFailed, false},
		{"connection_refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{"deadline", context.DeadlineExceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := classifyAuth(tc.err)
			if is := errors.Is(got, relay.ErrPublisherAuth); is != tc.want {
				t.Fatalf("classifyAuth(%v) matches relay.ErrPublisherAuth = %v; want %v", tc.err, is, tc.want)
			}
			if !errors.Is(got, tc.err) || got.Error() != tc.err.Error() {
				t.Fatalf("classifyAuth(%v) = %v; want it to match and read as the original error", tc.err, got)
			}
		})
	}
	if classifyAuth(nil) != nil {
		t.Fatal("classifyAuth(nil) != nil")
	}
}
